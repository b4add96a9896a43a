package scheduler

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/failpoint"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/tracing"
)

// claimer claims pending steps in batches and sends each its StepRequest.
//
// It claims for an agent kind only while that kind's request queue holds
// fewer than maxQueued ready requests, and never more than the room left:
// steps claimed faster than agents take them would wait in the queue until
// their complete_by passed, and every such expiry would count as a failure
// of the step. Left pending, they keep their budget until an agent is free.
//
// For the same reason it claims nothing while the shared replies queue
// holds maxReplies or more: when the schedulers apply replies more slowly
// than agents make them, every step claimed then would wait there, past
// its complete_by, and be done again. Only claims by the claimer stop: a
// next step claimed with its reply replaces the step that reply ended.
type claimer struct {
	store  *statestore.Store
	pub    *broker.Publisher
	depths depthReader
	topo   broker.Topology
	kinds  []string
	// system: the workflows have steps sas performs itself (waits,
	// timers alone, agent ""): claimed too, and answered for here.
	system     bool
	me         string
	batch      int
	maxQueued  int
	maxReplies int // the replies queue's limit (0: none)
	poll       time.Duration
	wake       <-chan struct{}
	wakeRelay  func()                // a claim may have written status events
	wakeSelf   func()                // a step of a graph answered here made others pending
	graph      *graphSteps           // answers for claimed steps of graphs (when, for_each, input)
	shareMore  func(context.Context) // a claim took a whole batch: wake the other schedulers (waker.shareMore)
	workCtx    context.Context       // claimed steps are sent even during shutdown
	logger     *slog.Logger
	metrics    *metrics
	tr         *tracing.Tracing
	tokens     steptoken.Key // mints each request's step token
	// transient: requests go transient (SAS_STEP_MESSAGES), and the
	// steps sent are put back to pending when the broker connection
	// comes back (resender).
	transient bool

	mu    sync.Mutex            // guards known and managed: the replier reads them too
	known map[string]queueDepth // the last reading of each kind's queue, and of the replies queue (repliesKey)

	// managed are the kinds whose keyed steps are claimed through their
	// limits (statestore.ClaimLimited), true for those whose own limits
	// hold every step of them (else only keys do: a concurrency_key, a
	// namespace's limits; their unkeyed steps are claimed as an
	// unlimited kind's). keyed are those the workflows file keys,
	// managed from the start; the store's are read every managedTTL.
	managed   map[string]bool
	managedAt time.Time
	keyed     []string

	// heldUntil is, by kind, when a rate that held its last limited
	// claim has a token again: no limited claim of it is tried before
	// (a wake-up by other work would find it held again). The claimer's
	// goroutine alone uses it.
	heldUntil map[string]time.Time
}

// managedTTL is how long the list of limited kinds read from the store is
// used: a limit set on a kind that had none holds from at most this
// later (a change to a limited kind's limits holds at its next claim).
const managedTTL = time.Second

// repliesKey is the replies queue's entry in claimer.known: no agent kind
// is named "" (workflow definitions are checked).
const repliesKey = ""

// depthReader reads a queue's ready messages (a *broker.QueueInspector).
type depthReader interface {
	Ready(ctx context.Context, queue string) (int, error)
}

// queueDepth is a reading of a request queue's ready messages and the
// requests this claimer sent to it since.
type queueDepth struct {
	ready, sent int
	at          time.Time
}

// depthTTL is how long a reading of a request queue's depth is used, the
// requests sent since counted as still waiting (as if no agent took any):
// a passive declare of a quorum queue costs RabbitMQ about 140 µs of CPU,
// more than a message, and a claimer at moderate load claims a few steps
// at a time, reading every kind's queue for each claim.
const depthTTL = 50 * time.Millisecond

// depthTrust is how long a reading is used while the queue was far from
// its limit (a quarter of it or less, what was sent since included): there
// the exact depth changes nothing, since the room is a batch either way.
// At low load the queues are empty, and reading each every depthTTL cost
// every scheduler 20 passive declares a second per queue, each more CPU in
// RabbitMQ than an order's messages. Every scheduler counts its own sends,
// so a longer trust cannot let one fill a queue past its limit; the others'
// sends show at the next reading, at most depthTrust later.
const depthTrust = time.Second

