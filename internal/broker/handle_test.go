package broker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/tracing"
)

func TestChainRunsTheFirstOutermost(t *testing.T) {
	var ran []string
	mark := func(name string) broker.Middleware {
		return func(next broker.Handler) broker.Handler {
			return func(ctx context.Context, m broker.Message) error {
				ran = append(ran, name+" before")
				err := next(ctx, m)
				ran = append(ran, name+" after")
				return err
			}
		}
	}
	h := broker.Chain(func(context.Context, broker.Message) error { ran = append(ran, "handler"); return nil }, mark("a"), mark("b"))
	if err := h(context.Background(), broker.Message{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a before", "b before", "handler", "b after", "a after"}; !slices.Equal(ran, want) {
		t.Fatalf("ran %v, want %v", ran, want)
	}
}

func TestDecodedGivesTheHandlerADecodedMessage(t *testing.T) {
	type got struct {
		order   messages.StepReply
		refused error
	}
	run := func(m broker.Message) (got, error) {
		var g got
		h := broker.Decoded(messages.DecodeStepReply,
			func(_ context.Context, _ broker.Message, err error) error {
				g.refused = err
				return broker.RejectFor(err, messages.ReasonInvalidValue)
			},
			func(_ context.Context, _ broker.Message, rep messages.StepReply) error { g.order = rep; return nil })
		err := h(context.Background(), m)
		return g, err
	}
	good := []byte(`{"schema_version":1,"order_id":"0b8a4a52-5d7f-4a5e-9d4c-3f1c2b7d9e10","step":1,"attempt":1,"outcome":"ok"}`)

	t.Run("a good reply reaches the handler decoded", func(t *testing.T) {
		g, err := run(broker.Message{ContentType: messages.ContentType, Body: good})
		if err != nil || g.refused != nil || g.order.OrderID != "0b8a4a52-5d7f-4a5e-9d4c-3f1c2b7d9e10" || g.order.Outcome != "ok" {
			t.Fatalf("verdict %v, refused %v, decoded %+v", err, g.refused, g.order)
		}
	})
	for _, c := range []struct {
		name        string
		contentType string
		body        []byte
	}{
		{"another content type", "text/plain", good},
		{"a body that is not JSON", messages.ContentType, []byte(`{"schema_version":1,`)},
		{"a field of the wrong type", messages.ContentType, []byte(`{"schema_version":1,"order_id":"x","step":"one"}`)},
	} {
		t.Run(c.name+" is refused, never handled", func(t *testing.T) {
			g, err := run(broker.Message{ContentType: c.contentType, Body: c.body})
			var rej *broker.Rejection
			if g.refused == nil || !errors.As(err, &rej) || g.order.OrderID != "" {
				t.Fatalf("verdict %v, refused %v, decoded %+v", err, g.refused, g.order)
			}
		})
	}
}

func TestRecoverMakesAPanicADeadLetter(t *testing.T) {
	panics := 0
	h := broker.Chain(func(context.Context, broker.Message) error { panic("poison") },
		broker.Recover(slog.New(slog.NewTextHandler(io.Discard, nil)), "q", func() { panics++ }))
	err := h(context.Background(), broker.Message{ID: "m1"})
	var rej *broker.Rejection
	if !errors.As(err, &rej) || rej.Reason != broker.ReasonHandlerPanic || panics != 1 {
		t.Fatalf("verdict %v, %d panics counted", err, panics)
	}
	// A handler that returns normally is left alone.
	ok := broker.Chain(func(context.Context, broker.Message) error { return nil }, broker.Recover(slog.New(slog.NewTextHandler(io.Discard, nil)), "q", func() { panics++ }))
	if err := ok(context.Background(), broker.Message{}); err != nil || panics != 1 {
		t.Fatalf("verdict %v, %d panics counted", err, panics)
	}
}

func TestRemoteParentCarriesTheMessagesTrace(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled, Remote: true})
	delivery := trace.ContextWithRemoteSpanContext(context.Background(), sc)
	type key struct{}
	base := context.WithValue(context.Background(), key{}, "work")
	got := tracing.RemoteParent(base, delivery)
	if trace.SpanContextFromContext(got).TraceID() != sc.TraceID() || got.Value(key{}) != "work" {
		t.Fatalf("the handler's context lost the trace or its base: %v", trace.SpanContextFromContext(got))
	}
	if got := tracing.RemoteParent(base, context.Background()); got != base {
		t.Fatal("a message without a trace changed the base context")
	}
	// Off, Traced hands the delivery's context over as it is.
	var seen context.Context
	ctx := context.WithValue(context.Background(), key{}, "delivery")
	h := broker.Chain(func(c context.Context, _ broker.Message) error { seen = c; return nil }, broker.Traced(tracing.Off()))
	if err := h(ctx, broker.Message{Headers: map[string]any{"traceparent": "00-0102030000000000000000000000000-0405000000000000-01"}}); err != nil || seen != ctx {
		t.Fatalf("tracing off changed the context: %v", err)
	}
}
