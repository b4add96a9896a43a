// Package statestore is the pattern's state store: the orders, their step
// state rows, the transition history and the outbox in PostgreSQL. It is the
// only package that holds SQL.
//
// Every lease and deadline comparison is made with the database clock
// (now()), never a process clock, so that replicas on machines whose clocks
// drift still agree on who owns a step.
package statestore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Errors callers branch on. Wrapped errors keep these as their cause.
var (
	// ErrNotFound: no order (or step) with that id.
	ErrNotFound = errors.New("not found")
	// ErrConflict: an order with the same id but a different payload exists.
	ErrConflict = errors.New("order id already used with a different payload")
	// ErrStale: a reply for an attempt that no longer owns its step, or that
	// arrived after the step's complete_by. Nothing was changed.
	ErrStale = errors.New("stale reply")
	// ErrInvalidState: the action makes no sense in the current state.
	ErrInvalidState = errors.New("invalid state for this action")
	// ErrInvalidData: the database refused the values (a constraint or
	// data error); retrying the same values cannot succeed.
	ErrInvalidData = errors.New("values refused by the database")
)

// classify wraps a database error that retrying cannot fix in
// ErrInvalidData; other errors (connection loss, timeouts) are returned as
// they are, for the caller to retry.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
		return fmt.Errorf("%w: %s (SQLSTATE %s)", ErrInvalidData, pgErr.Message, pgErr.Code)
	}
	return err
}

// Order statuses. The submitter creates an order as received; a scheduler
// moves it to processing when it claims its first step and to completed or
// error when a reply ends it; the supervisor moves it to error when a step
// reaches its failure threshold; an operator's resubmit moves it from error
// back to processing. compensating and failed belong to compensation.
const (
	OrderReceived     = "received"
	OrderProcessing   = "processing"
	OrderCompleted    = "completed"
	OrderCompensating = "compensating"
	OrderFailed       = "failed"
	OrderError        = "error"
)

// Step process states (the pattern's words).
//
//   - waiting: created by the submitter behind an earlier step; made pending
//     by the scheduler when the step before it is processed.
//   - pending: ready to run once available_at has passed; claimed by a
//     scheduler, or put back here by the supervisor or an operator.
//   - processing: claimed (locked_by, complete_by and attempt set); left by
//     a fenced reply (processed or error) or by the supervisor's sweep once
//     complete_by has passed.
//   - processed: the agent replied ok in time. Terminal.
//   - error: the agent replied failed, or the supervisor found the step had
//     reached its failure threshold. Left only by an operator's resubmit.
//   - cancelled: the order ended before the step ran. Terminal.
const (
	StepWaiting    = "waiting"
	StepPending    = "pending"
	StepProcessing = "processing"
	StepProcessed  = "processed"
	StepError      = "error"
	StepCancelled  = "cancelled"
)

// Store is the state store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a store over an open pool. The caller closes the pool.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool}
}

// Connect opens a connection pool to url and checks it answers.
// maxConns <= 0 keeps pgx's default.
func Connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	cfg.MaxConnIdleTime = time.Minute
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", err)
	}
	return pool, nil
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.pool.Ping(ctx)
}
