package scheduler

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/secrets"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/tracing"
)

// fakeSignalStore answers the signaler as the state store would, and
// records what it was asked.
type fakeSignalStore struct {
	outcome   statestore.SignalOutcome
	signalErr []error // returned by ApplySignal in turn, then nil
	signals   []statestore.Signal
	callbacks []statestore.Callback
	cbOut     string // the callbacks' outcome ("": applied)
	cbErr     error
	told      []messages.StatusEvent
	byKey     []string // the orders OrdersByKey finds
	limits    []int    // the limits it was asked with
	inNS      [][]string
	// orders are the orders' namespaces (nil: every order is default's)
	orders map[string]string
}

func (f *fakeSignalStore) OrdersByKeyIn(_ context.Context, _ string, _ map[string]any, limit int, namespaces []string) ([]string, error) {
	f.limits = append(f.limits, limit)
	f.inNS = append(f.inNS, namespaces)
	return f.byKey[:min(limit, len(f.byKey))], nil
}

func (f *fakeSignalStore) NamespaceOf(_ context.Context, orderID string) (string, bool, error) {
	if f.orders == nil {
		return statestore.DefaultNamespace, true, nil
	}
	ns, ok := f.orders[orderID]
	return ns, ok, nil
}

func (f *fakeSignalStore) ApplySignal(_ context.Context, sig statestore.Signal) (statestore.SignalOutcome, error) {
	if _, known := f.orders[sig.OrderID]; f.orders != nil && !known {
		// as the store answers for an order that does not exist
		return statestore.SignalOutcome{Outcome: statestore.SignalUnknownOrder, Detail: "order " + sig.OrderID + " does not exist"}, nil
	}
	f.signals = append(f.signals, sig)
	if len(f.signalErr) > 0 {
		err := f.signalErr[0]
		f.signalErr = f.signalErr[1:]
		return statestore.SignalOutcome{}, err
	}
	return f.outcome, nil
}

func (f *fakeSignalStore) Callback(_ context.Context, c statestore.Callback) (statestore.CallbackOutcome, error) {
	f.callbacks = append(f.callbacks, c)
	if f.cbErr != nil {
		return statestore.CallbackOutcome{}, f.cbErr
	}
	out := statestore.CallbackOutcome{Outcome: cmp.Or(f.cbOut, statestore.SignalApplied)}
	if out.Outcome != statestore.SignalApplied {
		out.Detail = "the store said " + out.Outcome
	}
	return out, nil
}

func (f *fakeSignalStore) TellRejected(_ context.Context, _, _, _ string, body []byte) error {
	var ev messages.StatusEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return err
	}
	f.told = append(f.told, ev)
	return nil
}

type signalBench struct {
	store   *fakeSignalStore
	g       *signaler
	key     steptoken.Key
	wakes   int
	metrics *metrics
}

func newSignalBench(t *testing.T, st *fakeSignalStore) *signalBench {
	t.Helper()
	key, err := steptoken.NewKey(strings.Repeat("k", steptoken.MinKeyLen))
	if err != nil {
		t.Fatal(err)
	}
	b := &signalBench{store: st, key: key, metrics: newMetrics(prometheus.NewRegistry())}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	b.g = &signaler{store: st, me: "scheduler:test", workCtx: ctx, logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		metrics: b.metrics, tr: tracing.Off(), tokens: key, redact: secrets.New("s3cr3t-value"),
		wakeClaimer: func() { b.wakes++ }, wakeRelay: func() {},
		grants: intake.BrokerGrants{"team-a-app": {"team-a"}, "platform": {"*"}},
		exists: func(_ context.Context, ns string) (bool, error) { return ns == "team-a" || ns == "team-b", nil }}
	return b
}

func (b *signalBench) send(t *testing.T, body any) error {
	t.Helper()
	raw, ok := body.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	return b.g.handler()(context.Background(), broker.Message{Body: raw, CorrelationID: "corr-1", ContentType: messages.ContentType})
}

