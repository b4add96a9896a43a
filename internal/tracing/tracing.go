// Package tracing gives every sas process OpenTelemetry traces: one trace
// per order, carried across processes in W3C trace context (AMQP headers,
// HTTP headers, and the order's row, so that a step claimed later, by
// another replica or after a restart, still joins its order's trace).
//
// Tracing is off unless the standard OpenTelemetry variables ask for it
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT set,
// OTEL_SDK_DISABLED not true, OTEL_TRACES_EXPORTER unset or otlp). Off, a
// Tracing starts spans that record nothing and writes no header: nothing
// changes for a user who does not want traces. On, spans go over OTLP/HTTP
// (protobuf) in batches; the exporter, the batching and the sampler read
// the standard variables (OTEL_EXPORTER_OTLP_*, OTEL_BSP_*,
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES).
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing is one process's tracer and propagator. The zero value is not
// usable; Off returns one that records nothing.
type Tracing struct {
	tracer   trace.Tracer
	prop     propagation.TraceContext
	on       bool
	shutdown func(context.Context) error
}

// Enabled reports whether the environment (getenv) asks for traces, and
// an error for a setting this build cannot honour.
func Enabled(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false, nil
	}
	switch exp := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))); exp {
	case "none":
		return false, nil
	case "", "otlp":
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER %q: sas exports traces over OTLP only (otlp or none)", exp)
	}
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return false, nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := strings.TrimSpace(getenv(k)); p != "" {
			if p != "http/protobuf" {
				return false, fmt.Errorf("%s %q: sas sends OTLP over HTTP only (http/protobuf)", k, p)
			}
			break
		}
	}
	return true, nil
}

// Off returns a Tracing that records nothing and propagates nothing.
func Off() *Tracing {
	return &Tracing{tracer: noop.NewTracerProvider().Tracer("sas"), shutdown: func(context.Context) error { return nil }}
}

// Setup returns the process's Tracing: Off when the environment does not
// ask for traces, otherwise one exporting the spans of service (the
// resource's service.name unless OTEL_SERVICE_NAME says otherwise) and
// instance (service.instance.id), each span's texts through redact first
// (nil: as they are).
func Setup(ctx context.Context, service, instance string, redact func(string) string) (*Tracing, error) {
	on, err := Enabled(os.Getenv)
	if err != nil || !on {
		return Off(), err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service), attribute.String("service.namespace", "sas"),
			attribute.String("service.instance.id", instance)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("trace resource: %w", err)
	}
	var out sdktrace.SpanExporter = exp
	if redact != nil {
		out = redacting{next: exp, redact: redact}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(out), sdktrace.WithResource(res))
	return &Tracing{tracer: tp.Tracer("sas"), on: true, shutdown: tp.Shutdown}, nil
}

// On reports whether spans are recorded and exported.
func (t *Tracing) On() bool { return t.on }

// Shutdown exports the spans still held and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error { return t.shutdown(ctx) }

// Start starts a span, a child of the span in ctx if there is one.
func (t *Tracing) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, name, opts...)
}

// Headers is an AMQP header table as a carrier of trace context.
type Headers amqp.Table

// Get returns the header's value if it is a string.
func (h Headers) Get(key string) string {
	v, _ := h[key].(string)
	return v
}

// Set sets a header.
func (h Headers) Set(key, value string) { h[key] = value }

// Keys lists the headers.
func (h Headers) Keys() []string {
	out := make([]string, 0, len(h))
	for k := range h {
		out = append(out, k)
	}
	return out
}

// InjectAMQP writes ctx's span context into a message's headers
// (traceparent, tracestate), creating the table if need be; it returns
// headers unchanged when tracing is off or ctx carries no span.
func (t *Tracing) InjectAMQP(ctx context.Context, headers amqp.Table) amqp.Table {
	if !t.on || !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	if headers == nil {
		headers = amqp.Table{}
	}
	t.prop.Inject(ctx, Headers(headers))
	return headers
}

// ExtractAMQP returns ctx with the remote span context a message's
// headers carry. A missing or malformed traceparent is ignored: the
// spans started from the result begin a new trace.
func (t *Tracing) ExtractAMQP(ctx context.Context, headers amqp.Table) context.Context {
	if !t.on || headers == nil {
		return ctx
	}
	return t.prop.Extract(ctx, Headers(headers))
}

// RemoteParent returns base with the span context from carries (none:
// base as it is), for a handler whose work runs under a context of its
// own rather than the delivery's (broker.Traced put the message's there).
func RemoteParent(base, from context.Context) context.Context {
	sc := trace.SpanContextFromContext(from)
	if !sc.IsValid() {
		return base
	}
	return trace.ContextWithRemoteSpanContext(base, sc)
}

// InjectHTTP writes ctx's span context into an HTTP request's headers.
func (t *Tracing) InjectHTTP(ctx context.Context, h http.Header) {
	if t.on {
		t.prop.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// ExtractHTTP returns ctx with the span context an HTTP request carries.
func (t *Tracing) ExtractHTTP(ctx context.Context, h http.Header) context.Context {
	if !t.on {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.HeaderCarrier(h))
}

// Traceparent is ctx's span context as a W3C traceparent, what the store
// keeps with an order; "" when tracing is off or there is no span.
func (t *Tracing) Traceparent(ctx context.Context) string {
	if !t.on || !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c)
	return c.Get("traceparent")
}

// Resume returns ctx with the stored traceparent of an order as its
// remote parent; a malformed or empty one is ignored.
func (t *Tracing) Resume(ctx context.Context, traceparent string) context.Context {
	if !t.on || traceparent == "" {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier{"traceparent": traceparent})
}

// TraceID is the trace id of a stored traceparent
// (version-traceid-parentid-flags), "" when it is not one.
func TraceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	id, err := trace.TraceIDFromHex(parts[1])
	if err != nil {
		return ""
	}
	return id.String()
}

// StepAttrs are the span attributes that name an order's step and
// attempt, with more after them.
func StepAttrs(orderID string, step, attempt int, more ...attribute.KeyValue) []attribute.KeyValue {
	return append([]attribute.KeyValue{attribute.String("sas.order_id", orderID), attribute.Int("sas.step", step),
		attribute.Int("sas.attempt", attempt)}, more...)
}

// LogAttrs are the attributes that tie a log line to ctx's trace:
// trace_id and span_id, or none when ctx has no span.
func LogAttrs(ctx context.Context) []any {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []any{"trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String()}
}

// Observe records v in o with the trace id of ctx's span as its exemplar
// when the span is sampled, so that a latency bucket points at a trace.
func Observe(ctx context.Context, o prometheus.Observer, v float64) {
	sc := trace.SpanContextFromContext(ctx)
	if eo, ok := o.(prometheus.ExemplarObserver); ok && sc.IsSampled() {
		eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
		return
	}
	o.Observe(v)
}