// throttledRecheck is how soon a claimer whose queues were full looks
// again: agents drain a queue without notifying anyone.
const throttledRecheck = 50 * time.Millisecond

// claimerIdleLongest is how many poll intervals a claimer whose looks
// keep finding nothing waits at most between them: its wait doubles from
// one interval at each look that claimed nothing, and is one again as
// soon as it is woken or claims. New work notifies a claimer (sas_pending,
// a nudge from the scheduler's own replies); the poll only bounds how
// late a step whose notification was lost, or whose order row another
// transaction held, is claimed, and never waits past the moment the
// earliest pending step becomes available (a reset step's backoff). At
// rest a claimer then looks every few seconds, not twice a second, with
// each look's queue depth reads and claim.
const claimerIdleLongest = 8

// idleWait is a claimer's wait between looks when nothing wakes it.
type idleWait struct {
	poll, cur time.Duration
}

func (w *idleWait) reset() { w.cur = w.poll }
func (w *idleWait) grow()  { w.cur = min(2*w.cur, claimerIdleLongest*w.poll) }

// next is the wait before the next look, given how soon the earliest
// pending step becomes available (ok false: none is pending). A step
// available now that the last look did not claim (its order row was
// held) is looked at again after one interval, as it always was.
func (w *idleWait) next(pending time.Duration, ok bool) time.Duration {
	switch {
	case !ok || w.cur <= w.poll:
		return w.cur
	case pending <= 0:
		return w.poll
	default:
		return max(min(w.cur, pending), minLimitRecheck)
	}
}

func (c *claimer) run(ctx context.Context) error {
	wait := idleWait{poll: c.poll}
	wait.reset()
	poll := time.NewTimer(c.poll)
	defer poll.Stop()
	for {
		soon, claimed := c.drain(ctx)
		var recheck <-chan time.Time
		if soon > 0 {
			recheck = time.After(soon)
		}
		if claimed {
			wait.reset()
		}
		d := wait.cur
		if d > c.poll {
			pending, ok, err := c.store.NextPending(ctx)
			if d = wait.next(pending, ok); err != nil {
				d = c.poll
			}
		}
		poll.Reset(d)
		select {
		case <-ctx.Done():
			return nil
		case <-c.wake:
			c.metrics.wakeups.WithLabelValues("claimer", "notify").Inc()
			wait.reset()
		case <-poll.C:
			c.metrics.wakeups.WithLabelValues("claimer", "poll").Inc()
			wait.grow()
		case <-recheck:
			c.metrics.wakeups.WithLabelValues("claimer", "throttled").Inc()
		}
	}
}

// drain claims and dispatches, every kind with room in one claim (each
// limited kind in one of its own), until no kind has both room and
// pending steps. It returns how soon to look again when a full queue or
// a limit held a kind back (0: at the next wake-up), and whether it
// claimed anything.
func (c *claimer) drain(ctx context.Context) (soon time.Duration, claimed bool) {
	shared := false
	throttled := false
	defer func() {
		if throttled && (soon == 0 || soon > throttledRecheck) {
			soon = throttledRecheck
		}
	}()
	for ctx.Err() == nil {
		if c.repliesFull(ctx) {
			throttled = true
			return soon, claimed
		}
		rooms := make(map[string]int, len(c.kinds))
		limited := map[string]int{}
		for _, kind := range c.kinds {
			queue := c.topo.Queue(messages.RequestsQueue(kind))
			ready, err := c.ready(ctx, kind, queue, c.maxQueued)
			if err != nil {
				if ctx.Err() == nil {
					c.logger.Warn("cannot read queue depth; not claiming for it now", "queue", queue, "err", err)
				}
				throttled = true
				continue
			}
			room := min(c.batch, c.maxQueued-ready)
			if room <= 0 {
				c.metrics.throttled.WithLabelValues(kind).Inc()
				throttled = true
				continue
			}
			rooms[kind] = room
		}
		if len(rooms) > 0 {
			managed := c.managedKinds(ctx)
			for kind, room := range rooms {
				own, ok := managed[kind]
				if !ok {
					continue
				}
				limited[kind] = room
				if own {
					delete(rooms, kind) // every step of it under its limits
				}
			}
		}
		if c.system {
			rooms[""] = c.batch // no queue: prepare answers for them
		}
		more := false
		// The regular claim first: it takes the unkeyed steps of kinds
		// managed by keys alone too, which nothing bounds.
		var took map[string]int
		if len(rooms) > 0 {
			n, byKind, full, ok := c.claimKinds(ctx, rooms)
			claimed = claimed || n > 0
			if !ok {
				return soon, claimed
			}
			more = more || full
			took = byKind
		}
		now := time.Now()
		for kind, room := range limited {
			if room -= took[kind]; room <= 0 {
				continue // the regular claim took its room: more comes round
			}
			if until, held := c.heldUntil[kind]; held && now.Before(until) {
				if wait := until.Sub(now); soon == 0 || wait < soon {
					soon = wait
				}
				continue
			}
			n, full, wait, rateHeld := c.claimLimited(ctx, kind, room)
			claimed = claimed || n > 0
			more = more || full
			if wait > 0 && (soon == 0 || wait < soon) {
				soon = wait
			}
			if rateHeld {
				c.heldUntil[kind] = now.Add(wait)
			} else {
				delete(c.heldUntil, kind)
			}
		}
		if !more {
			return soon, claimed
		}
		if !shared && c.shareMore != nil {
			shared = true
			c.shareMore(ctx)
		}
	}
	return soon, claimed
}

