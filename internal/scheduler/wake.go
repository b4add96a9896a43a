package scheduler

import (
	"context"
	"log/slog"
	"time"

	"sas/internal/statestore"
)

// waker listens for the state store's notifications on a connection of its
// own and nudges the claimer (pending) and the relay (outbox). After losing
// and regaining the connection it nudges both, since notifications sent
// meanwhile are gone.
type waker struct {
	store   *statestore.Store
	logger  *slog.Logger
	pending chan struct{}
	outbox  chan struct{}
}

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a nudge is already waiting
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
	l, err := w.store.Listen(ctx, statestore.ChannelPending, statestore.ChannelOutbox)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	schema, err := l.Schema(ctx)
	if err != nil {
		return err
	}
	// Whatever was notified while not listening is found by a full look.
	nudge(w.pending)
	nudge(w.outbox)
	for {
		channel, err := l.Wait(ctx, schema)
		if err != nil {
			return err
		}
		switch channel {
		case statestore.ChannelPending:
			nudge(w.pending)
		case statestore.ChannelOutbox:
			nudge(w.outbox)
		}
	}
}
