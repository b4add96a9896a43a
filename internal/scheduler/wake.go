package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sas/internal/statestore"
)

// waker listens for the state store's notifications on a connection of its
// own and nudges the claimer (pending) and the relay (outbox). After losing
// and regaining the connection it nudges both, since notifications sent
// meanwhile are gone.
//
// Of the schedulers that claim the same agent kinds, one listens for new
// work (ChannelPending, ChannelOutbox): the one holding their listener
// lease. A new order then wakes one scheduler, not all of them with all
// but one claiming nothing. The others listen on ChannelMore only, which
// the listening one notifies when a claim took a whole batch (more is
// waiting than it takes at once), and otherwise find work by polling, by
// their own replies and claims, and, if the listening one stops renewing
// its lease (it crashed or hangs), by taking the lease over once it runs
// out: within listenerLeaseTTL and one listenerRenew.
type waker struct {
	store   *statestore.Store
	logger  *slog.Logger
	pending chan struct{}
	outbox  chan struct{}
	me      string
	lease   string // statestore.SchedulerListenerLease of this scheduler's kinds

	listening atomic.Bool      // this scheduler holds the lease and listens for new work
	gauge     prometheus.Gauge // sas_scheduler_listening
}

// listenerLeaseTTL is how long the listener lease lasts unrenewed: how long
// new work may go unnoticed but by polling after the listening scheduler
// hangs. It is renewed every listenerRenew.
const (
	listenerLeaseTTL = 3 * time.Second
	listenerRenew    = time.Second
)

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a nudge is already waiting
	}
}

// shareMore tells the other schedulers that more work is waiting than this
// one just claimed, if this one is the one that listens for new work (the
// others heard of it themselves).
func (w *waker) shareMore(ctx context.Context) {
	if !w.listening.Load() {
		return
	}
	if err := w.store.NotifyMore(ctx); err != nil && ctx.Err() == nil {
		w.logger.Warn("could not wake the other schedulers", "err", err)
	}
}

func (w *waker) run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := w.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		w.logger.Warn("notification listener lost, relying on polling until it is back", "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, 5*time.Second)
	}
	return nil
}

func (w *waker) listen(ctx context.Context) error {
	l, err := w.store.Listen(ctx, statestore.ChannelMore)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	defer w.stopListening(ctx)
	schema, err := l.Schema(ctx)
	if err != nil {
		return err
	}
	// Whatever was notified while not listening is found by a full look.
	nudge(w.pending)
	nudge(w.outbox)
	var renew time.Time
	for {
		if !time.Now().Before(renew) {
			if err := w.contend(ctx, l); err != nil {
				return err
			}
			renew = time.Now().Add(listenerRenew)
		}
		wait, cancel := context.WithDeadline(ctx, renew)
		channel, err := l.Wait(wait, schema)
		cancel()
		if err != nil {
			if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				continue // time to renew the lease
			}
			return err
		}
		switch channel {
		case statestore.ChannelPending, statestore.ChannelMore:
			nudge(w.pending)
		case statestore.ChannelOutbox:
			nudge(w.outbox)
		}
	}
}

// contend takes or renews the listener lease and listens for new work
// while it holds it.
func (w *waker) contend(ctx context.Context, l *statestore.Listener) error {
	lease, err := w.store.AcquireListenerLease(ctx, w.lease, w.me, listenerLeaseTTL)
	if err != nil {
		return err
	}
	if lease.Held == w.listening.Load() {
		return nil
	}
	if lease.Held {
		if err := l.Add(ctx, statestore.ChannelPending, statestore.ChannelOutbox); err != nil {
			return err
		}
		w.setListening(true)
		w.logger.Info("listening for new work", "lease", w.lease, "epoch", lease.Epoch)
		// What was notified before this one listened is found by a look.
		nudge(w.pending)
		nudge(w.outbox)
		return nil
	}
	w.setListening(false)
	w.logger.Info("another scheduler listens for new work", "lease", w.lease, "holder", lease.Holder)
	return l.Remove(ctx, statestore.ChannelPending, statestore.ChannelOutbox)
}

func (w *waker) setListening(on bool) {
	w.listening.Store(on)
	if on {
		w.gauge.Set(1)
	} else {
		w.gauge.Set(0)
	}
}

// stopListening gives the lease up, if held, when the listener connection
// is gone or the scheduler stops: another scheduler takes over at its next
// renewal rather than after the lease runs out.
func (w *waker) stopListening(ctx context.Context) {
	if !w.listening.Load() {
		return
	}
	w.setListening(false)
	release, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := w.store.ReleaseListenerLease(release, w.lease, w.me); err != nil {
		w.logger.Warn("could not give the listener lease up", "err", err)
	}
}