// claimKinds claims, in one statement, up to rooms[kind] steps of each
// kind and sends their requests. It reports how many it claimed, and of
// each kind, whether a kind took its whole room (more may wait), and
// false when the claim failed.
func (c *claimer) claimKinds(ctx context.Context, rooms map[string]int) (n int, byKind map[string]int, full, ok bool) {
	start := time.Now()
	steps, err := c.store.ClaimKinds(ctx, c.me, rooms)
	c.metrics.claimDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("claim failed", "err", err)
		}
		return 0, nil, false, false
	}
	if len(steps) == 0 {
		return 0, nil, false, true
	}
	c.metrics.claimed.Add(float64(len(steps)))
	c.metrics.claimSize.Observe(float64(len(steps)))
	for _, st := range steps {
		c.countSent(st.Agent)
	}
	c.wakeRelayIfTold(steps)
	failpoint.Inject("scheduler-after-claim")
	c.dispatch(steps, start)
	claimed := make(map[string]int, len(rooms))
	for _, st := range steps {
		claimed[st.Agent]++
	}
	for kind, room := range rooms {
		if claimed[kind] == room {
			full = true // that kind may have more waiting
		}
	}
	return len(steps), claimed, full, true
}

// claimLimited claims up to room steps of a limited kind and sends their
// requests. It reports how many it claimed, whether it took the whole
// room (more may wait),
// and, when a limit cut the claim, how soon to look again: when the next
// token comes for a rate, throttledRecheck for max_in_flight (a step of
// the kind ending anywhere makes room); rateHeld when no claim of the kind
// can take more before then (its rate held it, or a namespace's rate did
// and nothing else was there to claim).
func (c *claimer) claimLimited(ctx context.Context, kind string, room int) (n int, full bool, soon time.Duration, rateHeld bool) {
	start := time.Now()
	lc, err := c.store.ClaimLimited(ctx, c.me, kind, room)
	c.metrics.claimDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("claim failed", "kind", kind, "err", err)
		}
		return 0, false, throttledRecheck, false
	}
	switch lc.Held {
	case statestore.HeldRate:
		c.metrics.limitHeld.WithLabelValues(kind, lc.Held).Inc()
		soon = min(max(lc.Retry, minLimitRecheck), throttledRecheck)
		rateHeld = true
	case statestore.HeldInFlight:
		c.metrics.limitHeld.WithLabelValues(kind, lc.Held).Inc()
		soon = throttledRecheck
	case statestore.HeldNamespace:
		// A namespace at its own limit: the others' steps were claimed,
		// every one there was unless the room ran out. Held by its rate
		// with room left, the kind is not tried again until that
		// namespace's next token (a wake-up by other work meanwhile would
		// find its steps alone; the unkeyed are the regular claim's).
		c.metrics.limitHeld.WithLabelValues(kind, lc.Held).Inc()
		soon = throttledRecheck
		if lc.Retry > 0 {
			soon = min(max(lc.Retry, minLimitRecheck), namespaceRecheck)
			rateHeld = len(lc.Steps) < room
		}
	}
	if len(lc.Steps) == 0 {
		return 0, false, soon, rateHeld
	}
	c.metrics.claimed.Add(float64(len(lc.Steps)))
	c.metrics.claimSize.Observe(float64(len(lc.Steps)))
	for _, st := range lc.Steps {
		c.countSent(st.Agent)
		c.metrics.limitWait.WithLabelValues(kind).Observe(st.Waited.Seconds())
	}
	c.wakeRelayIfTold(lc.Steps)
	failpoint.Inject("scheduler-after-claim")
	c.dispatch(lc.Steps, start)
	return len(lc.Steps), len(lc.Steps) == room && lc.Held == "", soon, rateHeld
}

