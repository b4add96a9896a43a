package e2e

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"sas/internal/harness/badinput"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// span is one span as the OTLP receiver got it.
type span struct {
	trace, id, parent string
	name, service     string
	instance          string
	attrs             map[string]string
	start, end        uint64 // Unix nanoseconds
	// status is its status message; events its events' names and
	// attributes, as text.
	status, events string
}

// otlpReceiver is a real OTLP/HTTP endpoint: it decodes the protobuf
// export requests the services send to /v1/traces and keeps their spans.
type otlpReceiver struct {
	url string
	mu  sync.Mutex
	all []span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var ex coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &ex); err != nil {
			t.Errorf("OTLP receiver: a request that is not an ExportTraceServiceRequest: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var got []span
		for _, rs := range ex.ResourceSpans {
			res := attrMap(rs.GetResource().GetAttributes())
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					var events strings.Builder
					for _, e := range s.Events {
						fmt.Fprintf(&events, "%s %v; ", e.Name, attrMap(e.Attributes))
					}
					got = append(got, span{trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
						parent: hex.EncodeToString(s.ParentSpanId), name: s.Name, service: res["service.name"],
						instance: res["service.instance.id"], attrs: attrMap(s.Attributes),
						start: s.StartTimeUnixNano, end: s.EndTimeUnixNano, status: s.GetStatus().GetMessage(), events: events.String()})
				}
			}
		}
		r.mu.Lock()
		r.all = append(r.all, got...)
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	r.url = "http://" + ln.Addr().String()
	return r
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch {
		case v.GetStringValue() != "":
			m[kv.Key] = v.GetStringValue()
		default:
			m[kv.Key] = fmt.Sprint(v.GetIntValue())
		}
	}
	return m
}

// text is everything the receiver got, as text, one span a line.
func (r *otlpReceiver) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, s := range r.all {
		fmt.Fprintf(&b, "%s %s %v %s %s\n", s.service, s.name, s.attrs, s.status, s.events)
	}
	return b.String()
}

// trace returns the spans of one trace.
func (r *otlpReceiver) trace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.all {
		if s.trace == id {
			out = append(out, s)
		}
	}
	return out
}

// env is what makes a process trace to this receiver, exporting every
// 100 ms.
func (r *otlpReceiver) env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.url, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_TRACES_SAMPLER=always_on"}
}

// checkTree reports what keeps spans from being one tree: exactly one
// span whose parent is not in the trace (the root, whose parent may be
// the application's), every other span's parent in it.
func checkTree(spans []span) error {
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.id] = true
	}
	var roots []string
	for _, s := range spans {
		if !ids[s.parent] {
			roots = append(roots, s.name+" ("+s.service+")")
		}
	}
	if len(roots) != 1 {
		return fmt.Errorf("%d roots: %v", len(roots), roots)
	}
	return nil
}

// tracedStack is a stack whose processes trace to a receiver of their own.
func tracedStack(t *testing.T) (*otlpReceiver, *stack) {
	t.Helper()
	rcv := newOTLPReceiver(t)
	st := newStack(t)
	st.env = append(st.env, rcv.env()...)
	return rcv, &st
}

// traceOf reads the trace id the store keeps with an order.
func (s stack) traceOf(t *testing.T, id string) string {
	t.Helper()
	var tid string
	if err := s.pool.QueryRow(context.Background(), `SELECT coalesce(split_part(traceparent, '-', 2), '') FROM orders WHERE order_id = $1`, id).Scan(&tid); err != nil {
		t.Fatal(err)
	}
	return tid
}

