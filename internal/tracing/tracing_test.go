package tracing

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"
)

func TestEnabledFollowsTheStandardVariables(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		on      bool
		wantErr string
	}{
		{env: nil, on: false},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, on: true},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"}, on: false},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"}, on: false},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTLP only"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, wantErr: "http/protobuf"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
			"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true},
	} {
		on, err := Enabled(func(k string) string { return tc.env[k] })
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%v: error %v, want one saying %q", tc.env, err, tc.wantErr)
			}
			continue
		}
		if err != nil || on != tc.on {
			t.Errorf("%v: on %v (%v), want %v", tc.env, on, err, tc.on)
		}
	}
}

// on is a Tracing that propagates, with a tracer that records nothing: the
// propagation is what these tests look at.
func on() *Tracing {
	tr := Off()
	tr.on = true
	return tr
}

func TestTraceContextCrossesAMQPAndHTTPAndTheStore(t *testing.T) {
	tr := on()
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := tr.Resume(context.Background(), parent)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("resumed span context %v", sc)
	}
	h := tr.InjectAMQP(ctx, nil)
	if h["traceparent"] != parent {
		t.Fatalf("AMQP headers %v", h)
	}
	back := trace.SpanContextFromContext(tr.ExtractAMQP(context.Background(), h))
	if back.TraceID() != sc.TraceID() || back.SpanID() != sc.SpanID() || !back.IsRemote() {
		t.Fatalf("extracted %v, want %v", back, sc)
	}
	hh := http.Header{}
	tr.InjectHTTP(ctx, hh)
	if got := trace.SpanContextFromContext(tr.ExtractHTTP(context.Background(), hh)); got.TraceID() != sc.TraceID() {
		t.Fatalf("through HTTP: %v", got)
	}
	if tp := tr.Traceparent(ctx); tp != parent {
		t.Fatalf("stored traceparent %q, want %q", tp, parent)
	}
	if id := TraceID(parent); id != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("TraceID %q", id)
	}
	if attrs := LogAttrs(ctx); len(attrs) != 4 || attrs[1] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("log attributes %v", attrs)
	}
}

func TestBadTraceContextStartsANewTrace(t *testing.T) {
	tr := on()
	for _, bad := range []amqp.Table{
		nil,
		{},
		{"traceparent": "00-not-a-trace-context"},
		{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
		{"traceparent": 42},
		{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	} {
		if sc := trace.SpanContextFromContext(tr.ExtractAMQP(context.Background(), bad)); sc.IsValid() {
			t.Errorf("headers %v gave the span context %v", bad, sc)
		}
	}
	for _, bad := range []string{"", "x", "00-zz-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if id := TraceID(bad); id != "" {
			t.Errorf("TraceID(%q) = %q", bad, id)
		}
		if sc := trace.SpanContextFromContext(tr.Resume(context.Background(), bad)); sc.IsValid() {
			t.Errorf("Resume(%q) gave %v", bad, sc)
		}
	}
}

func TestOffWritesNothing(t *testing.T) {
	tr := Off()
	ctx := on().Resume(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if h := tr.InjectAMQP(ctx, nil); h != nil {
		t.Fatalf("off, InjectAMQP wrote %v", h)
	}
	if tp := tr.Traceparent(ctx); tp != "" {
		t.Fatalf("off, Traceparent %q", tp)
	}
	hh := http.Header{}
	tr.InjectHTTP(ctx, hh)
	if len(hh) != 0 {
		t.Fatalf("off, InjectHTTP wrote %v", hh)
	}
	if sc := trace.SpanContextFromContext(tr.ExtractAMQP(context.Background(),
		amqp.Table{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})); sc.IsValid() {
		t.Fatalf("off, ExtractAMQP read %v", sc)
	}
}

func TestObserveCarriesTheTraceAsExemplar(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_seconds", Help: "x", Buckets: []float64{1}})
	ctx := on().Resume(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	Observe(ctx, h, 0.5)
	Observe(context.Background(), h, 2)
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	ex := m.GetHistogram().GetBucket()[0].GetExemplar()
	if m.GetHistogram().GetSampleCount() != 2 || ex == nil || ex.GetLabel()[0].GetValue() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("histogram %v", m.GetHistogram())
	}
}
