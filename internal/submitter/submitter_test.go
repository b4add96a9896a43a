package submitter

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/statestore"
	"sas/internal/tracing"
	"sas/internal/workflow"
)

// fakeSubmitStore records the refusals told; the batched inserts answer
// from its results in turn.
type fakeSubmitStore struct {
	mu       sync.Mutex
	results  []error // each insert's error in turn (then nil)
	outcome  statestore.InsertOutcome
	inserted []statestore.NewOrder
	told     []messages.StatusEvent
	// alone are the orders written within their namespace's quotas;
	// refusal is what the quotas answer (nil: admitted).
	alone   []statestore.NewOrder
	refusal *statestore.QuotaRefusal
}

func (f *fakeSubmitStore) InsertOrder(context.Context, statestore.NewOrder) (statestore.InsertOutcome, error) {
	return 0, errors.New("a lone insert is the broken build's")
}

func (f *fakeSubmitStore) InsertOrderWithinQuota(_ context.Context, o statestore.NewOrder) (statestore.InsertOutcome, *statestore.QuotaRefusal, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.alone = append(f.alone, o)
	if f.refusal != nil {
		return 0, f.refusal, nil
	}
	return f.outcome, nil, nil
}

// fakeNamespaces are namespaces that exist, with quotas or not.
type fakeNamespaces map[string]bool

func (f fakeNamespaces) Exists(_ context.Context, ns string) (bool, error) {
	_, ok := f[ns]
	return ok, nil
}

func (f fakeNamespaces) Quotas(_ context.Context, ns string) (bool, error) { return f[ns], nil }

func (f *fakeSubmitStore) TellRejected(_ context.Context, _, _, _ string, body []byte) error {
	var ev messages.StatusEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.told = append(f.told, ev)
	return nil
}

func (f *fakeSubmitStore) insert(_ context.Context, orders []statestore.NewOrder) ([]statestore.InsertOutcome, []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	outs, errs := make([]statestore.InsertOutcome, len(orders)), make([]error, len(orders))
	for i, o := range orders {
		f.inserted = append(f.inserted, o)
		if len(f.results) > 0 {
			errs[i], f.results = f.results[0], f.results[1:]
		}
		if errs[i] == nil {
			outs[i] = f.outcome
		}
	}
	return outs, errs
}

// storeAnswers are what a fakeSubmitStore answers.
type storeAnswers struct {
	outcome statestore.InsertOutcome
	results []error
}

const submitFile = `
workflows:
  - name: shop
    payload_schema: {type: object, required: [customer]}
    steps:
      - {action: pay, agent: payments}
`

// newHandler is a submitter's handler over st, its batcher running until
// the test ends.
func newHandler(t *testing.T, st *fakeSubmitStore) (*handler, *metrics) {
	t.Helper()
	reg, err := workflow.Parse("submit_test.yaml", []byte(submitFile))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	inserts := batch.New(8, time.Millisecond, st.insert)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		inserts.Run(ctx, 1)
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	m := newMetrics(prometheus.NewRegistry())
	grants, err := intake.ParseBrokerGrants("team-a-app=team-a, team-a-app=team-q, platform=*")
	if err != nil {
		t.Fatal(err)
	}
	return &handler{store: st, inserts: inserts, workflows: reg, actor: "submitter:test", metrics: m,
		logger: slog.New(slog.NewTextHandler(io.Discard, nil)), workCtx: ctx, tr: tracing.Off(),
		grants: grants, namespaces: fakeNamespaces{"default": false, "team-a": false, "team-b": false, "team-q": true}}, m
}