func rejection(err error) *broker.Rejection {
	var rej *broker.Rejection
	if errors.As(err, &rej) {
		return rej
	}
	return nil
}

// TestSignalsAreAppliedOrRefusedWithTheirReason: a signal the store
// applies wakes the claimer and is acked; one it keeps is acked; one it
// refuses (or whose payload is invalid) is dead-lettered with the store's
// reason, and its reply_to told; a transient failure is retried; a body
// that is no signal is refused with the decoder's reason, its reply_to
// told with the order it names.
func TestSignalsAreAppliedOrRefusedWithTheirReason(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	sig := messages.Signal{SchemaVersion: 1, SignalID: "s-1", OrderID: id, Name: "approved", Payload: json.RawMessage(`{"by":"ann"}`),
		By: "ann", ReplyTo: "client.replies"}
	for _, tc := range []struct {
		name      string
		store     fakeSignalStore
		wantErr   string // the rejection's reason, "" for an ack
		wantWakes int
		wantTries int
	}{
		{name: "applied", store: fakeSignalStore{outcome: statestore.SignalOutcome{Outcome: statestore.SignalApplied, Step: 2}},
			wantWakes: 1, wantTries: 1},
		{name: "kept", store: fakeSignalStore{outcome: statestore.SignalOutcome{Outcome: statestore.SignalKept}}, wantTries: 1},
		{name: "refused", store: fakeSignalStore{outcome: statestore.SignalOutcome{Outcome: statestore.SignalNoSuchWait, Detail: "no step waits for approved"}},
			wantErr: statestore.SignalNoSuchWait, wantTries: 1},
		{name: "invalid data", store: fakeSignalStore{signalErr: []error{statestore.ErrInvalidData}},
			wantErr: messages.ReasonInvalidValue, wantTries: 1},
		{name: "a transient failure", store: fakeSignalStore{signalErr: []error{errors.New("connection reset")},
			outcome: statestore.SignalOutcome{Outcome: statestore.SignalApplied, Step: 2}}, wantWakes: 1, wantTries: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := tc.store
			b := newSignalBench(t, &st)
			err := b.send(t, sig)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (rejection(err) == nil || rejection(err).Reason != tc.wantErr) {
				t.Fatalf("verdict %v, want %q", err, tc.wantErr)
			}
			if len(st.signals) != tc.wantTries || b.wakes != tc.wantWakes {
				t.Fatalf("%d tries, %d wakes; want %d, %d", len(st.signals), b.wakes, tc.wantTries, tc.wantWakes)
			}
			if got := st.signals[0]; got.OrderID != id || got.ID != "s-1" || got.Name != "approved" || got.Actor != "signal:ann" ||
				string(got.Payload) != `{"by":"ann"}` {
				t.Fatalf("signal applied as %+v", got)
			}
			if tc.wantErr != "" && (len(st.told) != 1 || st.told[0].Reason != tc.wantErr || st.told[0].OrderID != id ||
				st.told[0].Status != messages.StatusRejected) {
				t.Fatalf("reply_to told %+v", st.told)
			}
			if tc.wantErr == "" && len(st.told) != 0 {
				t.Fatalf("an accepted signal told its reply_to %+v", st.told)
			}
		})
	}
	st := &fakeSignalStore{}
	b := newSignalBench(t, st)
	err := b.send(t, []byte(`{"schema_version":1,"order_id":"`+id+`","name":7,"reply_to":"client.replies"}`))
	if rej := rejection(err); rej == nil || rej.Reason != messages.ReasonInvalidValue || len(st.signals) != 0 {
		t.Fatalf("an unreadable signal: %v, %d applied", err, len(st.signals))
	}
	if len(st.told) != 1 || st.told[0].OrderID != id {
		t.Fatalf("an unreadable signal's reply_to told %+v", st.told)
	}
	if got := testutil.ToFloat64(b.metrics.signals.WithLabelValues("refused")); got != 1 {
		t.Fatalf("refused signals counted %v, want 1", got)
	}
}

