package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ScheduleDef is a schedule of the workflows file as the state store
// keeps it; FirstTick is its first tick from now, used when it is new or
// its definition (Version) changed.
type ScheduleDef struct {
	Name, Workflow, Cron, Timezone string
	Payload                        []byte
	Overlap, CatchUp, Version      string
	FirstTick                      time.Time
}

// ScheduleRow is a schedule as the state store has it.
type ScheduleRow struct {
	Name      string     `json:"name"`
	Workflow  string     `json:"workflow"`
	Cron      string     `json:"cron"`
	Timezone  string     `json:"timezone"`
	Payload   []byte     `json:"payload"`
	Overlap   string     `json:"overlap"`
	CatchUp   string     `json:"catch_up"`
	Version   string     `json:"version"`
	InFile    bool       `json:"in_file"`
	Paused    bool       `json:"paused"`
	PausedBy  string     `json:"paused_by,omitempty"`
	NextTick  time.Time  `json:"next_tick"`
	LastTick  *time.Time `json:"last_tick,omitempty"`
	LastOrder string     `json:"last_order,omitempty"`
	// LastOrderStatus is the status of LastOrder ("" for none).
	LastOrderStatus string     `json:"last_order_status,omitempty"`
	TriggerAt       *time.Time `json:"trigger_at,omitempty"`
	TriggerBy       string     `json:"trigger_by,omitempty"`
	// Partition, in a partitioned deployment, is the partition keeping
	// the schedule (set by whoever reads several).
	Partition string `json:"partition,omitempty"`
}

// Running reports whether the schedule's last order has not ended.
func (r ScheduleRow) Running() bool {
	switch r.LastOrderStatus {
	case OrderReceived, OrderProcessing, OrderCompensating, OrderError:
		return true
	}
	return false
}

const scheduleColumns = `s.name, s.workflow, s.cron, s.timezone, s.payload, s.overlap, s.catch_up, s.version, s.in_file, s.paused,
	coalesce(s.paused_by, ''), s.next_tick, s.last_tick, coalesce(s.last_order::text, ''), coalesce(o.status, ''), s.trigger_at,
	coalesce(s.trigger_by, '')`

func scanSchedule(row pgx.CollectableRow) (ScheduleRow, error) {
	var r ScheduleRow
	err := row.Scan(&r.Name, &r.Workflow, &r.Cron, &r.Timezone, &r.Payload, &r.Overlap, &r.CatchUp, &r.Version, &r.InFile, &r.Paused,
		&r.PausedBy, &r.NextTick, &r.LastTick, &r.LastOrder, &r.LastOrderStatus, &r.TriggerAt, &r.TriggerBy)
	return r, err
}