// TestSubmitsAreWrittenOrRefusedWithTheirReason: a valid submit is written
// once (by the submitter, with its correlation id) and acked, a duplicate
// too; a transient failure is retried; an order the store finds a
// conflict, or invalid, and one its workflow refuses or that names none,
// are dead-lettered with their reason and their reply_to told; a body
// that is no submit too.
func TestSubmitsAreWrittenOrRefusedWithTheirReason(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	good := `{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{"customer":"c-1"},"reply_to":"client.r"}`
	for _, tc := range []struct {
		name    string
		body    string
		store   storeAnswers
		want    string // the rejection's reason; "" for an ack
		inserts int
		counted string
	}{
		{name: "written", body: good, store: storeAnswers{outcome: statestore.Inserted}, inserts: 1, counted: "inserted"},
		{name: "a duplicate", body: good, store: storeAnswers{outcome: statestore.Duplicate}, inserts: 1, counted: "duplicate"},
		{name: "a transient failure", body: good, store: storeAnswers{outcome: statestore.Inserted, results: []error{errors.New("connection reset")}},
			inserts: 2, counted: "inserted"},
		{name: "a conflict", body: good, store: storeAnswers{results: []error{statestore.ErrConflict}}, want: ReasonConflict, inserts: 1, counted: "rejected"},
		{name: "invalid data", body: good, store: storeAnswers{results: []error{statestore.ErrInvalidData}}, want: messages.ReasonInvalidValue,
			inserts: 1, counted: "rejected"},
		{name: "no such workflow", body: `{"schema_version":2,"order_id":"` + id + `","workflow":"nope","payload":{},"reply_to":"client.r"}`,
			want: ReasonUnknownWorkflow, counted: "rejected"},
		{name: "a payload refused", body: `{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{},"reply_to":"client.r"}`,
			want: messages.ReasonInvalidPayload, counted: "rejected"},
		{name: "no submit", body: `{"schema_version":2,"order_id":"` + id + `","workflow":7,"payload":{},"reply_to":"client.r"}`,
			want: messages.ReasonInvalidValue, counted: "rejected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeSubmitStore{outcome: tc.store.outcome, results: tc.store.results}
			h, m := newHandler(t, st)
			err := h.chain()(context.Background(), broker.Message{Body: []byte(tc.body), CorrelationID: "corr-7", ContentType: messages.ContentType})
			var rej *broker.Rejection
			if tc.want == "" && err != nil || tc.want != "" && (!errors.As(err, &rej) || rej.Reason != tc.want) {
				t.Fatalf("verdict %v, want %q", err, tc.want)
			}
			if rej != nil && rej.Namespace != "default" {
				t.Fatalf("dead letter of namespace %q, want default's (no header)", rej.Namespace)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			if len(st.inserted) != tc.inserts {
				t.Fatalf("%d inserts, want %d", len(st.inserted), tc.inserts)
			}
			if tc.inserts > 0 {
				o := st.inserted[0]
				if o.OrderID != id || o.Actor != "submitter:test" || o.CorrelationID != "corr-7" || o.Workflow != "shop" || len(o.Steps) != 1 {
					t.Fatalf("written as %+v", o)
				}
			}
			if tc.want != "" && (len(st.told) != 1 || st.told[0].Reason != tc.want || st.told[0].OrderID != id ||
				st.told[0].Status != messages.StatusRejected || st.told[0].Detail == "") {
				t.Fatalf("reply_to told %+v", st.told)
			}
			if tc.want == "" && len(st.told) != 0 {
				t.Fatalf("a written order told its reply_to of a refusal: %+v", st.told)
			}
			if got := testutil.ToFloat64(m.orders.WithLabelValues(tc.counted)); got != 1 {
				t.Fatalf("%s counted %v times", tc.counted, got)
			}
		})
	}
}

