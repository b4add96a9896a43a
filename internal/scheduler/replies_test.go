package scheduler

import (
	"cmp"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/tracing"
)

// fakeReplyStore answers the replier's lone applies and notes as a test
// says, and records them.
type fakeReplyStore struct {
	mu      sync.Mutex
	apply   func(statestore.Reply) (statestore.ApplyResult, error)
	applied []statestore.Reply
	noted   []string
	held    []statestore.Hold
	keep    bool
	lowered []time.Duration
}

func (f *fakeReplyStore) ApplyReply(_ context.Context, r statestore.Reply) (statestore.ApplyResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, r)
	return f.apply(r)
}

func (f *fakeReplyStore) HoldStep(_ context.Context, h statestore.Hold) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = append(f.held, h)
	return time.Now(), nil
}

func (f *fakeReplyStore) LowerRateOf(_ context.Context, _ string, _ int, after time.Duration) (string, float64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lowered = append(f.lowered, after)
	return "pay", 25, true, nil
}

func (f *fakeReplyStore) NoteAnswer(_ context.Context, _ string, _, _ int, answer string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noted = append(f.noted, answer)
	return f.keep, nil
}

// replierRig is a replier whose batch writer answers with batchApply,
// recording what it woke and dispatched.
type replierRig struct {
	r                   *replier
	store               *fakeReplyStore
	wokeClaimer, relay  int
	dispatched          []statestore.ClaimedStep
	batchCalls          int
	stop                func()
	metricsRegistry     *prometheus.Registry
	replies, staleKinds *prometheus.CounterVec
	finished            *prometheus.CounterVec
}

func newReplierRig(t *testing.T, batchApply func(statestore.Reply) (statestore.ApplyResult, error), store *fakeReplyStore) *replierRig {
	t.Helper()
	rig := &replierRig{store: store, metricsRegistry: prometheus.NewRegistry()}
	m := newMetrics(rig.metricsRegistry)
	ctx, cancel := context.WithCancel(context.Background())
	applies := batch.New(4, 0, func(_ context.Context, rs []statestore.Reply) ([]statestore.ApplyResult, []error) {
		rig.batchCalls++
		res := make([]statestore.ApplyResult, len(rs))
		errs := make([]error, len(rs))
		for i, r := range rs {
			res[i], errs[i] = batchApply(r)
		}
		return res, errs
	})
	var wg sync.WaitGroup
	wg.Go(func() { applies.Run(ctx, 1) })
	rig.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(rig.stop)
	rig.r = &replier{store: store, applies: applies, me: "scheduler-t", workCtx: context.Background(),
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: m, tr: tracing.Off(),
		wakeClaimer: func() { rig.wokeClaimer++ }, wakeRelay: func() { rig.relay++ },
		dispatch: func(cs []statestore.ClaimedStep, _ time.Time) { rig.dispatched = append(rig.dispatched, cs...) }}
	rig.replies, rig.staleKinds, rig.finished = m.replies, m.stale, m.ordersFinished
	return rig
}

func (rig *replierRig) deliver(t *testing.T, rep messages.StepReply) error {
	t.Helper()
	body, err := messages.Encode(rep)
	if err != nil {
		t.Fatal(err)
	}
	return rig.r.handler()(context.Background(), broker.Message{ID: "m", ContentType: messages.ContentType, Body: body})
}

const replyOrder = "0b8a4a52-5d7f-4a5e-9d4c-3f1c2b7d9e10"

func okReply() messages.StepReply {
	return messages.StepReply{SchemaVersion: messages.SchemaVersion, OrderID: replyOrder, Step: 1, Attempt: 1, Outcome: messages.OutcomeOK}
}

func noLoneApply(statestore.Reply) (statestore.ApplyResult, error) {
	return statestore.ApplyResult{}, errors.New("the reply was applied on its own")
}