// SyncSchedules makes the kept schedules the file's: a new one, or one
// whose definition changed, ticks from its FirstTick; one the file no
// longer has starts nothing (in_file false). Paused schedules stay
// paused, and each keeps its last tick and order.
func (s *Store) SyncSchedules(ctx context.Context, defs []ScheduleDef) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		names := make([]string, 0, len(defs))
		for _, d := range defs {
			names = append(names, d.Name)
			if _, err := tx.Exec(ctx, `
INSERT INTO schedules (name, workflow, cron, timezone, payload, overlap, catch_up, version, next_tick)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (name) DO UPDATE SET workflow = EXCLUDED.workflow, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
    payload = EXCLUDED.payload, overlap = EXCLUDED.overlap, catch_up = EXCLUDED.catch_up, version = EXCLUDED.version, in_file = true,
    next_tick = CASE WHEN schedules.version = EXCLUDED.version AND schedules.in_file THEN schedules.next_tick ELSE EXCLUDED.next_tick END,
    updated_at = now()
WHERE schedules.version IS DISTINCT FROM EXCLUDED.version OR NOT schedules.in_file`,
				d.Name, d.Workflow, d.Cron, d.Timezone, string(d.Payload), d.Overlap, d.CatchUp, d.Version, d.FirstTick); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE schedules SET in_file = false, updated_at = now() WHERE in_file AND name <> ALL($1::text[])`, names); err != nil {
			return err
		}
		return notifyTimers(ctx, tx) // a new schedule's first tick may come before the timer loop looks again
	})
	if err != nil {
		return fmt.Errorf("sync schedules: %w", classify(err))
	}
	return nil
}

// Schedules lists the kept schedules by name, with their last order's
// status.
func (s *Store) Schedules(ctx context.Context) ([]ScheduleRow, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+scheduleColumns+` FROM schedules s LEFT JOIN orders o ON o.order_id = s.last_order ORDER BY s.name`)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, scanSchedule)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", classify(err))
	}
	return out, nil
}

// ScheduleStart is an order a schedule starts.
type ScheduleStart struct {
	Tick    time.Time
	Order   NewOrder
	Version WorkflowVersion
}

// ScheduleRound is what the leader does for one due schedule: the orders
// to start, how many ticks it skips (overlap, catch-up), and the ticks it
// moves to.
type ScheduleRound struct {
	Starts   []ScheduleStart
	Skipped  int
	LastTick *time.Time
	NextTick time.Time
	// ClearTrigger: the operator's trigger was handled.
	ClearTrigger bool
}

// ScheduleFired is what a round did.
type ScheduleFired struct {
	Name     string
	Started  []string // the orders it wrote (a tick started before is not again)
	Skipped  int
	LastTick *time.Time
	NextTick time.Time
	// Late is how long after it was due the newest tick was handled.
	Late time.Duration
	// Now is the database clock the round was planned at.
	Now time.Time
	// NoNamespace is the namespace its orders go to when it does not
	// exist: its ticks start nothing (they are counted skipped).
	NoNamespace string
}

// FireSchedules handles the due schedules, with the lease p_lease held by
// holder: each whose next tick has passed on the database clock, or that
// an operator triggered, is locked (two leaders never handle one at
// once), given to plan with the database's now, and its orders and new
// ticks are written in the same transaction. An order id is derived from
// the schedule and the tick, so a round done again after a failover
// starts nothing twice. Without the lease it does nothing.
func (s *Store) FireSchedules(ctx context.Context, holder, lease string, plan func(now time.Time, due ScheduleRow) ScheduleRound) ([]ScheduleFired, error) {
	var fired []ScheduleFired
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var now time.Time
		var held bool
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp(), EXISTS (SELECT 1 FROM leases WHERE name = $1 AND holder = $2 AND expires_at > now())`,
			lease, holder).Scan(&now, &held); err != nil {
			return err
		}
		if !held {
			return nil
		}
		rows, err := tx.Query(ctx, `SELECT `+scheduleColumns+` FROM schedules s LEFT JOIN orders o ON o.order_id = s.last_order
			WHERE s.in_file AND ((NOT s.paused AND s.next_tick <= $1) OR s.trigger_at IS NOT NULL)
			ORDER BY s.next_tick LIMIT 100 FOR UPDATE OF s SKIP LOCKED`, now)
		if err != nil {
			return err
		}
		due, err := pgx.CollectRows(rows, scanSchedule)
		if err != nil {
			return err
		}
		for _, d := range due {
			round := plan(now, d)
			f := ScheduleFired{Name: d.Name, Skipped: round.Skipped, LastTick: round.LastTick, NextTick: round.NextTick, Now: now}
			if round.LastTick != nil {
				f.Late = now.Sub(*round.LastTick)
			}
			lastOrder := d.LastOrder
			for _, st := range round.Starts {
				if ns := st.Order.Namespace; ns != "" && ns != DefaultNamespace {
					var known bool
					if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM namespaces WHERE name = $1)`, ns).Scan(&known); err != nil {
						return err
					}
					if !known {
						f.NoNamespace = ns
						f.Skipped++
						continue
					}
				}
				written, err := insertOwnOrder(ctx, tx, st.Order, st.Version)
				if err != nil {
					return err
				}
				if written {
					f.Started = append(f.Started, st.Order.OrderID)
				}
				lastOrder = st.Order.OrderID
			}
			var last *string
			if lastOrder != "" {
				last = &lastOrder
			}
			if _, err := tx.Exec(ctx, `UPDATE schedules SET next_tick = $2, last_tick = coalesce($3, last_tick), last_order = $4::uuid,
				trigger_at = CASE WHEN $5 THEN NULL ELSE trigger_at END, trigger_by = CASE WHEN $5 THEN NULL ELSE trigger_by END,
				updated_at = now() WHERE name = $1`, d.Name, round.NextTick, round.LastTick, last, round.ClearTrigger); err != nil {
				return err
			}
			fired = append(fired, f)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("fire schedules: %w", classify(err))
	}
	return fired, nil
}

// ErrNoSchedule is why an operator's action found no schedule.
var ErrNoSchedule = errors.New("no such schedule")

// PauseSchedule pauses or resumes a schedule for an operator, recorded
// with the operator's login. A resumed schedule ticks from nextTick (the
// ticks missed while it was paused are not caught up).
func (s *Store) PauseSchedule(ctx context.Context, name string, pause bool, nextTick time.Time, claimed string) error {
	action := "schedule resume"
	if pause {
		action = "schedule pause"
	}
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, `UPDATE schedules SET paused = $2,
				paused_by = CASE WHEN $2 THEN 'operator:' || session_user || coalesce(' as ' || NULLIF($4, ''), '') END,
				next_tick = CASE WHEN $2 THEN next_tick ELSE $3 END, updated_at = now() WHERE name = $1`, name, pause, nextTick, claimed)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return ErrNoSchedule
			}
			if _, err := tx.Exec(ctx, `SELECT record_operator_action($1, $2, '', $3)`, action, name, claimed); err != nil {
				return err
			}
			return notifyTimers(ctx, tx) // a resumed schedule may tick before the timer loop looks again
		})
	})
	if errors.Is(err, ErrNoSchedule) {
		return fmt.Errorf("schedule %s: %w", name, ErrNoSchedule)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", action, name, classify(err))
	}
	return nil
}

// TriggerSchedule asks the leading supervisor to start an order of the
// schedule now, out of its ticks (and whatever its overlap), recorded
// with the operator's login; it returns when it was asked, on the
// database clock, which names the order.
func (s *Store) TriggerSchedule(ctx context.Context, name, claimed string) (time.Time, error) {
	var at time.Time
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			err := tx.QueryRow(ctx, `UPDATE schedules SET trigger_at = coalesce(trigger_at, clock_timestamp()),
				trigger_by = coalesce(trigger_by, 'operator:' || session_user || coalesce(' as ' || NULLIF($2, ''), '')), updated_at = now()
				WHERE name = $1 AND in_file RETURNING trigger_at`, name, claimed).Scan(&at)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNoSchedule
			}
			if err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SELECT record_operator_action('schedule trigger', $1, '', $2)`, name, claimed); err != nil {
				return err
			}
			return notifyTimers(ctx, tx) // due now
		})
	})
	if errors.Is(err, ErrNoSchedule) {
		return time.Time{}, fmt.Errorf("schedule %s (in the workflows file): %w", name, ErrNoSchedule)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("trigger schedule %s: %w", name, classify(err))
	}
	return at, nil
}
