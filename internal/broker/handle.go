package broker

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/failpoint"
	"sas/internal/messages"
)

// Message is one delivery as a handler sees it: what the message says,
// without the AMQP client's delivery type (acks are the consumer's).
type Message struct {
	ID            string // the publisher's message id
	CorrelationID string
	ContentType   string
	// UserID is the message's user-id property: RabbitMQ refuses one
	// that is not the publisher's own login, so it names who sent it.
	// Via is the exchange it was published to ("": the default one). A
	// copy sas made of a message (a classic queue's counted redelivery,
	// a requeued dead letter) has its original's.
	UserID  string
	Via     string
	Headers map[string]any
	Body    []byte
}

// Handler handles one message. Its result is the verdict on it:
//
//   - nil: the delivery is acked.
//   - a panic: recovered (Recover); the delivery is dead-lettered with
//     reason handler_panic (ReasonHandlerPanic), the stack logged once,
//     and the consumer goes on with the next one.
//   - an error made by Reject: the delivery is republished to the input's
//     dead-letter queue with the reason, then acked. If that republish
//     fails, the delivery is requeued instead, so it is never lost.
//   - any other error: the delivery is requeued (nack with requeue). The
//     queue's delivery limit dead-letters a message requeued too often.
//
// A handler is called from several goroutines at once.
type Handler func(ctx context.Context, m Message) error

// Middleware wraps a handler with a concern every message shares
// (recovery, failpoints, tracing, decoding, a rate limit): it may act
// before and after the handler, or give a verdict without calling it.
type Middleware func(Handler) Handler

// Chain wraps h in mws, the first the outermost: Chain(h, a, b) runs a,
// then b, then h.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Recover turns a handler's panic into a dead-letter verdict
// (ReasonHandlerPanic), logged with its stack and counted by onPanic: one
// poison message must not take the process, and everything in flight
// with it, down (and again at every redelivery). Every consumer's chain
// begins with it.
func Recover(logger *slog.Logger, queue string, onPanic func()) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m Message) (err error) {
			defer func() {
				if v := recover(); v != nil {
					onPanic()
					logger.Error("handler panicked; dead-lettering the message and going on", "queue", queue,
						"message_id", m.ID, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
					err = Reject(ReasonHandlerPanic, fmt.Sprintf("the handler panicked: %v", v))
				}
			}()
			return next(ctx, m)
		}
	}
}

// Failpoints lets the fault suite make a handler panic on a chosen
// message (the failpoint panic-on-message, with the message id as its
// argument); without -tags failpoints it is a no-op.
func Failpoints() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m Message) error {
			failpoint.Panic("panic-on-message", m.ID)
			return next(ctx, m)
		}
	}
}

// Propagator reads the trace context a message's headers carry;
// *tracing.Tracing is one. (An interface, so that the broker, and the
// client built on it, do not depend on the tracing SDK.)
type Propagator interface {
	On() bool
	ExtractAMQP(ctx context.Context, headers amqp.Table) context.Context
}

// Traced puts the span context a message's headers carry (traceparent,
// tracestate) into the handler's context, where tracing.RemoteParent
// finds it: the handler's span joins the trace of whoever published the
// message. With tracing off it does nothing.
func Traced(tr Propagator) Middleware {
	return func(next Handler) Handler {
		if !tr.On() {
			return next
		}
		return func(ctx context.Context, m Message) error {
			return next(tr.ExtractAMQP(ctx, m.Headers), m)
		}
	}
}

// Refused decides the verdict on a message that could not be read (its
// content type, or its body): usually a Rejection (RejectFor), after
// telling whoever should hear of it.
type Refused func(ctx context.Context, m Message, err error) error

// Decoded adapts a handler of decoded messages: the message's content
// type is checked (messages.CheckContentType) and its body decoded with
// decode; a message that fails either is refused instead (refused gives
// the verdict) and never reaches h.
func Decoded[T any](decode func([]byte) (T, error), refused Refused, h func(ctx context.Context, m Message, v T) error) Handler {
	return func(ctx context.Context, m Message) error {
		if err := messages.CheckContentType(m.ContentType); err != nil {
			return refused(ctx, m, err)
		}
		v, err := decode(m.Body)
		if err != nil {
			return refused(ctx, m, err)
		}
		return h(ctx, m, v)
	}
}