// TestEveryOrderIsOneTrace: with tracing on, each of 100 three-step orders
// (transient faults, so retries; a tenth refused at charge_payment, so
// compensations; one held past its complete_by, so a supervisor reset) is
// one tree of spans across the submitter, the schedulers, the agents, the
// supervisor and the remote service; the logs and the latency histograms
// point at the traces; sasctl shows an order's trace id.
func TestEveryOrderIsOneTrace(t *testing.T) {
	t.Parallel()
	rcv, st := tracedStack(t)
	p := newPipeline(t, pipelineOpts{on: st, schedulers: 2, agents: 2, supervisors: 1,
		faults:       `{"reserve_inventory":{"latency_min_ms":4000,"latency_max_ms":4000}}`,
		submitterEnv: []string{"SAS_STEP_TIMEOUT=2s"}})

	// One order held past its complete_by: the supervisor resets it.
	ch := amqpChannel(t)
	held := messages.NewID()
	publish(t, ch, p.submit, messages.ContentType, held, []byte(badinput.ValidSubmitJSON(held)))
	testenv.Eventually(t, time.Minute, "the supervisor to reset the held order's first step", func() bool {
		return supervisorResets(t, p, held, 1) >= 1
	})

	ids := []string{held}
	var refused []string
	for i := range 99 {
		id := messages.NewID()
		ids = append(ids, id)
		if i%10 == 0 {
			refused = append(refused, id)
		}
	}
	fail, _ := json.Marshal(refused)
	p.setFaults(t, `{"*":{"error_rate":0.2,"latency_max_ms":2},"charge_payment":{"error_rate":0.2,"fail_orders":`+string(fail)+`}}`)
	for _, id := range ids[1:] {
		publish(t, ch, p.submit, messages.ContentType, id, []byte(badinput.ValidSubmitJSON(id)))
	}
	p.waitTerminal(t, ids, 3*time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'failed'`, refused); n != len(refused) {
		t.Fatalf("%d of the %d refused orders failed (compensated)", n, len(refused))
	}

	// Every order's spans, once its three status events are in.
	isRefused := map[string]bool{}
	for _, id := range refused {
		isRefused[id] = true
	}
	traces := map[string]string{}
	for _, id := range ids {
		tid := p.traceOf(t, id)
		if len(tid) != 32 {
			t.Fatalf("order %s: the store keeps no trace id (%q)", id, tid)
		}
		traces[id] = tid
	}
	// lacks says what an order's trace lacks: one tree, a span from
	// every service, every kind of span, publishes of requests, replies
	// and its ending status event (progress events that nobody binds for
	// are not written: no test queue is bound here).
	lacks := func(id string, spans []span) []string {
		var why []string
		if err := checkTree(spans); err != nil {
			why = append(why, fmt.Sprintf("its spans are not one tree: %v", err))
		}
		services, names, kinds := map[string]bool{}, map[string]int{}, map[string]bool{}
		for _, s := range spans {
			services[s.service] = true
			names[strings.Fields(s.name)[0]]++
			if strings.HasPrefix(s.name, "publish ") {
				kinds[strings.Fields(s.name)[1]] = true
			}
		}
		for _, want := range []string{"sas-submitter", "sas-scheduler", "sas-agent", "sas-remote"} {
			if !services[want] {
				why = append(why, fmt.Sprintf("no span from %s (have %v)", want, services))
			}
		}
		for _, want := range []string{"submit", "insert", "claim", "publish", "handle", "call", "POST", "apply"} {
			if names[want] == 0 {
				why = append(why, fmt.Sprintf("no %q span (have %v)", want, names))
			}
		}
		if !kinds["request"] || !kinds["reply"] || !kinds["status_event"] {
			why = append(why, fmt.Sprintf("publishes of %v, want requests, replies and status events", kinds))
		}
		if isRefused[id] && names["claim"] < 3 {
			why = append(why, fmt.Sprintf("%d claims, want its two actions and a compensation", names["claim"]))
		}
		return why
	}
	// A span reaches the receiver when its process exports it, each
	// process on its own schedule: wait for every order's trace to have
	// what it should (checked again below, to say what is wrong if it
	// never does).
	deadline := time.Now().Add(time.Minute)
	for {
		complete := true
		for _, id := range ids {
			if len(lacks(id, rcv.trace(traces[id]))) > 0 {
				complete = false
				break
			}
		}
		if complete || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	retried, compensated := 0, 0
	for _, id := range ids {
		spans := rcv.trace(traces[id])
		for _, why := range lacks(id, spans) {
			t.Errorf("order %s: %s", id, why)
		}
		for _, s := range spans {
			if s.name == "call charge_payment" && s.attrs["sas.retry_reason"] != "" {
				retried++
			}
			if strings.HasPrefix(s.name, "claim compensation ") {
				compensated++
			}
		}
	}
	if retried == 0 || compensated < len(refused) {
		t.Errorf("%d retried calls and %d compensation claims in the traces, want some and at least %d", retried, compensated, len(refused))
	}
	heldSpans := rcv.trace(traces[held])
	reset := false
	for _, s := range heldSpans {
		if s.name == "reset step" && s.service == "sas-supervisor" {
			reset = true
		}
	}
	if !reset {
		t.Errorf("the held order's trace has no reset by the supervisor: %v", spanNames(heldSpans))
	}
	t.Logf("%d orders, %d spans; %d retried calls to charge_payment, %d compensation claims; the held order: %v",
		len(ids), len(rcv.all), retried, compensated, spanNames(heldSpans))
	instances := map[string]bool{}
	for _, id := range ids {
		for _, s := range rcv.trace(traces[id]) {
			instances[s.instance] = true
		}
	}
	if len(instances) < 7 { // submitter, 2 schedulers, 2 agents, supervisor, remote
		t.Errorf("spans from %d processes, want 7: %v", len(instances), instances)
	}

	// The logs point at the traces.
	if !strings.Contains(p.supervisors[0].logText(), `"trace_id":"`+traces[held]+`"`) {
		t.Errorf("the supervisor's log of the reset does not carry the order's trace_id")
	}
	// The latency histograms carry trace ids as exemplars (OpenMetrics).
	exemplars := 0
	for _, s := range p.schedulers {
		req, _ := http.NewRequest(http.MethodGet, "http://"+s.ops+"/metrics", nil)
		req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "sas_order_duration_seconds_bucket") && strings.Contains(line, `# {trace_id="`) {
				exemplars++
			}
		}
	}
	if exemplars == 0 {
		t.Errorf("no sas_order_duration_seconds bucket carries a trace_id exemplar")
	}
	// sasctl shows an order's trace id.
	out, _, code := sasctl(t, p.env, "orders", "show", ids[1])
	if code != 0 || !strings.Contains(out, traces[ids[1]]) {
		t.Errorf("sasctl orders show does not print the trace id %s:\n%s", traces[ids[1]], out)
	}
}

