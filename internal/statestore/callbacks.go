package statestore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"sas/internal/failpoint"
)

// StepTokenKey reads the key of the steps' tokens (steptoken), made at
// random by the migration that made its table.
func (s *Store) StepTokenKey(ctx context.Context) (string, error) {
	var key string
	if err := s.pool.QueryRow(ctx, `SELECT key FROM step_token_key WHERE id = 1`).Scan(&key); err != nil {
		return "", fmt.Errorf("read the step token key: %w", classify(err))
	}
	return key, nil
}

// Hold is an attempt its service holds open: it answered the call 202
// Accepted (Answer, what it said) or sent a heartbeat (Answer "").
type Hold struct {
	OrderID string
	Step    int
	Attempt int
	// For is how long from now the attempt is held; 0: the step's
	// timeout. Never past the attempt's claim plus the step's
	// max_duration.
	For    time.Duration
	Answer string
	Actor  string
}

// HoldStep pushes the complete_by of an attempt its service holds open
// (the step_hold function), fenced as a reply is. It returns the new
// complete_by; a hold of an attempt that is not the step's running one
// changes nothing and is a *StaleReplyError.
func (s *Store) HoldStep(ctx context.Context, h Hold) (time.Time, error) {
	var applied bool
	var completeBy *time.Time
	err := s.pool.QueryRow(ctx, `SELECT applied, complete_by FROM step_hold($1, $2, $3, $4, $5, $6)`,
		h.OrderID, h.Step, h.Attempt, h.For.Milliseconds(), h.Answer, h.Actor).Scan(&applied, &completeBy)
	if err != nil {
		return time.Time{}, fmt.Errorf("hold order %s step %d: %w", h.OrderID, h.Step, classify(err))
	}
	if !applied || completeBy == nil {
		return time.Time{}, s.staleReason(ctx, Reply{OrderID: h.OrderID, Step: h.Step, Attempt: h.Attempt})
	}
	return *completeBy, nil
}

// The outcomes of a callback (Callback), besides SignalApplied and
// SignalDuplicate.
const (
	// CallbackInvalidToken: the token is not one this store's key made.
	CallbackInvalidToken = "invalid_token"
	// CallbackStaleToken: the token's attempt is not the step's running
	// one (a later attempt runs, the step ended, or its time ran out):
	// nothing changed.
	CallbackStaleToken = "stale_token"
)

// Callback is a step's callback as any entrance received it: the service
// of a step that answered its call 202 Accepted completes it ("complete",
// Result a JSON object or nothing), fails it ("fail", Error) or holds it
// open ("heartbeat"), presenting the step's token.
type Callback struct {
	Token string
	Name  string
	// SignalID keys a complete or fail among the order's signals ("":
	// callback:STEP.ATTEMPT:NAME, so the same callback again is a
	// duplicate).
	SignalID string
	Result   json.RawMessage
	Error    string
	Actor    string
	// Notify wakes the schedulers and the relay: the entrance is not a
	// scheduler, which wakes its own.
	Notify bool
}

// CallbackOutcome is what became of a callback.
type CallbackOutcome struct {
	// Outcome is SignalApplied, SignalDuplicate, CallbackInvalidToken or
	// CallbackStaleToken; nothing changed unless it is SignalApplied.
	Outcome string
	// OrderID, Step and Attempt are what the token names (empty for an
	// invalid token).
	OrderID string
	Step    int
	Attempt int
	// CompleteBy is, for an applied heartbeat, the attempt's new
	// complete_by.
	CompleteBy time.Time
	// OrderStatus is the order's status when the callback moved it.
	OrderStatus string
	// Detail says why, for any outcome but SignalApplied.
	Detail string
}

// Callback applies a step's callback through the store's one door for
// them (the step_callback function, sql/30_replies.sql), from whichever
// entrance it came: the token is read with the key only the store's
// owner and the schedulers read; a complete or fail is recorded among the
// order's signals and applied as the attempt's reply, fenced as one, in
// one transaction; a heartbeat holds the attempt open as a 202 does.
func (s *Store) Callback(ctx context.Context, c Callback) (CallbackOutcome, error) {
	var out CallbackOutcome
	var orderID *string
	var step, attempt *int
	var completeBy *time.Time
	var result *string
	if len(c.Result) > 0 {
		v := string(c.Result)
		result = &v
	}
	// The fault suite's negative control turns the fence off.
	fenced := !failpoint.Broken("unfenced-replies")
	err := againOnLock(ctx, func() error {
		return s.pool.QueryRow(ctx, `SELECT outcome, order_id::text, step, attempt, complete_by, order_status, detail
FROM step_callback($1, $2, $3, $4, $5, $6, $7, $8)`, c.Token, c.Name, c.SignalID, result, c.Error, c.Actor, fenced, c.Notify).
			Scan(&out.Outcome, &orderID, &step, &attempt, &completeBy, &out.OrderStatus, &out.Detail)
	})
	if err != nil {
		return CallbackOutcome{}, fmt.Errorf("callback %s: %w", c.Name, classify(err))
	}
	if orderID != nil {
		out.OrderID = *orderID
	}
	if step != nil && attempt != nil {
		out.Step, out.Attempt = *step, *attempt
	}
	if completeBy != nil {
		out.CompleteBy = *completeBy
	}
	return out, nil
}