// TestSubmitsGoToTheNamespaceTheirLoginMay: a submit naming a namespace
// (its sas-namespace header) is written there when the login that
// published it (its user-id) may submit there, and within that
// namespace's quotas when it has some; any other is dead-lettered with
// its reason and its reply_to told. One naming none goes to default.
func TestSubmitsGoToTheNamespaceTheirLoginMay(t *testing.T) {
	t.Parallel()
	id := messages.NewID()
	body := `{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{"customer":"c-1"},"reply_to":"client.r"}`
	inFlight := &statestore.QuotaRefusal{Quota: statestore.QuotaInFlight, Detail: "namespace team-q has 3 orders in flight, its quota"}
	for _, tc := range []struct {
		name, user string
		body       string // "" for a good one
		header     any    // nil: none
		refusal    *statestore.QuotaRefusal
		want       string // the rejection's reason; "" for an ack
		ns         string // where it was written, or whose dead letter it is
		alone      bool   // within quotas
	}{
		{name: "no header", user: "", ns: "default"},
		{name: "its namespace", user: "team-a-app", header: "team-a", ns: "team-a"},
		{name: "every namespace's login", user: "platform", header: "team-b", ns: "team-b"},
		{name: "the default one named", user: "platform", header: "default", ns: "default"},
		{name: "another's namespace", user: "team-a-app", header: "team-b", want: ReasonNamespaceRefused},
		{name: "no user-id", user: "", header: "team-a", want: ReasonNamespaceRefused},
		{name: "a login granted nothing", user: "guest", header: "default", want: ReasonNamespaceRefused},
		{name: "no such namespace", user: "platform", header: "team-z", want: ReasonUnknownNamespace},
		{name: "not a name", user: "platform", header: "Team_A", want: messages.ReasonInvalidValue},
		{name: "not text", user: "platform", header: int32(7), want: messages.ReasonInvalidValue},
		{name: "within its quotas", user: "team-a-app", header: "team-q", ns: "team-q", alone: true},
		{name: "past its quotas", user: "team-a-app", header: "team-q", refusal: inFlight, want: "quota_in_flight", ns: "team-q", alone: true},
		{name: "a granted namespace's bad workflow", user: "team-a-app", header: "team-a", want: ReasonUnknownWorkflow, ns: "team-a",
			body: `{"schema_version":2,"order_id":"` + id + `","workflow":"nope","payload":{},"reply_to":"client.r"}`},
		{name: "a granted namespace's unreadable submit", user: "team-a-app", header: "team-a", want: messages.ReasonInvalidValue, ns: "team-a",
			body: `{"schema_version":2,"order_id":"` + id + `","workflow":7,"payload":{},"reply_to":"client.r"}`},
		{name: "another's unreadable submit", user: "team-a-app", header: "team-b", want: messages.ReasonInvalidValue,
			body: `{"schema_version":2,"order_id":"` + id + `","workflow":7,"payload":{},"reply_to":"client.r"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &fakeSubmitStore{outcome: statestore.Inserted, refusal: tc.refusal}
			h, _ := newHandler(t, st)
			msg := broker.Message{Body: []byte(cmp.Or(tc.body, body)), ContentType: messages.ContentType, UserID: tc.user}
			if tc.header != nil {
				msg.Headers = map[string]any{NamespaceHeader: tc.header}
			}
			err := h.chain()(context.Background(), msg)
			var rej *broker.Rejection
			if tc.want == "" && err != nil || tc.want != "" && (!errors.As(err, &rej) || rej.Reason != tc.want) {
				t.Fatalf("verdict %v, want %q", err, tc.want)
			}
			st.mu.Lock()
			defer st.mu.Unlock()
			written := st.inserted
			if tc.alone {
				written = st.alone
			}
			if tc.want != "" {
				if len(st.inserted) != 0 || len(st.told) != 1 || st.told[0].Reason != tc.want || st.told[0].Detail == "" {
					t.Fatalf("refused: inserted %d, told %+v", len(st.inserted), st.told)
				}
				// A refusal in a namespace its login was granted is that
				// namespace's dead letter; any other, the deployment's.
				if rej.Namespace != tc.ns {
					t.Fatalf("dead letter of namespace %q, want %q", rej.Namespace, tc.ns)
				}
				return
			}
			if len(written) != 1 || cmp.Or(written[0].Namespace, "default") != tc.ns || len(st.inserted)+len(st.alone) != 1 {
				t.Fatalf("written %+v (alone %+v), want one in %s", st.inserted, st.alone, tc.ns)
			}
		})
	}
	for _, bad := range []string{"team-a-app", "=team-a", "app=Team_A"} {
		if _, err := intake.ParseBrokerGrants(bad); err == nil {
			t.Errorf("SAS_SUBMITTER_NAMESPACES=%s accepted", bad)
		}
	}
}

// fakeForwarder records what a submitter passes on.
type fakeForwarder struct {
	mu   sync.Mutex
	sent []forwarded
	err  error
}

type forwarded struct {
	exchange, key string
	msg           amqp.Publishing
}

func (f *fakeForwarder) Publish(_ context.Context, exchange, key string, msg amqp.Publishing) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.sent = append(f.sent, forwarded{exchange, key, msg})
	return nil
}

// TestASubmitOfAnotherPartitionIsPassedOn: in a partitioned deployment a
// submit whose order id's bucket this submitter's partition owns is
// written; one another partition owns is passed to that partition's
// submit entrance as it came (id, correlation id, headers, body) and not
// written here; a failed pass goes back to the queue; one already passed
// on that is not this partition's either is passed on once more, with
// its count, and one passed on twice is dead-lettered wrong_partition,
// never passed round again; an order whose bucket the store says moved
// is passed on to the owner the store names.
func TestASubmitOfAnotherPartitionIsPassedOn(t *testing.T) {
	t.Parallel()
	l, err := partition.Parse([]byte("exchange: sas.route\npartitions:\n" +
		"  - {name: p1, queue_prefix: sas.p1., database_url_env: SAS_P1_URL}\n" +
		"  - {name: p2, queue_prefix: sas.p2., database_url_env: SAS_P2_URL}\n"))
	if err != nil {
		t.Fatal(err)
	}
	// One order id of each partition.
	var ours, theirs string
	for ours == "" || theirs == "" {
		id := messages.NewID()
		if _, p := l.Of(id); p.Name == "p1" {
			ours = cmp.Or(ours, id)
		} else {
			theirs = cmp.Or(theirs, id)
		}
	}
	body := func(id string) []byte {
		return []byte(`{"schema_version":2,"order_id":"` + id + `","workflow":"shop","payload":{"customer":"c-1"},"reply_to":"client.r"}`)
	}
	setup := func(pubErr error) (*handler, *fakeSubmitStore, *fakeForwarder, *metrics) {
		st := &fakeSubmitStore{outcome: statestore.Inserted}
		h, m := newHandler(t, st)
		fw := &fakeForwarder{err: pubErr}
		h.partitions, h.partition, h.pub = &l, 0, fw
		return h, st, fw, m
	}

	h, st, fw, m := setup(nil)
	if err := h.chain()(context.Background(), broker.Message{ID: ours, Body: body(ours), ContentType: messages.ContentType}); err != nil {
		t.Fatalf("its own order: %v", err)
	}
	msg := broker.Message{ID: theirs, CorrelationID: "corr-9", Body: body(theirs), ContentType: messages.ContentType,
		Headers: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	if err := h.chain()(context.Background(), msg); err != nil {
		t.Fatalf("another partition's order: %v", err)
	}
	st.mu.Lock()
	if len(st.inserted) != 1 || st.inserted[0].OrderID != ours {
		t.Fatalf("written here: %+v, want only its own order", st.inserted)
	}
	st.mu.Unlock()
	if len(fw.sent) != 1 {
		t.Fatalf("%d passed on, want 1", len(fw.sent))
	}
	got := fw.sent[0]
	if got.exchange != "sas.p2.submit" || got.key != theirs || got.msg.MessageId != theirs || got.msg.CorrelationId != "corr-9" ||
		string(got.msg.Body) != string(body(theirs)) || got.msg.Headers[ForwardedHeader] != "p1" || got.msg.Headers["traceparent"] == nil {
		t.Fatalf("passed on as %+v", got)
	}
	if n := testutil.ToFloat64(m.orders.WithLabelValues("forwarded")); n != 1 {
		t.Fatalf("forwarded counted %v times", n)
	}

	h, _, _, _ = setup(errors.New("broker gone"))
	var rej *broker.Rejection
	if err := h.chain()(context.Background(), msg); err == nil || errors.As(err, &rej) {
		t.Fatalf("a pass that failed: %v, want an error that requeues", err)
	}

	h, _, fw, _ = setup(nil)
	msg.Headers = map[string]any{ForwardedHeader: "p2"}
	if err := h.chain()(context.Background(), msg); err != nil || len(fw.sent) != 1 || fw.sent[0].msg.Headers[ForwardsHeader] != int32(2) {
		t.Fatalf("passed on once before: %v, sent %+v", err, fw.sent)
	}

	// The store says the bucket of an order of ours moved to p2.
	h, st, fw, _ = setup(nil)
	st.results = []error{&statestore.ElsewhereError{OrderID: ours, Owner: "p2"}}
	if err := h.chain()(context.Background(), broker.Message{ID: ours, Body: body(ours), ContentType: messages.ContentType}); err != nil {
		t.Fatalf("an order whose bucket moved: %v", err)
	}
	if len(fw.sent) != 1 || fw.sent[0].exchange != "sas.p2.submit" || len(st.inserted) != 1 {
		t.Fatalf("an order whose bucket moved: passed on %+v, tried %d times, want once", fw.sent, len(st.inserted))
	}

	h, st, fw, _ = setup(nil)
	msg.Headers = map[string]any{ForwardedHeader: "p2", ForwardsHeader: int32(2)}
	err = h.chain()(context.Background(), msg)
	if !errors.As(err, &rej) || rej.Reason != ReasonWrongPartition {
		t.Fatalf("passed on twice: %v, want %s", err, ReasonWrongPartition)
	}
	if len(fw.sent) != 0 || len(st.inserted) != 0 || len(st.told) != 1 || st.told[0].Reason != ReasonWrongPartition {
		t.Fatalf("passed %d, written %d, told %+v", len(fw.sent), len(st.inserted), st.told)
	}
}