// TestCallbacksAreFencedByTheirToken: a callback's token names its
// attempt: complete and fail are applied as that attempt's reply (its
// result and error redacted), heartbeat holds it; a token sas did not
// make, or for another order than the signal's, is refused as invalid,
// a stale attempt's as stale, and nothing is applied; a repeated
// callback is acked and wakes nobody.
func TestCallbacksAreFencedByTheirToken(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	cb := func(b *signalBench, name string) messages.Signal {
		s := messages.Signal{SchemaVersion: 1, Name: name, Token: b.key.Mint(steptoken.Ref{OrderID: id, Step: 3, Attempt: 2}),
			By: "svc", ReplyTo: "client.replies"}
		switch name {
		case messages.CallbackComplete:
			s.Payload = json.RawMessage(`{"note":"s3cr3t-value"}`)
		case messages.CallbackFail:
			s.Error = "declined: s3cr3t-value"
		}
		return s
	}
	t.Run("complete", func(t *testing.T) {
		t.Parallel()
		st := &fakeSignalStore{}
		b := newSignalBench(t, st)
		if err := b.send(t, cb(b, messages.CallbackComplete)); err != nil {
			t.Fatal(err)
		}
		if len(st.callbacks) != 1 || b.wakes != 1 {
			t.Fatalf("callbacks %+v, wakes %d", st.callbacks, b.wakes)
		}
		r := st.callbacks[0]
		want := b.key.Mint(steptoken.Ref{OrderID: id, Step: 3, Attempt: 2})
		if r.Token != want || r.Name != messages.CallbackComplete || r.Actor != "callback:svc" || r.Notify ||
			!strings.Contains(string(r.Result), "note") || strings.Contains(string(r.Result), "s3cr3t") {
			t.Fatalf("applied as %+v (%s)", r, r.Result)
		}
	})
	t.Run("fail", func(t *testing.T) {
		t.Parallel()
		st := &fakeSignalStore{}
		b := newSignalBench(t, st)
		if err := b.send(t, cb(b, messages.CallbackFail)); err != nil {
			t.Fatal(err)
		}
		if len(st.callbacks) != 1 || st.callbacks[0].Name != messages.CallbackFail || !strings.HasPrefix(st.callbacks[0].Error, "declined") ||
			strings.Contains(st.callbacks[0].Error, "s3cr3t") {
			t.Fatalf("applied as %+v", st.callbacks)
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		t.Parallel()
		st := &fakeSignalStore{}
		b := newSignalBench(t, st)
		if err := b.send(t, cb(b, messages.CallbackHeartbeat)); err != nil {
			t.Fatal(err)
		}
		if len(st.callbacks) != 1 || st.callbacks[0].Name != messages.CallbackHeartbeat || b.wakes != 0 {
			t.Fatalf("callbacks %+v, wakes %d", st.callbacks, b.wakes)
		}
	})
	t.Run("repeated", func(t *testing.T) {
		t.Parallel()
		st := &fakeSignalStore{cbOut: statestore.SignalDuplicate}
		b := newSignalBench(t, st)
		if err := b.send(t, cb(b, messages.CallbackComplete)); err != nil || b.wakes != 0 {
			t.Fatalf("%v, wakes %d", err, b.wakes)
		}
		if got := testutil.ToFloat64(b.metrics.signals.WithLabelValues(statestore.SignalDuplicate)); got != 1 {
			t.Fatalf("duplicates counted %v", got)
		}
	})
	for _, tc := range []struct {
		name   string
		change func(b *signalBench, s *messages.Signal)
		store  fakeSignalStore
		want   string
	}{
		{"tampered", func(_ *signalBench, s *messages.Signal) { s.Token = s.Token[:len(s.Token)-2] + "xx" }, fakeSignalStore{}, ReasonInvalidToken},
		{"another order's", func(_ *signalBench, s *messages.Signal) { s.OrderID = messages.NewID() }, fakeSignalStore{}, ReasonInvalidToken},
		{"stale", func(*signalBench, *messages.Signal) {},
			fakeSignalStore{cbOut: statestore.CallbackStaleToken}, ReasonStaleToken},
		{"another key's", func(*signalBench, *messages.Signal) {}, fakeSignalStore{cbOut: statestore.CallbackInvalidToken}, ReasonInvalidToken},
		{"invalid result", func(*signalBench, *messages.Signal) {}, fakeSignalStore{cbErr: statestore.ErrInvalidData}, messages.ReasonInvalidValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := tc.store
			b := newSignalBench(t, &st)
			s := cb(b, messages.CallbackComplete)
			tc.change(b, &s)
			err := b.send(t, s)
			if rej := rejection(err); rej == nil || rej.Reason != tc.want {
				t.Fatalf("verdict %v, want %s", err, tc.want)
			}
			if b.wakes != 0 || len(st.told) != 1 || st.told[0].Reason != tc.want {
				t.Fatalf("wakes %d, told %+v", b.wakes, st.told)
			}
			if tc.want == ReasonInvalidToken && st.cbOut == "" && len(st.callbacks) != 0 {
				t.Fatalf("a refused token's callback was applied: %+v", st.callbacks)
			}
		})
	}
}

