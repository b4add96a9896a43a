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
// that await or follow their orders, and its step events to those that
// follow their orders' steps. One exclusive queue per replica feeds it,
// bound to every status (routing key *) only while some request here
// follows an order, and to every step event (step.#) only while some
// request follows its steps (each for linger after the last one left):
// with nobody following, nothing is routed here, so progress events and
// step events nobody hears stop being written (statestore.HearStatusEvents,
// HearStepEvents). An event of an order nobody here follows is dropped
// unread. A follower registers, then waits until what it needs is bound
// (ready), then reads the order from the store, so an event that comes
// between the two is never missed; one that could not be handed over (the
// follower's buffer full, or the queue lost and made again) marks the
// follower lost, and it reads the store again.
type hub struct {
	logger *slog.Logger
	// exchange is the status exchange followed: its partition's.
	exchange string
	// linger is how long a binding stays after the last follower who
	// needed it left (hubLinger).
	linger time.Duration

	mu        sync.Mutex
	followers map[string]map[*follower]struct{}
	// statuses and steps are the queue's two bindings: * for every
	// status event, step.# for every step event.
	statuses, steps *binding
	// want wakes the consuming loop: a follower came, or one left.
	want chan struct{}
}

// binding is one binding of the hub's queue to the status exchange, made
// while followers need it.
type binding struct {
	key string
	// heard tells the store, once the binding is made, that the events
	// it routes are heard: those it had stopped writing for want of a
	// listener are written again.
	heard func(context.Context) error
	count int // followers that need it
	// ready is closed once it is bound and heard; a new one is made when
	// it goes (unbound, or the queue lost).
	ready   chan struct{}
	isBound bool
}

// hubLinger is how long the status queue stays bound after its last
// follower: a client that awaits order after order binds once.
const hubLinger = 30 * time.Second

// errNotBound is why a follower gave up waiting for the binding.
var errNotBound = errors.New("status events cannot be followed now: the broker is unavailable")

// follower is one request following one order.
type follower struct {
	events chan messages.StatusEvent
	// steps gets the order's step events, for a follower of its steps
	// (nil for others).
	steps chan messages.StepEvent
	// lost is signalled when an event may have been missed: read the
	// store again.
	lost chan struct{}
}

func newHub(logger *slog.Logger, exchange string, heardStatuses, heardSteps func(context.Context) error) *hub {
	return &hub{logger: logger, exchange: exchange, linger: hubLinger, followers: map[string]map[*follower]struct{}{},
		statuses: &binding{key: "*", heard: heardStatuses, ready: make(chan struct{})},
		steps:    &binding{key: "step.#", heard: heardSteps, ready: make(chan struct{})},
		want:     make(chan struct{}, 1)}
}

// poke wakes the consuming loop.
func (h *hub) poke() {
	select {
	case h.want <- struct{}{}:
	default:
	}
}

// need counts a follower in or out of b; it wakes the loop when that
// changes what must be bound (the first came while unbound, the last
// left). Called with h.mu held.
func (h *hub) need(b *binding, delta int) {
	b.count += delta
	if delta > 0 && !b.isBound || delta < 0 && b.count == 0 {
		h.poke()
	}
}

// follow registers a follower of orderID (and of its steps, when steps)
// and returns it, stop (which unregisters it) and ready (closed once what
// it needs is bound: the follower then reads the store).
func (h *hub) follow(orderID string, steps bool) (f *follower, stop func(), ready []<-chan struct{}) {
	f = &follower{events: make(chan messages.StatusEvent, 16), lost: make(chan struct{}, 1)}
	if steps {
		f.steps = make(chan messages.StepEvent, 64)
	}
	h.mu.Lock()
	set := h.followers[orderID]
	if set == nil {
		set = map[*follower]struct{}{}
		h.followers[orderID] = set
	}
	set[f] = struct{}{}
	h.need(h.statuses, 1)
	ready = append(ready, h.statuses.ready)
	if steps {
		h.need(h.steps, 1)
		ready = append(ready, h.steps.ready)
	}
	h.mu.Unlock()
	return f, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := set[f]; !ok {
			return
		}
		delete(set, f)
		if len(set) == 0 && h.followers[orderID] != nil && len(h.followers[orderID]) == 0 {
			delete(h.followers, orderID)
		}
		h.need(h.statuses, -1)
		if steps {
			h.need(h.steps, -1)
		}
	}, ready
}

// await waits until every one of ready is closed (what a follower needs
// is bound), for at most timeout.
func await(ctx context.Context, ready []<-chan struct{}, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for _, r := range ready {
		select {
		case <-r:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return errNotBound
		}
	}
	return nil
}

// setBound records b's binding: closes ready when it is made, makes a new
// one when it goes.
func (h *hub) setBound(b *binding, bound bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if bound == b.isBound {
		return
	}
	b.isBound = bound
	if bound {
		close(b.ready)
	} else {
		b.ready = make(chan struct{})
	}
}

// needed is how many followers need b.
func (h *hub) needed(b *binding) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return b.count
}

func (f *follower) markLost() {
	select {
	case f.lost <- struct{}{}:
	default:
	}
}

// deliver hands an event to its order's followers: a status event to
// each, a step event to each that follows its steps.
func (h *hub) deliver(d amqp.Delivery) {
	h.mu.Lock()
	empty := len(h.followers) == 0
	h.mu.Unlock()
	if empty {
		return
	}
	if d.Type == messages.TypeStepEvent {
		ev, err := messages.DecodeStepEvent(d.Body)
		if err != nil {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		for f := range h.followers[ev.OrderID] {
			if f.steps == nil {
				continue
			}
			select {
			case f.steps <- ev:
			default:
				f.markLost()
			}
		}
		return
	}
	ev, err := messages.DecodeStatusEvent(d.Body)
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
	defer h.setBound(h.steps, false)
	defer h.setBound(h.statuses, false)
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
	exchange := h.exchange
	bindings := []*binding{h.statuses, h.steps}
	bound := make([]bool, len(bindings))
	unbind := make([]<-chan time.Time, len(bindings)) // the linger after the last follower
	for {
		for i, b := range bindings {
			switch n := h.needed(b); {
			case n > 0 && !bound[i]:
				if err := ch.QueueBind(q.Name, b.key, exchange, false, nil); err != nil {
					return err
				}
				if err := b.heard(ctx); err != nil {
					return err
				}
				bound[i] = true
				h.setBound(b, true)
				unbind[i] = nil
			case n > 0:
				unbind[i] = nil
			case bound[i] && unbind[i] == nil:
				unbind[i] = time.After(h.linger)
			}
		}
		gone := -1
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
			h.deliver(d)
		case <-h.want:
		case <-unbind[0]:
			gone = 0
		case <-unbind[1]:
			gone = 1
		}
		if gone < 0 {
			continue
		}
		unbind[gone] = nil
		// Unbound first in the hub's eyes, so that a follower who comes
		// now waits for the binding made again.
		b := bindings[gone]
		h.mu.Lock()
		idle := b.count == 0
		if idle {
			b.isBound = false
			b.ready = make(chan struct{})
		}
		h.mu.Unlock()
		if idle {
			if err := ch.QueueUnbind(q.Name, b.key, exchange, nil); err != nil {
				return err
			}
			bound[gone] = false
		}
	}
}