// namespaceRecheck bounds how long a kind whose namespace's rate held its
// claim waits for that namespace's next token before it is tried again.
const namespaceRecheck = time.Second

// wakeRelayIfTold nudges the relay when a claim wrote status events: a
// round that finds the outbox empty is a transaction for nothing.
func (c *claimer) wakeRelayIfTold(steps []statestore.ClaimedStep) {
	if slices.ContainsFunc(steps, func(s statestore.ClaimedStep) bool { return s.Told }) {
		c.wakeRelay()
	}
}

// minLimitRecheck is the soonest a claimer held back by a rate looks
// again, however soon its next token comes.
const minLimitRecheck = 2 * time.Millisecond

// managedKinds returns the kinds whose keyed steps are claimed through
// their limits, true for those whose every step is: the file's keyed
// kinds and the store's limited or keyed ones, read at most every
// managedTTL (on an error, the last reading stands).
func (c *claimer) managedKinds(ctx context.Context) map[string]bool {
	c.mu.Lock()
	fresh := c.managed != nil && time.Since(c.managedAt) < managedTTL
	cur := c.managed
	c.mu.Unlock()
	if fresh {
		return cur
	}
	kinds, err := c.store.ManagedKinds(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("cannot read which kinds are limited; using the last reading", "err", err)
		}
		if cur == nil {
			cur = map[string]bool{}
			for _, k := range c.keyed {
				cur[k] = false
			}
		}
		return cur
	}
	next := make(map[string]bool, len(kinds)+len(c.keyed))
	for _, k := range c.keyed {
		next[k] = false
	}
	for k, own := range kinds {
		next[k] = own
	}
	c.mu.Lock()
	c.managed, c.managedAt = next, time.Now()
	c.mu.Unlock()
	return next
}

// repliesFull reports whether the replies queue holds maxReplies or more,
// or cannot be read.
func (c *claimer) repliesFull(ctx context.Context) bool {
	if c.maxReplies <= 0 {
		return false
	}
	queue := c.topo.Queue(messages.RepliesQueue)
	waiting, err := c.ready(ctx, repliesKey, queue, c.maxReplies)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Warn("cannot read queue depth; not claiming now", "queue", queue, "err", err)
		}
		return true
	}
	if waiting >= c.maxReplies {
		c.metrics.repliesFull.Inc()
		return true
	}
	return false
}

// ready is how many requests wait in kind's queue, whose limit is limit:
// read from the broker at most every depthTTL (depthTrust while far below
// the limit), and in between the last reading plus what was sent since.
func (c *claimer) ready(ctx context.Context, kind, queue string, limit int) (int, error) {
	c.mu.Lock()
	d, ok := c.known[kind]
	c.mu.Unlock()
	if ok && d.fresh(limit) {
		return d.ready + d.sent, nil
	}
	ready, err := c.depths.Ready(ctx, queue)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.known, kind)
		return 0, err
	}
	c.known[kind] = queueDepth{ready: ready, at: time.Now()}
	if kind != repliesKey {
		c.metrics.queueReady.WithLabelValues(kind).Set(float64(ready))
	}
	return ready, nil
}

// fresh reports whether a reading may stand for the queue's depth now.
func (d queueDepth) fresh(limit int) bool {
	age := time.Since(d.at)
	return age < depthTTL || (age < depthTrust && 4*(d.ready+d.sent) <= limit)
}

