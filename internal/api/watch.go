package api

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
)

// hub hands the status events of the status exchange to the requests
// that await or follow their orders. One exclusive queue per replica
// feeds it, bound to every status only while some request here follows
// an order (and for hubLinger after the last one left): with nobody
// following, the events are not routed here at all, so progress events
// nobody hears stop being written (statestore.HearStatusEvents). An
// event of an order nobody here follows is dropped unread. A follower
// registers, then waits until the queue is bound (ready), then reads the
// order from the store, so an event that comes between the two is never
// missed; one that could not be handed over (the follower's buffer full,
// or the queue lost and made again) marks the follower lost, and it reads
// the store again.
type hub struct {
	logger *slog.Logger
	// heard tells the store that every status is heard here, once the
	// queue is bound: progress events it had stopped writing for want of
	// a listener are written again (statestore.HearStatusEvents).
	heard func(context.Context) error
	// linger is how long the queue stays bound after the last follower
	// left (hubLinger).
	linger time.Duration

	mu        sync.Mutex
	followers map[string]map[*follower]struct{}
	count     int // followers, of every order
	// bound is closed once the queue is bound and heard; a new one is made
	// when the binding goes (unbound, or the queue lost).
	bound   chan struct{}
	isBound bool
	// want wakes the consuming loop: a first follower came, or the last
	// one left.
	want chan struct{}
}

// hubLinger is how long the status queue stays bound after its last
// follower: a client that awaits order after order binds once.
const hubLinger = 30 * time.Second

// errNotBound is why a follower gave up waiting for the binding.
var errNotBound = errors.New("status events cannot be followed now: the broker is unavailable")

// follower is one request following one order.
type follower struct {
	events chan messages.StatusEvent
	// lost is signalled when an event may have been missed: read the
	// store again.
	lost chan struct{}
}

func newHub(logger *slog.Logger, heard func(context.Context) error) *hub {
	return &hub{logger: logger, heard: heard, linger: hubLinger, followers: map[string]map[*follower]struct{}{},
		bound: make(chan struct{}), want: make(chan struct{}, 1)}
}

// poke wakes the consuming loop.
func (h *hub) poke() {
	select {
	case h.want <- struct{}{}:
	default:
	}
}

// follow registers a follower of orderID and returns it, stop (which
// unregisters it) and ready (closed once the queue is bound: the
// follower then reads the store).
func (h *hub) follow(orderID string) (f *follower, stop func(), ready <-chan struct{}) {
	f = &follower{events: make(chan messages.StatusEvent, 16), lost: make(chan struct{}, 1)}
	h.mu.Lock()
	set := h.followers[orderID]
	if set == nil {
		set = map[*follower]struct{}{}
		h.followers[orderID] = set
	}
	set[f] = struct{}{}
	h.count++
	ready = h.bound
	if !h.isBound {
		h.poke()
	}
	h.mu.Unlock()
	return f, func() {
		h.mu.Lock()
		if _, ok := set[f]; ok {
			delete(set, f)
			h.count--
		}
		if len(set) == 0 && h.followers[orderID] != nil && len(h.followers[orderID]) == 0 {
			delete(h.followers, orderID)
		}
		last := h.count == 0
		h.mu.Unlock()
		if last {
			h.poke()
		}
	}, ready
}

// await waits until ready is closed (the queue is bound), for at most
// timeout.
func await(ctx context.Context, ready <-chan struct{}, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errNotBound
	}
}

// setBound records the binding: closes bound when it is made, makes a
// new one when it goes.
func (h *hub) setBound(b bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b == h.isBound {
		return
	}
	h.isBound = b
	if b {
		close(h.bound)
	} else {
		h.bound = make(chan struct{})
	}
}

// followed is how many followers there are.
func (h *hub) followed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.count
}

func (f *follower) markLost() {
	select {
	case f.lost <- struct{}{}:
	default:
	}
}

// deliver hands an event body to its order's followers.
func (h *hub) deliver(body []byte) {
	h.mu.Lock()
	empty := len(h.followers) == 0
	h.mu.Unlock()
	if empty {
		return
	}
	ev, err := messages.DecodeStatusEvent(body)
	if err != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for f := range h.followers[ev.OrderID] {
		select {
		case f.events <- ev:
		default:
			f.markLost()
		}
	}
}

// allLost marks every follower lost: the queue was made again, and what
// came meanwhile was not seen.
func (h *hub) allLost() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.followers {
		for f := range set {
			f.markLost()
		}
	}
}

// run consumes the status exchange through a queue of its own until ctx
// ends, making it again after a broker failure; the queue is bound while
// there are followers.
func (h *hub) run(ctx context.Context, conn *broker.Conn) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := h.consume(ctx, conn)
		if ctx.Err() != nil {
			return
		}
		h.logger.Warn("status events: consuming again", "err", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (h *hub) consume(ctx context.Context, conn *broker.Conn) error {
	ch, err := conn.Channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	// Whatever came while the queue was lost was not seen.
	defer h.setBound(false)
	defer h.allLost()
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	h.allLost()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	exchange := conn.Topology().StatusExchange()
	bound := false
	var unbind <-chan time.Time // the linger after the last follower
	for {
		switch n := h.followed(); {
		case n > 0 && !bound:
			if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
				return err
			}
			if err := h.heard(ctx); err != nil {
				return err
			}
			bound = true
			h.setBound(true)
			unbind = nil
		case n > 0:
			unbind = nil
		case bound && unbind == nil:
			unbind = time.After(h.linger)
		}
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			if e == nil {
				return errChannelClosed
			}
			return e
		case d, ok := <-deliveries:
			if !ok {
				return errChannelClosed
			}
			h.deliver(d.Body)
		case <-h.want:
		case <-unbind:
			unbind = nil
			// Unbound first in the hub's eyes, so that a follower who
			// comes now waits for the binding made again.
			h.mu.Lock()
			idle := h.count == 0
			if idle {
				h.isBound = false
				h.bound = make(chan struct{})
			}
			h.mu.Unlock()
			if idle {
				if err := ch.QueueUnbind(q.Name, "#", exchange, nil); err != nil {
					return err
				}
				bound = false
			}
		}
	}
}