// TestSignalsByKeyReachOneOrEveryMatch: a signal that names its order by
// business key reaches the one match under SIGNAL_ID:ORDER_ID; with
// several matches it is refused (ambiguous) unless it asks for all, and
// then reaches each; with none it is refused (no_match); its reply_to is
// told of a refusal.
func TestSignalsByKeyReachOneOrEveryMatch(t *testing.T) {
	t.Parallel()
	a, b := messages.NewID(), messages.NewID()
	sig := messages.Signal{SchemaVersion: 1, SignalID: "s-1", Workflow: "loan", Where: map[string]any{"applicant": "42"}, Name: "approved",
		ReplyTo: "client.replies"}
	applied := statestore.SignalOutcome{Outcome: statestore.SignalApplied, Step: 2}
	for _, tc := range []struct {
		name    string
		matches []string
		all     bool
		wantErr string
		want    []string // the signals applied, by id
	}{
		{"one match", []string{a}, false, "", []string{"s-1:" + a}},
		{"two matches", []string{a, b}, false, statestore.SignalAmbiguous, nil},
		{"two matches, all", []string{a, b}, true, "", []string{"s-1:" + a, "s-1:" + b}},
		{"no match", nil, false, statestore.SignalNoMatch, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeSignalStore{outcome: applied, byKey: tc.matches}
			bench := newSignalBench(t, st)
			one := sig
			one.All = tc.all
			err := bench.send(t, one)
			if got := rejection(err); (tc.wantErr == "") != (err == nil) || (got != nil && got.Reason != tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			var ids []string
			for _, g := range st.signals {
				ids = append(ids, g.ID)
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("applied %v, want %v", ids, tc.want)
			}
			if tc.wantErr != "" && (len(st.told) != 1 || st.told[0].Reason != tc.wantErr) {
				t.Fatalf("reply_to told %+v, want the refusal %s", st.told, tc.wantErr)
			}
		})
	}
}