// countSent counts a request sent to kind's queue since its last reading.
func (c *claimer) countSent(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, ok := c.known[kind]; ok {
		d.sent++
		c.known[kind] = d
	}
}

// handOffTTL is how old a reading of a queue may be for the replier to
// claim next steps of its kind: older than depthTTL is fine, since every
// request sent since counts as still waiting.
const handOffTTL = time.Second

// openKinds lists the agent kinds, not limited, whose queues have room
// for at least margin more requests by their last reading (no older than
// handOffTTL):
// the kinds whose next steps the replier may claim along with the replies
// before them (statestore.ApplyRepliesClaiming). A kind without a recent
// reading is left to the claimer, which reads it.
func (c *claimer) openKinds(margin int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var open []string
	for _, kind := range c.kinds {
		if c.managed[kind] {
			continue // every step of it claimed under its limits
		}
		if d, ok := c.known[kind]; ok && time.Since(d.at) < handOffTTL && c.maxQueued-(d.ready+d.sent) >= margin {
			open = append(open, kind)
		}
	}
	return open
}

// dispatch sends every claimed step's request, all in flight at once, and
// hands back to pending those the broker did not confirm. A step sent
// nothing (skipped, expanded, a wait, a child, failed here) is answered
// for once the batch's requests have left, so that no store round trip
// holds them back. claimedAt is when the claim began, for the claim's
// span.
func (c *claimer) dispatch(steps []statestore.ClaimedStep, claimedAt time.Time) {
	ctx := c.workCtx
	pending := make([]*broker.Pending, len(steps))
	errs := make([]error, len(steps))
	spans := make([]trace.Span, len(steps))
	answers := make([]answer, len(steps))
	for i, s := range steps {
		sctx, span := traceClaim(ctx, c.tr, s, claimedAt)
		spans[i] = span
		input, ans := c.graph.plan(sctx, &s)
		if ans != nil {
			answers[i] = ans
			continue
		}
		msg, err := request(s, input, c.tokens.Mint(steptoken.Ref{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt}))
		if err != nil {
			// No agent could read it (the results of the steps before
			// add up to more than a message holds): the step fails for
			// good with the reason, now, rather than running out its
			// time in a dead-letter queue.
			c.logger.Error("cannot build step request; failing the step", append([]any{"order_id", s.OrderID, "step", s.Step, "err", err}, tracing.LogAttrs(sctx)...)...)
			span.SetStatus(codes.Error, err.Error())
			span.End()
			c.failUnsendable(s, err)
			continue
		}
		msg.Headers = c.tr.InjectAMQP(sctx, msg.Headers)
		if c.transient {
			msg.DeliveryMode = amqp.Transient
		}
		pending[i], errs[i] = c.pub.Start(ctx, "", c.topo.Queue(messages.RequestsQueue(s.Agent)), msg)
	}
	for i, ans := range answers {
		if ans == nil {
			continue
		}
		// Skipped, expanded or failed here (or, if the store could not
		// be told, left to run out its claim).
		if _, _, err := ans(); err != nil {
			c.logger.Warn("could not answer for a step of a graph; the supervisor will retry it",
				append([]any{"order_id", steps[i].OrderID, "step", steps[i].Step, "err", err},
					tracing.LogAttrs(trace.ContextWithSpan(ctx, spans[i]))...)...)
			spans[i].SetStatus(codes.Error, err.Error())
		}
		spans[i].End()
		c.wakeSelf()
		c.wakeRelay()
	}
	for i, s := range steps {
		if pending[i] != nil {
			errs[i] = pending[i].Wait(ctx)
		}
		if pending[i] == nil && errs[i] == nil {
			continue // could not be built; logged above
		}
		if errs[i] == nil {
			spans[i].End()
			c.metrics.published.Inc()
			continue
		}
		spans[i].SetStatus(codes.Error, errs[i].Error())
		spans[i].End()
		c.metrics.publishFailed.Inc()
		released, err := c.store.ReleaseClaim(ctx, s.OrderID, s.Step, s.Attempt, c.me, "request not sent: "+errs[i].Error())
		log := c.logger.With(append([]any{"order_id", s.OrderID, "step", s.Step, "attempt", s.Attempt},
			tracing.LogAttrs(trace.ContextWithSpan(ctx, spans[i]))...)...)
		switch {
		case err != nil:
			log.Warn("request not sent and claim not released; the supervisor will find it", "send_err", errs[i], "err", err)
		case released:
			c.metrics.released.Inc()
			log.Warn("request not sent; claim released", "err", errs[i])
		}
	}
}

