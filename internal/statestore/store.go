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
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/secrets"
	"sas/internal/workflow"
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
//
// What it says is for whoever sent the values: a refusal the store's own
// functions raise keeps their words; any other (a constraint, a type's
// range) says what kind of value was refused, never the database's text
// (a constraint's or a column's name), which InvalidDataError keeps for
// the log. Every value from outside is checked by a rule in Go before it
// comes here, at every entrance: this is the last line.
func classify(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
		return &InvalidDataError{PG: pgErr}
	}
	return err
}

// InvalidDataError is a value the database refused (ErrInvalidData).
type InvalidDataError struct {
	PG *pgconn.PgError
}

func (e *InvalidDataError) Error() string {
	if e.PG.Routine == "exec_stmt_raise" {
		return ErrInvalidData.Error() + ": " + e.PG.Message // the store's functions' own words
	}
	return ErrInvalidData.Error() + ": " + refusedValue(e.PG.Code)
}

// Is makes errors.Is(err, ErrInvalidData) hold.
func (e *InvalidDataError) Is(target error) bool { return target == ErrInvalidData }

// Internal says what the database said, for a log line.
func (e *InvalidDataError) Internal() string {
	return fmt.Sprintf("%s (SQLSTATE %s, constraint %q)", e.PG.Message, e.PG.Code, e.PG.ConstraintName)
}

// refusedValue says, by SQLSTATE, what kind of value a database refused.
func refusedValue(code string) string {
	switch code {
	case "22001":
		return "a text is longer than the state store keeps"
	case "22003":
		return "a number is out of range"
	case "22007", "22008":
		return "a date or time is out of range"
	case "22021", "22P05":
		return "a text holds a NUL or a character that is not UTF-8"
	case "22P02":
		return "a value is not of its type"
	case "23505":
		return "it exists already"
	case "23503":
		return "it names something that does not exist"
	case "23502":
		return "a value is missing"
	}
	return "a value is outside what the state store keeps"
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
//   - skipped: in a graph, the step's when was false: it did nothing, is
//     not undone, and counts as ended for the steps that need it. Terminal.
//   - expanded: in a graph, a for_each step whose instances (steps of
//     their own) run; processed when they all are.
//   - delayed: in a graph, a step with a delay whose needs ended: it
//     becomes pending at due_at, on the database clock (FireTimers).
//   - awaiting: in a graph, a wait step that awaits its signal
//     (ApplySignal) until due_at, its timeout.
const (
	StepWaiting    = "waiting"
	StepPending    = "pending"
	StepProcessing = "processing"
	StepProcessed  = "processed"
	StepError      = "error"
	StepCancelled  = "cancelled"
	StepSkipped    = "skipped"
	StepExpanded   = "expanded"
	StepDelayed    = "delayed"
	StepAwaiting   = "awaiting"
)

// Store is the state store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// traces: the relay reads each message's order's traceparent.
	traces bool
	// schemas are the waits' schemas, compiled once each: a signal's
	// payload is checked against its wait's.
	schemas *workflow.Schemas
	// fence, in a partition's store, keeps out the orders of buckets it
	// does not own (FenceAs).
	fence *fence
}

// New returns a store over an open pool. The caller closes the pool.
func New(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, schemas: workflow.NewSchemas(256)}
}

// TraceOrders makes the relay read each message's order's traceparent
// (OutboxMessage.Traceparent), for a process that traces. Call it before
// the store is used.
func (s *Store) TraceOrders() { s.traces = true }

// Options shape a connection pool.
type Options struct {
	// URL is a PostgreSQL URL or keyword/value connection string.
	URL string
	// Password, when set, replaces the URL's password, so that it may hold
	// any character without being percent-encoded.
	Password string
	// MaxConns caps the pool; <= 0 keeps pgx's default.
	MaxConns int32
	// LockTimeout, when set, is PostgreSQL's lock_timeout on every
	// connection: a statement that would wait longer for a row another
	// transaction holds fails instead (SQLSTATE 55P03; IsLockTimeout), so
	// no transaction of the pool stays open behind a stuck one, and its
	// now() stays close to the time of its writes.
	LockTimeout time.Duration
	// Keyed, for a service whose statements all find their rows by key or
	// by an index (the submitter, the schedulers, the supervisor), turns
	// sequential scans off on every connection: a statement's plan is made
	// once and kept (pgx prepares it; PostgreSQL then keeps a generic
	// plan), and one made while a table was small and had no statistics
	// (a new schema; autovacuum off, or not yet run) scanned the steps
	// table for each reply of a batch, and the received orders for each
	// claim, long after the table had grown: the claim's slow mode.
	Keyed bool
}

