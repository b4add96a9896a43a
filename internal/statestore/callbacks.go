package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// ApplyCallback applies a step's completion or failure its service
// posted later, by the step's token (r names the token's attempt), as
// the attempt's reply, fenced as one. The callback is recorded among the
// order's signals under signalID in the same transaction: the same id
// again is a duplicate (true) that changes nothing. A callback of an
// attempt that is not the step's running one changes nothing and is a
// *StaleReplyError.
func (s *Store) ApplyCallback(ctx context.Context, signalID, name string, r Reply) (ApplyResult, bool, error) {
	var res ApplyResult
	duplicate := false
	var result *string
	if r.Result != nil {
		v := string(r.Result)
		result = &v
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO signals (order_id, signal_id, name, payload, actor, step)
			VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`, r.OrderID, signalID, name, result, r.Actor, r.Step)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			duplicate = true
			return nil
		}
		var applied bool
		res, applied, err = scanApplied(tx.QueryRow(ctx, applyReplySQL, r.args()...))
		if err != nil {
			return err
		}
		if !applied {
			return errNotApplied
		}
		return nil
	})
	switch {
	case errors.Is(err, errNotApplied):
		return ApplyResult{}, false, s.staleReason(ctx, r)
	case err != nil:
		return ApplyResult{}, false, fmt.Errorf("callback for order %s step %d: %w", r.OrderID, r.Step, classify(err))
	}
	return res, duplicate, nil
}

// errNotApplied rolls back a callback whose attempt no longer runs.
var errNotApplied = errors.New("not applied")
