package tracing

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestSpansLeaveRedacted: what a span says (its name, status text, string
// attributes, events) passes the redactor before it is exported; a span
// with nothing to hide goes as it is.
func TestSpansLeaveRedacted(t *testing.T) {
	t.Parallel()
	mem := tracetest.NewInMemoryExporter()
	redact := func(s string) string { return strings.ReplaceAll(s, "hunter2", "xxxxx") }
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(redacting{next: mem, redact: redact}))
	defer tp.Shutdown(context.Background())
	tr := tp.Tracer("t")
	_, s := tr.Start(context.Background(), "call hunter2")
	s.SetAttributes(attribute.String("sas.answer", "401: key hunter2 refused"), attribute.Int("n", 1))
	s.AddEvent("retry", trace.WithAttributes(attribute.String("error", "hunter2 again")))
	s.SetStatus(codes.Error, "answered 403: your key hunter2")
	s.End()
	_, clean := tr.Start(context.Background(), "clean")
	clean.SetStatus(codes.Error, "refused")
	clean.End()
	got := mem.GetSpans()
	if len(got) != 2 {
		t.Fatalf("%d spans exported", len(got))
	}
	for _, sp := range got {
		all := sp.Name + " " + sp.Status.Description
		for _, a := range sp.Attributes {
			all += " " + a.Value.String()
		}
		for _, e := range sp.Events {
			all += " " + e.Name
			for _, a := range e.Attributes {
				all += " " + a.Value.String()
			}
		}
		if strings.Contains(all, "hunter2") {
			t.Errorf("exported: %s", all)
		}
	}
	if got[0].Status.Description != "answered 403: your key xxxxx" || got[1].Status.Description != "refused" {
		t.Fatalf("status texts %q, %q", got[0].Status.Description, got[1].Status.Description)
	}
}