func TestReplierActsOnWhatTheStoreDecided(t *testing.T) {
	for _, c := range []struct {
		name                   string
		result                 statestore.ApplyResult
		err                    error
		wantClaimer, wantRelay int
		wantDispatched         int
		wantCounted            string
	}{
		{"the next step became pending: the claimer is woken",
			statestore.ApplyResult{StepState: statestore.StepProcessed, NextStep: 2}, nil, 1, 0, 0, statestore.StepProcessed},
		{"the next step was claimed with the reply: its request is sent",
			statestore.ApplyResult{StepState: statestore.StepProcessed, NextStep: 2, Claimed: &statestore.ClaimedStep{OrderID: replyOrder, Step: 2, Agent: "payment"}},
			nil, 0, 0, 1, statestore.StepProcessed},
		{"the order ended: the relay is woken for its event",
			statestore.ApplyResult{StepState: statestore.StepProcessed, OrderStatus: statestore.OrderCompleted, OrderTook: time.Second}, nil, 0, 1, 0, statestore.StepProcessed},
		{"compensation began: both are woken",
			statestore.ApplyResult{StepState: statestore.StepError, OrderStatus: statestore.OrderCompensating}, nil, 1, 1, 0, statestore.StepError},
		{"a stale reply is acked and counted, nothing woken",
			statestore.ApplyResult{}, &statestore.StaleReplyError{Kind: statestore.StaleSuperseded, Reason: "attempt superseded"}, 0, 0, 0, "stale"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) { return c.result, c.err }, &fakeReplyStore{apply: noLoneApply})
			if err := rig.deliver(t, okReply()); err != nil {
				t.Fatalf("verdict %v, want ack", err)
			}
			if rig.wokeClaimer != c.wantClaimer || rig.relay != c.wantRelay || len(rig.dispatched) != c.wantDispatched {
				t.Fatalf("woke the claimer %d, the relay %d, dispatched %d; want %d, %d, %d",
					rig.wokeClaimer, rig.relay, len(rig.dispatched), c.wantClaimer, c.wantRelay, c.wantDispatched)
			}
			if n := testutil.ToFloat64(rig.replies.WithLabelValues(c.wantCounted)); n != 1 {
				t.Fatalf("replies counted %q: %v, want 1", c.wantCounted, n)
			}
			if n := testutil.ToFloat64(rig.staleKinds.WithLabelValues(statestore.StaleSuperseded)); (n == 1) != (c.err != nil) {
				t.Fatalf("stale replies counted as superseded: %v", n)
			}
		})
	}
}

// An order a reply ended is counted in its namespace (default's when
// the store names none).
func TestReplierCountsEndedOrdersByNamespace(t *testing.T) {
	for _, ns := range []string{"team-a", ""} {
		rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) {
			return statestore.ApplyResult{StepState: statestore.StepProcessed, OrderStatus: statestore.OrderCompleted, OrderTook: time.Second,
				OrderNamespace: ns}, nil
		}, &fakeReplyStore{apply: noLoneApply})
		if err := rig.deliver(t, okReply()); err != nil {
			t.Fatalf("verdict %v, want ack", err)
		}
		want := cmp.Or(ns, statestore.DefaultNamespace)
		if n := testutil.ToFloat64(rig.finished.WithLabelValues(statestore.OrderCompleted, want)); n != 1 {
			t.Fatalf("orders completed in %s: %v, want 1", want, n)
		}
	}
}

func TestReplierTriesAHeldReplyAlone(t *testing.T) {
	lockTimeout := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	store := &fakeReplyStore{apply: func(statestore.Reply) (statestore.ApplyResult, error) {
		return statestore.ApplyResult{StepState: statestore.StepProcessed}, nil
	}}
	rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) {
		return statestore.ApplyResult{}, lockTimeout
	}, store)
	if err := rig.deliver(t, okReply()); err != nil {
		t.Fatalf("verdict %v, want ack", err)
	}
	if rig.batchCalls != 1 || len(store.applied) != 1 || store.applied[0].Actor != "scheduler-t" || !store.applied[0].OK {
		t.Fatalf("batch tried %d times, alone %+v; want once in the batch, then alone", rig.batchCalls, store.applied)
	}
}