// TestSignalsActInTheirPublishersNamespace: an application's signal (it
// came through the signals queue's exchange) reaches the orders of the
// namespace its header names when its publisher's login (user-id) was
// granted it, of default when it names none; an order of another
// namespace is unknown to it, as one that does not exist, and nothing is
// applied; a namespace not granted, or that does not exist, is refused.
// One of sas's own publishers (the default exchange: the API, the
// console, sasctl check the namespace themselves) reaches any order. A
// refusal is its order's namespace's dead letter.
func TestSignalsActInTheirPublishersNamespace(t *testing.T) {
	t.Parallel()
	inA, inB, inDefault := messages.NewID(), messages.NewID(), messages.NewID()
	orders := map[string]string{inA: "team-a", inB: "team-b", inDefault: "default"}
	applied := statestore.SignalOutcome{Outcome: statestore.SignalApplied, Step: 1}
	for _, tc := range []struct {
		name, user, header, order string
		internal                  bool   // through the default exchange
		want                      string // the refusal's reason; "" for applied
		ns                        string // the dead letter's namespace
	}{
		{name: "sas's own, any order", order: inB, internal: true},
		{name: "sas's own, any order's refusal", order: inB, internal: true, want: statestore.SignalNoSuchWait, ns: "team-b"},
		{name: "sas's own, an unknown order", order: messages.NewID(), internal: true, want: statestore.SignalUnknownOrder},
		{name: "default's order, no header", order: inDefault},
		{name: "another's order, no header", order: inA, want: statestore.SignalUnknownOrder, ns: "default"},
		{name: "its namespace's order", user: "team-a-app", header: "team-a", order: inA},
		{name: "another namespace's order", user: "team-a-app", header: "team-a", order: inB, want: statestore.SignalUnknownOrder, ns: "team-a"},
		{name: "an order that does not exist", user: "team-a-app", header: "team-a", order: messages.NewID(), want: statestore.SignalUnknownOrder, ns: "team-a"},
		{name: "a namespace not granted", user: "team-a-app", header: "team-b", order: inB, want: intake.ReasonNamespaceRefused},
		{name: "no user-id", header: "team-a", order: inA, want: intake.ReasonNamespaceRefused},
		{name: "every namespace's login", user: "platform", header: "team-b", order: inB},
		{name: "no such namespace", user: "platform", header: "team-z", order: inB, want: intake.ReasonUnknownNamespace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeSignalStore{outcome: applied, orders: orders}
			if tc.want == statestore.SignalNoSuchWait {
				st.outcome = statestore.SignalOutcome{Outcome: statestore.SignalNoSuchWait, Detail: "no step waits for approved"}
			}
			b := newSignalBench(t, st)
			raw, err := json.Marshal(messages.Signal{SchemaVersion: 1, SignalID: "s-1", OrderID: tc.order, Name: "approved", ReplyTo: "client.r"})
			if err != nil {
				t.Fatal(err)
			}
			m := broker.Message{Body: raw, ContentType: messages.ContentType, UserID: tc.user, Via: "sas.signals"}
			if tc.internal {
				m.Via = ""
			}
			if tc.header != "" {
				m.Headers = map[string]any{intake.NamespaceHeader: tc.header}
			}
			err = b.g.handler()(context.Background(), m)
			rej := rejection(err)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want == "" && len(st.signals) != 1:
				t.Fatalf("applied %d times", len(st.signals))
			case tc.want != "" && (rej == nil || rej.Reason != tc.want):
				t.Fatalf("verdict %v, want %s", err, tc.want)
			case tc.want != "" && tc.want != statestore.SignalNoSuchWait && len(st.signals) != 0:
				t.Fatalf("a refused signal was applied: %+v", st.signals)
			case tc.want != "" && rej.Namespace != tc.ns:
				t.Fatalf("dead letter of namespace %q, want %q", rej.Namespace, tc.ns)
			case tc.want != "" && (len(st.told) != 1 || st.told[0].Reason != tc.want):
				t.Fatalf("reply_to told %+v", st.told)
			}
		})
	}
	// By key: only among the namespace's orders.
	st := &fakeSignalStore{outcome: applied, orders: orders, byKey: []string{inA}}
	b := newSignalBench(t, st)
	raw, err := json.Marshal(messages.Signal{SchemaVersion: 1, SignalID: "s-2", Workflow: "loan", Where: map[string]any{"customer": "c-1"}, Name: "approved"})
	if err != nil {
		t.Fatal(err)
	}
	m := broker.Message{Body: raw, ContentType: messages.ContentType, UserID: "team-a-app", Via: "sas.signals",
		Headers: map[string]any{intake.NamespaceHeader: "team-a"}}
	if err := b.g.handler()(context.Background(), m); err != nil || len(st.signals) != 1 {
		t.Fatalf("by key: %v, applied %d", err, len(st.signals))
	}
	if len(st.inNS) != 1 || len(st.inNS[0]) != 1 || st.inNS[0][0] != "team-a" {
		t.Fatalf("orders found by key among namespaces %v, want [team-a]", st.inNS)
	}
}
