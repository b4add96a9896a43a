package api

import (
	"context"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
)

// hub hands the status events of the status exchange to the requests
// that await or follow their orders. One exclusive queue per replica,
// bound to every status, feeds it; an event of an order nobody here
// follows is dropped unread. A follower registers before it reads the
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

	mu        sync.Mutex
	followers map[string]map[*follower]struct{}
}

// follower is one request following one order.
type follower struct {
	events chan messages.StatusEvent
	// lost is signalled when an event may have been missed: read the
	// store again.
	lost chan struct{}
}

func newHub(logger *slog.Logger, heard func(context.Context) error) *hub {
	return &hub{logger: logger, heard: heard, followers: map[string]map[*follower]struct{}{}}
}

// follow registers a follower of orderID; stop unregisters it.
func (h *hub) follow(orderID string) (*follower, func()) {
	f := &follower{events: make(chan messages.StatusEvent, 16), lost: make(chan struct{}, 1)}
	h.mu.Lock()
	set := h.followers[orderID]
	if set == nil {
		set = map[*follower]struct{}{}
		h.followers[orderID] = set
	}
	set[f] = struct{}{}
	h.mu.Unlock()
	return f, func() {
		h.mu.Lock()
		delete(set, f)
		if len(set) == 0 && h.followers[orderID] != nil && len(h.followers[orderID]) == 0 {
			delete(h.followers, orderID)
		}
		h.mu.Unlock()
	}
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
// ends, making it again after a broker failure.
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
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return err
	}
	if err := ch.QueueBind(q.Name, "#", conn.Topology().StatusExchange(), false, nil); err != nil {
		return err
	}
	if err := h.heard(ctx); err != nil {
		return err
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return err
	}
	h.allLost()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	for {
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
		}
	}
}
