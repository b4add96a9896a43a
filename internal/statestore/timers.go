package statestore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// FiredTimer is a delayed step that FireTimers made pending.
type FiredTimer struct {
	OrderID string
	Step    int
	// Late is how long after its due time it fired, on the database clock.
	Late time.Duration
}

// FireTimers makes pending up to limit delayed steps whose due time has
// passed on the database clock, the earliest first, if holder holds the
// lease (see the fire_timers function), and wakes the schedulers. A step
// of an order that no longer runs is left as it is.
func (s *Store) FireTimers(ctx context.Context, holder, lease string, limit int) ([]FiredTimer, error) {
	var fired []FiredTimer
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT order_id::text, step, late_s FROM fire_timers($1, $2, $3)`, holder, lease, limit)
		if err != nil {
			return err
		}
		fired, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (FiredTimer, error) {
			var f FiredTimer
			var late float64
			err := row.Scan(&f.OrderID, &f.Step, &late)
			f.Late = time.Duration(late * float64(time.Second))
			return f, err
		})
		if err != nil || len(fired) == 0 {
			return err
		}
		return wake(ctx, tx)
	})
	if err != nil {
		return nil, fmt.Errorf("fire timers: %w", err)
	}
	return fired, nil
}

// FiredDeadline is an order's deadline that FireDeadlines fired.
type FiredDeadline struct {
	OrderID, Workflow string
	// OnDeadline is what the order was to do (compensate, hold, fail).
	OnDeadline string
	// Applied is false when the order had ended, or was being undone,
	// by then: nothing was done.
	Applied bool
	// Late is how long after its due time it fired, on the database clock.
	Late time.Duration
}

// FireDeadlines fires up to limit orders' deadlines whose due time has
// passed on the database clock, the earliest first, if holder holds the
// lease (see the fire_deadlines function): each order that still runs
// has its steps in flight fenced out and follows its on_deadline. It
// wakes the schedulers and the relay when one was applied.
func (s *Store) FireDeadlines(ctx context.Context, holder, lease string, limit int) ([]FiredDeadline, error) {
	var fired []FiredDeadline
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT deadline_order::text, coalesce(deadline_workflow, ''), deadline_how, deadline_applied, deadline_late_s
			FROM fire_deadlines($1, $2, $3)`, holder, lease, limit)
		if err != nil {
			return err
		}
		fired, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (FiredDeadline, error) {
			var f FiredDeadline
			var late float64
			err := row.Scan(&f.OrderID, &f.Workflow, &f.OnDeadline, &f.Applied, &late)
			f.Late = time.Duration(late * float64(time.Second))
			return f, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fire deadlines: %w", err)
	}
	return fired, nil
}

// NextTimer says how long until the earliest waiting timer falls due on
// the database clock (zero or less: due now), and false when none waits.
// It reads one entry of the due-time index.
func (s *Store) NextTimer(ctx context.Context) (time.Duration, bool, error) {
	var secs *float64
	if err := s.pool.QueryRow(ctx, `SELECT next_timer()`).Scan(&secs); err != nil {
		return 0, false, fmt.Errorf("next timer: %w", err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}

// WatchTimers is the leading supervisor's look before its timer loop
// sleeps: how long until the earliest timer or schedule tick still to
// come falls due on the database clock (false: none), and, when watched,
// a promise that a timer set from now on for sooner than the loop's next
// look (that time, at most longest from now) is told on ChannelTimers.
// Not watched (a writer of timers was between its read of the last
// promise and its commit), the loop should look again soon.
func (s *Store) WatchTimers(ctx context.Context, longest time.Duration) (next time.Duration, ok, watched bool, err error) {
	var secs *float64
	if err := s.pool.QueryRow(ctx, `SELECT next_s, watched FROM timers_watch($1)`, longest.Seconds()).Scan(&secs, &watched); err != nil {
		return 0, false, false, fmt.Errorf("watch timers: %w", err)
	}
	if secs == nil {
		return 0, false, watched, nil
	}
	return time.Duration(*secs * float64(time.Second)), true, watched, nil
}

// NextPending says how soon the earliest pending step becomes available
// to a claim (zero or less: it is now), and false when none is pending:
// a claimer at rest waits no longer than that. It reads the pending
// steps' two partial indexes, which hold only pending rows.
func (s *Store) NextPending(ctx context.Context) (time.Duration, bool, error) {
	var secs *float64
	if err := s.pool.QueryRow(ctx, `SELECT extract(epoch FROM least(
		(SELECT min(available_at) FROM steps WHERE process_state = 'pending' AND fair_key IS NULL),
		(SELECT min(available_at) FROM steps WHERE process_state = 'pending' AND fair_key IS NOT NULL)) - now())::float8`).Scan(&secs); err != nil {
		return 0, false, fmt.Errorf("next pending step: %w", err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}