func TestReplierKeepsAnAbandonedAttemptsAnswer(t *testing.T) {
	store := &fakeReplyStore{apply: noLoneApply, keep: true}
	rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) {
		return statestore.ApplyResult{}, errors.New("an abandoned reply went to the batch")
	}, store)
	rep := okReply()
	rep.Outcome, rep.LastAnswer = messages.OutcomeAbandoned, "503: down"
	if err := rig.deliver(t, rep); err != nil {
		t.Fatalf("verdict %v, want ack", err)
	}
	if len(store.noted) != 1 || store.noted[0] != "503: down" || rig.batchCalls != 0 {
		t.Fatalf("noted %v, batch calls %d", store.noted, rig.batchCalls)
	}
	if n := testutil.ToFloat64(rig.replies.WithLabelValues("abandoned")); n != 1 {
		t.Fatalf("abandoned replies counted: %v", n)
	}
}

// A throttled reply (a service's 429) lowers its kind's rate and
// changes nothing of the step.
func TestReplierLowersTheRateOnA429(t *testing.T) {
	store := &fakeReplyStore{apply: noLoneApply}
	rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) {
		return statestore.ApplyResult{}, errors.New("a throttled reply went to the batch")
	}, store)
	rep := okReply()
	rep.Outcome, rep.RetryAfterMS = messages.OutcomeThrottled, 3000
	if err := rig.deliver(t, rep); err != nil {
		t.Fatalf("verdict %v, want ack", err)
	}
	if len(store.lowered) != 1 || store.lowered[0] != 3*time.Second || rig.batchCalls != 0 || len(store.applied) != 0 {
		t.Fatalf("lowered %v, batch calls %d, applied %v", store.lowered, rig.batchCalls, store.applied)
	}
	if n := testutil.ToFloat64(rig.r.metrics.limitLowered.WithLabelValues("pay")); n != 1 {
		t.Fatalf("sas_limit_lowered_total = %v", n)
	}
}

func TestReplierRefusesAReplyItCannotRead(t *testing.T) {
	for _, c := range []struct {
		name        string
		contentType string
		body        string
		wantFailed  bool // the attempt the body names is failed at once
	}{
		{"an unknown outcome names its attempt", messages.ContentType,
			`{"schema_version":1,"order_id":"` + replyOrder + `","step":2,"attempt":3,"outcome":"maybe"}`, true},
		{"a body that is not JSON names nothing", messages.ContentType, `{"schema_version":1,`, false},
		{"another content type is not read at all", "text/plain",
			`{"schema_version":1,"order_id":"` + replyOrder + `","step":2,"attempt":3,"outcome":"maybe"}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &fakeReplyStore{apply: func(statestore.Reply) (statestore.ApplyResult, error) {
				return statestore.ApplyResult{StepState: statestore.StepError, OrderStatus: statestore.OrderError}, nil
			}}
			rig := newReplierRig(t, func(statestore.Reply) (statestore.ApplyResult, error) {
				return statestore.ApplyResult{}, errors.New("a refused reply went to the batch")
			}, store)
			err := rig.r.handler()(context.Background(), broker.Message{ID: "m", ContentType: c.contentType, Body: []byte(c.body)})
			var rej *broker.Rejection
			if !errors.As(err, &rej) {
				t.Fatalf("verdict %v, want a dead letter", err)
			}
			if n := testutil.ToFloat64(rig.replies.WithLabelValues("rejected")); n != 1 {
				t.Fatalf("rejected replies counted: %v", n)
			}
			failed := len(store.applied) == 1 && !store.applied[0].OK && store.applied[0].Step == 2 && store.applied[0].Attempt == 3 &&
				store.applied[0].Error != ""
			if failed != c.wantFailed || (!c.wantFailed && len(store.applied) != 0) {
				t.Fatalf("applied alone %+v; want the named attempt failed: %v", store.applied, c.wantFailed)
			}
		})
	}
}
