package statestore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Resubmit is an operator's action on an order held in error: the step in
// error (or the given step, which must be in error) goes back to pending
// with failure_count 0, and the order back to processing (or, when the
// step is a compensation, compensating). It returns the steps it reset.
// An unknown order or step gives ErrNotFound; an order or step not in
// error gives ErrInvalidState; the error's text says which.
//
// The history records the database login that did it (the session's:
// see operator_resubmit in sql/80_operators.sql) and claimed, the name the
// operator gave, as a separate label.
func (s *Store) Resubmit(ctx context.Context, orderID string, step int, claimed string) ([]int, error) {
	var reset []int32
	err := againOnLock(ctx, func() error {
		rows, err := s.pool.Query(ctx, `SELECT operator_resubmit($1, $2, $3)`, orderID, step, claimed)
		if err != nil {
			return err
		}
		reset, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("resubmit: %w", operatorError(err))
	}
	out := make([]int, len(reset))
	for i, n := range reset {
		out[i] = int(n)
	}
	return out, nil
}

// refusal is the database refusing an operator's action, in its words.
type refusal struct {
	msg  string
	kind error // ErrNotFound, ErrInvalidState or ErrInvalidData
}

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return e.kind }

// operatorError turns an operator function's refusal into an error that
// says what the function said and is ErrNotFound, ErrInvalidState or
// ErrInvalidData.
func operatorError(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case "P0002": // no_data_found
		return &refusal{pgErr.Message, ErrNotFound}
	case "55000": // object_not_in_prerequisite_state
		return &refusal{pgErr.Message, ErrInvalidState}
	case "22023": // invalid_parameter_value
		return &refusal{pgErr.Message, ErrInvalidData}
	}
	return err
}
