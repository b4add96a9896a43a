package service

import (
	"context"
	"log/slog"
	"time"

	"sas/internal/broker"
	"sas/internal/messages"
)

// Teller tells a refused message's reply_to queue of its refusal
// (statestore.Store's TellRejected: the status event goes out through the
// outbox).
type Teller interface {
	TellRejected(ctx context.Context, orderID, replyTo, correlationID string, body []byte) error
}

// Refuse dead-letters a message an entrance refused (a submit, a signal)
// and, if it named a reply_to, tells that queue with a status event
// "rejected" carrying the reason, the detail and the message's
// correlation id, through the outbox (a scheduler's relay sends it to
// reply_to alone). The detail is bounded here, where it is made, so that
// the event always fits. Telling is best effort: the dead letter is the
// record. told reports a told refusal (to wake a relay).
func Refuse(ctx context.Context, store Teller, logger *slog.Logger, orderID, replyTo, corr, reason, detail string,
	told func()) error {
	detail = messages.BoundText(detail, messages.MaxReasonBytes)
	if replyTo != "" {
		ev := messages.StatusEvent{SchemaVersion: messages.SchemaVersion, OrderID: orderID, Status: messages.StatusRejected,
			At: time.Now().UTC(), Reason: reason, Detail: detail}
		body, err := messages.Encode(ev)
		if err == nil {
			err = store.TellRejected(ctx, orderID, replyTo, corr, body)
		}
		switch {
		case err != nil:
			logger.Warn("could not tell reply_to of a refusal", "order_id", orderID, "reply_to", replyTo, "reason", reason, "err", err)
		case told != nil:
			told()
		}
	}
	return broker.Reject(reason, detail)
}