func spanNames(spans []span) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.name+"@"+s.service)
	}
	return out
}

// TestSubmitContinuesTheApplicationsTrace: a submit message's traceparent
// header makes the order's trace the application's (its span the
// parent of the submit span); without one, or with a malformed one, the
// order starts a trace of its own and is processed as usual.
func TestSubmitContinuesTheApplicationsTrace(t *testing.T) {
	t.Parallel()
	rcv, st := tracedStack(t)
	p := newPipeline(t, pipelineOpts{on: st})
	ch := amqpChannel(t)
	const appTrace, appSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	cases := []struct {
		desc    string
		headers amqp.Table
	}{
		{"valid", amqp.Table{"traceparent": "00-" + appTrace + "-" + appSpan + "-01"}},
		{"none", nil},
		{"malformed", amqp.Table{"traceparent": "00-not-a-trace-context"}},
		{"all-zero trace id", amqp.Table{"traceparent": "00-00000000000000000000000000000000-" + appSpan + "-01"}},
	}
	ids := make([]string, len(cases))
	for i, c := range cases {
		ids[i] = messages.NewID()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := ch.PublishWithContext(ctx, "", p.submit, false, false, amqp.Publishing{ContentType: messages.ContentType,
			MessageId: ids[i], Headers: c.headers, Body: []byte(badinput.ValidSubmitJSON(ids[i]))})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	p.waitTerminal(t, ids, time.Minute)
	seen := map[string]bool{}
	for i, c := range cases {
		tid := p.traceOf(t, ids[i])
		if len(tid) != 32 || seen[tid] {
			t.Fatalf("%s: trace id %q (repeated: %v)", c.desc, tid, seen[tid])
		}
		seen[tid] = true
		if (tid == appTrace) != (c.desc == "valid") {
			t.Errorf("%s: the order's trace is %s; the application's is %s", c.desc, tid, appTrace)
		}
		var submit *span
		testenv.Eventually(t, 30*time.Second, c.desc+": the submit span", func() bool {
			for _, s := range rcv.trace(tid) {
				if strings.HasPrefix(s.name, "submit ") {
					submit = &s
					return true
				}
			}
			return false
		})
		wantParent := ""
		if c.desc == "valid" {
			wantParent = appSpan
		}
		if submit.parent != wantParent {
			t.Errorf("%s: the submit span's parent is %q, want %q", c.desc, submit.parent, wantParent)
		}
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, ids); n != len(ids) {
		t.Fatalf("%d of %d orders completed", n, len(ids))
	}
}

// TestGraphOrderTraceShowsBranchesAndInstances: an order of the fulfil
// graph is one trace in which its two first branches are sibling claims
// whose calls overlap in time, the for_each step's expansion says how
// many instances it made, each parcel's instance is a claim of its own,
// named and labelled with its index, under the same root, and the review
// (its when false) is a skip.
func TestGraphOrderTraceShowsBranchesAndInstances(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "fulfil.yaml", fulfilFile)
	reg, err := workflow.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	kinds := reg.Agents()
	rcv := newOTLPReceiver(t)
	st := newStackFor(t, kinds)
	st.env = append(st.env, rcv.env()...)
	wf := "SAS_WORKFLOWS_FILE=" + file
	p := newPipeline(t, pipelineOpts{on: &st, agents: 2, schedulers: 1,
		faults:       `{"reserve_stock":{"latency_min_ms":300,"latency_max_ms":300},"charge_card":{"latency_min_ms":300,"latency_max_ms":300}}`,
		submitterEnv: []string{wf}, schedulerEnv: []string{wf},
		agentEnv: []string{wf, "SAS_AGENT_KINDS=" + strings.Join(kinds, ",")}})
	id := g0(t, p, "fulfil", `{"amount": 10, "parcels": ["p0", "p1", "p2"]}`)
	p.waitTerminal(t, []string{id}, time.Minute)
	tid := p.traceOf(t, id)

	byName := func(spans []span) map[string]span {
		m := map[string]span{}
		for _, s := range spans {
			m[s.name] = s
		}
		return m
	}
	want := []string{"claim reserve_stock", "claim charge_card", "claim book_parcel",
		"claim book_parcel[0]", "claim book_parcel[1]", "claim book_parcel[2]", "claim manual_review",
		"expand book_parcel", "skip manual_review"}
	var spans []span
	testenv.Eventually(t, 30*time.Second, "the order's spans, one tree with every claim", func() bool {
		spans = rcv.trace(tid)
		got := byName(spans)
		for _, n := range want {
			if _, ok := got[n]; !ok {
				return false
			}
		}
		return checkTree(spans) == nil && strings.Count(strings.Join(spanNames(spans), ","), "call ") >= 5
	})
	got := byName(spans)
	stock, card := got["claim reserve_stock"], got["claim charge_card"]
	if stock.parent != card.parent {
		t.Errorf("the two branches are not side by side: their claims' parents %s and %s", stock.parent, card.parent)
	}
	for i := range 3 {
		c := got[fmt.Sprintf("claim book_parcel[%d]", i)]
		if c.attrs["sas.item_index"] != fmt.Sprint(i) || c.parent != stock.parent {
			t.Errorf("instance %d: attributes %v, parent %s (the order's root %s)", i, c.attrs, c.parent, stock.parent)
		}
	}
	if n := got["expand book_parcel"].attrs["sas.instances"]; n != "3" {
		t.Errorf("the for_each step's expansion says %s instances, want 3", n)
	}
	// The branches' calls: the call span under each claim.
	children := map[string][]span{}
	for _, s := range spans {
		children[s.parent] = append(children[s.parent], s)
	}
	var callUnder func(id string) *span
	callUnder = func(id string) *span {
		for _, c := range children[id] {
			if strings.HasPrefix(c.name, "call ") {
				return &c
			}
			if found := callUnder(c.id); found != nil {
				return found
			}
		}
		return nil
	}
	a, b := callUnder(stock.id), callUnder(card.id)
	if a == nil || b == nil {
		t.Fatalf("no call under a branch's claim: %v", spanNames(spans))
	}
	if a.start >= b.end || b.start >= a.end {
		t.Errorf("the branches' calls do not overlap: %d–%d and %d–%d", a.start, a.end, b.start, b.end)
	}
}