// failUnsendable fails, for good, a claimed step whose request cannot be
// made, through the same fenced path as an agent's failed reply.
func (c *claimer) failUnsendable(s statestore.ClaimedStep, why error) {
	reason := messages.BoundText("sas could not send the step's request: "+why.Error(), messages.MaxReasonBytes)
	// No request left: the step's compensation does not run for it.
	_, err := c.store.FailUnsent(c.workCtx, s, c.me, reason)
	if err != nil {
		c.logger.Warn("could not fail a step whose request cannot be sent; it will run out its time", "order_id", s.OrderID, "step", s.Step, "err", err)
		return
	}
	c.wakeRelay()
}

// traceClaim records, in the step's order's trace, its claim (a span from
// claimedAt to now) and starts the span of its request's publish, a child
// of the claim's. With tracing off it returns ctx and a span that records
// nothing.
func traceClaim(ctx context.Context, tr *tracing.Tracing, s statestore.ClaimedStep, claimedAt time.Time) (context.Context, trace.Span) {
	if !tr.On() {
		return ctx, trace.SpanFromContext(ctx)
	}
	more := []attribute.KeyValue{attribute.String("sas.step_name", s.Name),
		attribute.String("sas.step_kind", s.Kind), attribute.String("sas.agent", s.Agent)}
	if s.Index != nil {
		// An instance of a for_each step: which item.
		more = append(more, attribute.Int("sas.item_index", *s.Index))
	}
	attrs := trace.WithAttributes(tracing.StepAttrs(s.OrderID, s.Step, s.Attempt, more...)...)
	name := "claim " + s.Name
	if s.Kind == statestore.KindCompensation {
		name = "claim compensation " + s.Name
	}
	if s.Index != nil {
		name += "[" + strconv.Itoa(*s.Index) + "]"
	}
	cctx, claim := tr.Start(tr.Resume(ctx, s.Traceparent), name, trace.WithTimestamp(claimedAt), attrs)
	claim.End()
	return tr.Start(cctx, "publish request "+s.Name, trace.WithSpanKind(trace.SpanKindProducer), attrs)
}

// request builds a claimed step's StepRequest, with its token and the
// AMQP expiration set to the budget left, so a request nobody took in
// time dies in the queue instead of reaching an agent too late.
func request(s statestore.ClaimedStep, input []byte, token string) (amqp.Publishing, error) {
	body, err := messages.Encode(stepRequest(s, input, token))
	if err != nil {
		return amqp.Publishing{}, err
	}
	if len(body) > messages.MaxBodyBytes {
		return amqp.Publishing{}, fmt.Errorf("the request would be %d bytes, more than an agent reads (%d): the payload and the results of the steps before it are too large together",
			len(body), messages.MaxBodyBytes)
	}
	return amqp.Publishing{
		ContentType: messages.ContentType,
		Type:        messages.TypeStepRequest,
		MessageId:   fmt.Sprintf("%s/%d/%d", s.OrderID, s.Step, s.Attempt),
		Priority:    uint8(s.Priority),
		Expiration:  strconv.FormatInt(max(s.Budget.Milliseconds(), 1), 10),
		Body:        body,
	}, nil
}

// stepRequest is a claimed step's StepRequest.
func stepRequest(s statestore.ClaimedStep, input []byte, token string) messages.StepRequest {
	return messages.StepRequest{
		SchemaVersion:  messages.StepRequestVersion,
		OrderID:        s.OrderID,
		Step:           s.Step,
		Name:           s.Name,
		Agent:          s.Agent,
		Attempt:        s.Attempt,
		IdempotencyKey: s.IdempotencyKey,
		CompleteBy:     s.CompleteBy.UTC(),
		Payload:        s.Payload,
		Results:        s.Results,
		Undoes:         s.Undoes,
		UndoneResult:   s.UndoneResult,
		Input:          input,
		Item:           s.Item,
		Index:          s.Index,
		Token:          token,
	}
}
