package tracing

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// redacting is the exporter every span leaves through: a span's name,
// status text, string attributes and events pass redact first, so that
// nothing secret is exported whatever put it in a span (a service's
// error text, a driver's error).
type redacting struct {
	next   sdktrace.SpanExporter
	redact func(string) string
}

func (e redacting) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = e.span(s)
	}
	return e.next.ExportSpans(ctx, out)
}

func (e redacting) Shutdown(ctx context.Context) error { return e.next.Shutdown(ctx) }

// span is s redacted, or s itself when it holds nothing to hide.
func (e redacting) span(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	stub := tracetest.SpanStubFromReadOnlySpan(s)
	changed := false
	text := func(v string) string {
		r := e.redact(v)
		changed = changed || r != v
		return r
	}
	stub.Name = text(stub.Name)
	stub.Status.Description = text(stub.Status.Description)
	stub.Attributes = e.attrs(stub.Attributes, text)
	for i := range stub.Events {
		stub.Events[i].Name = text(stub.Events[i].Name)
		stub.Events[i].Attributes = e.attrs(stub.Events[i].Attributes, text)
	}
	if !changed {
		return s
	}
	return stub.Snapshot()
}

func (e redacting) attrs(kvs []attribute.KeyValue, text func(string) string) []attribute.KeyValue {
	out := kvs
	for i, kv := range kvs {
		if kv.Value.Type() != attribute.STRING {
			continue
		}
		if v := text(kv.Value.AsString()); v != kv.Value.AsString() {
			if &out[0] == &kvs[0] {
				out = append([]attribute.KeyValue(nil), kvs...)
			}
			out[i] = attribute.String(string(kv.Key), v)
		}
	}
	return out
}