// Open returns a pool as o says without connecting: the first statement
// (or Ping) connects. It fails only on a malformed connection string, and
// then never quotes it (it may hold a password).
func Open(o Options) (*pgxpool.Pool, error) {
	if err := secrets.CheckURL("the database URL", o.URL); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(o.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", secrets.New(o.URL, o.Password).Err(err))
	}
	if o.Password != "" {
		cfg.ConnConfig.Password = o.Password
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if o.LockTimeout > 0 {
		cfg.ConnConfig.RuntimeParams["lock_timeout"] = strconv.FormatInt(o.LockTimeout.Milliseconds(), 10)
	}
	if o.Keyed {
		cfg.ConnConfig.RuntimeParams["enable_seqscan"] = "off"
	}
	// No JIT: sas's statements are short, and once a table holds enough
	// rows the planner's estimates pass jit_above_cost, when compiling a
	// plan costs a second of CPU for a statement that runs in a
	// millisecond (a limited claim behind a backlog of 20,000 steps).
	if _, set := cfg.ConnConfig.RuntimeParams["jit"]; !set {
		cfg.ConnConfig.RuntimeParams["jit"] = "off"
	}
	cfg.MaxConnIdleTime = time.Minute
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", secrets.New(o.URL, o.Password).Err(err))
	}
	return pool, nil
}

// Connect opens a connection pool to url and checks it answers.
// maxConns <= 0 keeps pgx's default.
func Connect(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := Open(Options{URL: url, MaxConns: maxConns})
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ping database: %w", secrets.New(url).Err(err))
	}
	return pool, nil
}

// IsAuthFailure reports whether err is the server refusing the login
// (wrong password, unknown role, no pg_hba entry): trying again with the
// same settings cannot succeed.
func IsAuthFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000")
}

// Retryable reports whether the same statement may succeed if tried
// again: the connection was lost, refused or timed out, or the server
// gave up on it for a while (SQLSTATE classes 08 connection, 40
// rollback, 53 resources, 55 object in use, 57 operator intervention such
// as a shutdown or a cancelled query, 58 system error, and 25006, a
// standby that is not yet promoted). A value the database refused
// (ErrInvalidData), a refused login and any other error the server
// answered (a missing table, a bug in a statement) are not: trying them
// again gives the same answer.
func Retryable(err error) bool {
	if err == nil || errors.Is(err, ErrInvalidData) || IsAuthFailure(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	if len(pgErr.Code) == 5 {
		switch pgErr.Code[:2] {
		case "08", "40", "53", "55", "57", "58":
			return true
		}
	}
	return pgErr.Code == "25006"
}

// IsLockTimeout reports whether err is a statement giving up on a row
// lock after Options.LockTimeout.
func IsLockTimeout(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// againOnLock runs an operator's or a caller's action, and again (at
// most three times more, 50, 100 and 200 ms apart) while PostgreSQL gives
// it up for a row another transaction holds (lock_timeout: SQLSTATE
// 55P03) or picks it as a deadlock's victim (40P01). f must be one
// statement or one transaction, which rolled back whole: nothing of a try
// that failed stays. The holder is most often a claim or a batch of
// replies that locks the same orders' steps and rows for milliseconds (a
// workflow's pause and resume lock every order of it, one after another;
// a cancel locks the order, then its steps, where a reply locks the step,
// then its order). The one who asked is then told to try again only for a
// lock held for seconds.
func againOnLock(ctx context.Context, f func() error) error {
	wait := 50 * time.Millisecond
	for try := 1; ; try++ {
		err := f()
		var pgErr *pgconn.PgError
		deadlocked := errors.As(err, &pgErr) && pgErr.Code == "40P01"
		if try == 4 || !IsLockTimeout(err) && !deadlocked {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait *= 2
	}
}

// IsMissingSchema reports whether err is a statement naming a table or
// function that does not exist: the database has not been migrated.
func IsMissingSchema(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42883")
}

// CheckSchema reports whether the state store's tables are in the
// connection's search_path; IsMissingSchema(err) when they are not (the
// database was never migrated).
func (s *Store) CheckSchema(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `SELECT 1 FROM orders LIMIT 0`)
	return err
}

// Ping reports whether the database answers.
func (s *Store) Ping(ctx context.Context) error {
	return s.pool.Ping(ctx)
}

// genericPlansExpr, in a statement, makes the rest of its transaction run
// prepared statements on their generic plans (plan_cache_mode).
//
// PostgreSQL plans a prepared statement for its arguments (a custom plan)
// five times, then keeps to its generic plan only while that plan's
// estimated cost is no higher than the custom plans' average. The batched
// statements take their arguments as arrays, whose lengths a custom plan
// knows and a generic one guesses (ten elements), and their costs go up
// and down with the batch: under load PostgreSQL planned the batched
// reply again at about half of its executions, 2.9 ms each, about a
// sixth of all it spent, and the relay's delete at every execution at 60
// orders a second (TestBatchedStatementsKeepGenericPlans).
const genericPlansExpr = `set_config('plan_cache_mode', 'force_generic_plan', true)`
