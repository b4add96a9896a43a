package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bulk actions and job states (migration 0031).
const (
	BulkResubmit = "resubmit"
	BulkCancel   = "cancel"
	BulkPause    = "pause"  // migration 0041
	BulkResume   = "resume" // migration 0041

	BulkRunning = "running" // made; an API replica works on it while it holds its lease
	BulkStopped = "stopped" // an operator stopped it; the orders not reached stay as they were
	BulkDone    = "done"    // every order it chose was acted on (done or failed)
)

// BulkJob is a resubmit or cancel of the orders a filter chose.
type BulkJob struct {
	ID        int64           `json:"id"`
	Action    string          `json:"action"`
	Filter    json.RawMessage `json:"filter"`
	State     string          `json:"state"`
	Total     int             `json:"total"`
	Done      int             `json:"done"`
	Failed    int             `json:"failed"`
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	StoppedBy string          `json:"stopped_by,omitempty"`
}

// BulkOrder is what a bulk job did to one order.
type BulkOrder struct {
	OrderID string     `json:"order_id"`
	Outcome string     `json:"outcome,omitempty"` // "" (not yet), done or failed
	Detail  string     `json:"detail,omitempty"`
	At      *time.Time `json:"at,omitempty"`
}

const bulkJobColumns = `id, action, filter, state, total, done, failed, created_by, created_at, updated_at, coalesce(stopped_by, '')`

func scanBulkJob(row pgx.Row) (BulkJob, error) {
	var j BulkJob
	err := row.Scan(&j.ID, &j.Action, &j.Filter, &j.State, &j.Total, &j.Done, &j.Failed, &j.CreatedBy, &j.CreatedAt, &j.UpdatedAt, &j.StoppedBy)
	return j, err
}

// CountSelected counts the orders q selects (its page ignored), up to max+1:
// a bulk action's dry run.
func (s *Store) CountSelected(ctx context.Context, q OrderQuery, max int) (int, error) {
	q.After = nil
	w, err := newOrderWhere(q)
	if err != nil {
		return 0, fmt.Errorf("count orders: %w", err)
	}
	var n int
	args := append(w.args, max+1)
	err = s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s LIMIT $%d) c`, w.sql(), len(args)), args...).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count orders: %w", classify(err))
	}
	return n, nil
}

// BulkActions are the bulk actions.
var BulkActions = []string{BulkResubmit, BulkCancel, BulkPause, BulkResume}

// IsBulkAction says whether a is a bulk action.
func IsBulkAction(a string) bool { return slices.Contains(BulkActions, a) }

// CreateBulkJob makes a bulk job of action on the orders q selects now,
// at most max of them (more is ErrInvalidData: narrow the filter), in one
// transaction: the job, and each order it chose. filter is q as the
// caller's words, kept to be shown.
func (s *Store) CreateBulkJob(ctx context.Context, action string, q OrderQuery, filter []byte, by string, max int) (BulkJob, error) {
	return s.createBulkJob(ctx, 0, action, q, filter, by, max)
}

// CreateBulkJobPart is CreateBulkJob for one partition's share of a job
// made across partitions: origin is the job's id in the first partition,
// by which BulkJobsOf finds this one.
func (s *Store) CreateBulkJobPart(ctx context.Context, origin int64, action string, q OrderQuery, filter []byte, by string, max int) (BulkJob, error) {
	if origin < 1 {
		return BulkJob{}, fmt.Errorf("bulk job: origin %d: %w", origin, ErrInvalidData)
	}
	return s.createBulkJob(ctx, origin, action, q, filter, by, max)
}

func (s *Store) createBulkJob(ctx context.Context, origin int64, action string, q OrderQuery, filter []byte, by string, max int) (BulkJob, error) {
	if !IsBulkAction(action) {
		return BulkJob{}, fmt.Errorf("bulk action %q is not one of %v: %w", action, BulkActions, ErrInvalidData)
	}
	q.After = nil
	w, err := newOrderWhere(q)
	if err != nil {
		return BulkJob{}, fmt.Errorf("bulk job: %w", err)
	}
	var job BulkJob
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(ctx, `INSERT INTO bulk_jobs (action, filter, total, created_by, origin) VALUES ($1, $2, 0, $3, nullif($4, 0)) RETURNING id`,
			action, string(filter), by, origin).Scan(&id); err != nil {
			return err
		}
		args := append(append([]any{id}, w.args...), max+1)
		// The filter's placeholders are $1.. of its own: shift them past
		// the job id.
		where := shiftPlaceholders(w.sql(), 1)
		tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO bulk_job_orders (job_id, order_id)
			SELECT $1, o.order_id FROM %s LIMIT $%d`, where, len(args)), args...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() > int64(max) {
			return fmt.Errorf("the filter selects more than %d orders: narrow it (a bulk job acts on at most %d): %w", max, max, ErrInvalidData)
		}
		job, err = scanBulkJob(tx.QueryRow(ctx, `UPDATE bulk_jobs SET total = $2 WHERE id = $1 RETURNING `+bulkJobColumns, id, tag.RowsAffected()))
		return err
	})
	if err != nil {
		return BulkJob{}, fmt.Errorf("bulk job: %w", classify(err))
	}
	return job, nil
}

// shiftPlaceholders renumbers $N to $N+by in sql, whose only $ signs are
// placeholders (newOrderWhere's).
func shiftPlaceholders(sql string, by int) string {
	out := make([]byte, 0, len(sql)+8)
	for i := 0; i < len(sql); i++ {
		if sql[i] != '$' {
			out = append(out, sql[i])
			continue
		}
		j := i + 1
		n := 0
		for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
			n = n*10 + int(sql[j]-'0')
			j++
		}
		out = fmt.Appendf(out, "$%d", n+by)
		i = j - 1
	}
	return string(out)
}

// BulkJobOf reads a bulk job; ErrNotFound if there is none.
func (s *Store) BulkJobOf(ctx context.Context, id int64) (BulkJob, error) {
	j, err := scanBulkJob(s.pool.QueryRow(ctx, `SELECT `+bulkJobColumns+` FROM bulk_jobs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return BulkJob{}, fmt.Errorf("no bulk job %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return BulkJob{}, fmt.Errorf("bulk job %d: %w", id, classify(err))
	}
	return j, nil
}

// BulkJobsOf reads the partitions' shares of the jobs made across
// partitions whose first partition's ids are origins, by origin.
func (s *Store) BulkJobsOf(ctx context.Context, origins []int64) (map[int64]BulkJob, error) {
	rows, err := s.pool.Query(ctx, `SELECT origin, `+bulkJobColumns+` FROM bulk_jobs WHERE origin = ANY($1)`, origins)
	if err != nil {
		return nil, fmt.Errorf("bulk jobs: %w", classify(err))
	}
	out := map[int64]BulkJob{}
	var origin int64
	var j BulkJob
	_, err = pgx.ForEachRow(rows, []any{&origin, &j.ID, &j.Action, &j.Filter, &j.State, &j.Total, &j.Done, &j.Failed, &j.CreatedBy, &j.CreatedAt, &j.UpdatedAt, &j.StoppedBy},
		func() error {
			out[origin] = j
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("bulk jobs: %w", classify(err))
	}
	return out, nil
}

// BulkJobs lists the newest bulk jobs, newest first.
func (s *Store) BulkJobs(ctx context.Context, limit int) ([]BulkJob, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+bulkJobColumns+` FROM bulk_jobs ORDER BY id DESC LIMIT $1`, limit)
	if err != nil {
		return nil, fmt.Errorf("bulk jobs: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkJob, error) { return scanBulkJob(row) })
	if err != nil {
		return nil, fmt.Errorf("bulk jobs: %w", classify(err))
	}
	return out, nil
}

// BulkJobOrders lists what a job did to its orders (those not reached
// yet too), by order id, from after (exclusive, "" for the first).
func (s *Store) BulkJobOrders(ctx context.Context, id int64, after string, limit int) ([]BulkOrder, error) {
	if after == "" {
		after = "00000000-0000-0000-0000-000000000000"
	}
	rows, err := s.pool.Query(ctx, `SELECT order_id::text, coalesce(outcome, ''), detail, at FROM bulk_job_orders
		WHERE job_id = $1 AND order_id > $2::uuid ORDER BY order_id LIMIT $3`, id, after, limit)
	if err != nil {
		return nil, fmt.Errorf("bulk job %d orders: %w", id, classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BulkOrder, error) {
		var o BulkOrder
		err := row.Scan(&o.OrderID, &o.Outcome, &o.Detail, &o.At)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("bulk job %d orders: %w", id, classify(err))
	}
	return out, nil
}

// StopBulkJob stops a running job: no order is acted on after the one in
// progress. A job that ended already is returned as it is.
func (s *Store) StopBulkJob(ctx context.Context, id int64, by string) (BulkJob, error) {
	// The job's row is held by its turn at an order, a transaction that
	// may wait for that order's rows.
	if err := againOnLock(ctx, func() error {
		_, err := s.pool.Exec(ctx, `UPDATE bulk_jobs SET state = 'stopped', stopped_by = $2, updated_at = now()
		WHERE id = $1 AND state = 'running'`, id, by)
		return err
	}); err != nil {
		return BulkJob{}, fmt.Errorf("stop bulk job %d: %w", id, classify(err))
	}
	return s.BulkJobOf(ctx, id)
}

// TakeBulkJob leases the oldest running job no live holder has to
// holder for lease (on the database clock), or renews holder's own;
// ok is false when there is none.
func (s *Store) TakeBulkJob(ctx context.Context, holder string, lease time.Duration) (BulkJob, bool, error) {
	j, err := scanBulkJob(s.pool.QueryRow(ctx, `UPDATE bulk_jobs SET locked_by = $1, locked_until = now() + $2::interval
		WHERE id = (SELECT id FROM bulk_jobs WHERE state = 'running'
		              AND (locked_until IS NULL OR locked_until < now() OR locked_by = $1)
		            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING `+bulkJobColumns, holder, lease.String()))
	if errors.Is(err, pgx.ErrNoRows) {
		return BulkJob{}, false, nil
	}
	if err != nil {
		return BulkJob{}, false, fmt.Errorf("take a bulk job: %w", classify(err))
	}
	return j, true, nil
}

// errLeaseLost: the job is no longer this holder's, or no longer runs.
var errLeaseLost = errors.New("the bulk job is no longer this holder's to run")

// RunBulkBatch acts on up to batch of job's orders not reached yet, each
// in a transaction of its own that locks its row, checks that the job
// still runs under holder's lease, calls the operator function (recorded
// with claimed) and marks the order done, or failed with the function's
// refusal: so an order is acted on once, whoever runs the job after a
// crash. It returns how many it acted on; when none were left the job is
// done.
func (s *Store) RunBulkBatch(ctx context.Context, job BulkJob, holder, claimed string, batch int) (int, error) {
	rows, err := s.pool.Query(ctx, `SELECT order_id::text FROM bulk_job_orders WHERE job_id = $1 AND outcome IS NULL ORDER BY order_id LIMIT $2`,
		job.ID, batch)
	if err != nil {
		return 0, fmt.Errorf("bulk job %d: %w", job.ID, classify(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, fmt.Errorf("bulk job %d: %w", job.ID, classify(err))
	}
	if len(ids) == 0 {
		_, err := s.pool.Exec(ctx, `UPDATE bulk_jobs SET state = 'done', updated_at = now() WHERE id = $1 AND state = 'running' AND locked_by = $2`,
			job.ID, holder)
		if err != nil {
			return 0, fmt.Errorf("bulk job %d: %w", job.ID, classify(err))
		}
		return 0, nil
	}
	for i, id := range ids {
		if err := s.bulkOne(ctx, job, id, holder, claimed); err != nil {
			return i, err
		}
	}
	return len(ids), nil
}

func (s *Store) bulkOne(ctx context.Context, job BulkJob, orderID, holder, claimed string) error {
	return againOnLock(ctx, func() error { return s.bulkOneTry(ctx, job, orderID, holder, claimed) })
}

// bulkOneTry is bulkOne's one transaction.
func (s *Store) bulkOneTry(ctx context.Context, job BulkJob, orderID, holder, claimed string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var state, lockedBy string
		if err := tx.QueryRow(ctx, `SELECT state, coalesce(locked_by, '') FROM bulk_jobs WHERE id = $1 AND locked_until > now() FOR UPDATE`,
			job.ID).Scan(&state, &lockedBy); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return errLeaseLost
			}
			return err
		}
		if state != BulkRunning || lockedBy != holder {
			return errLeaseLost
		}
		var pending bool
		if err := tx.QueryRow(ctx, `SELECT outcome IS NULL FROM bulk_job_orders WHERE job_id = $1 AND order_id = $2 FOR UPDATE`,
			job.ID, orderID).Scan(&pending); err != nil {
			return err
		}
		if !pending {
			return nil
		}
		outcome, detail := "done", ""
		if _, err := tx.Exec(ctx, "SAVEPOINT act"); err != nil {
			return err
		}
		var actErr error
		switch job.Action {
		case BulkResubmit:
			_, actErr = tx.Exec(ctx, `SELECT operator_resubmit($1, 0, $2)`, orderID, claimed)
		case BulkCancel:
			_, actErr = tx.Exec(ctx, `SELECT operator_cancel($1, $2)`, orderID, claimed)
		case BulkPause:
			_, actErr = tx.Exec(ctx, `SELECT pause_order($1, 'bulk job ' || $3::bigint, $2)`, orderID, claimed, job.ID)
		case BulkResume:
			_, actErr = tx.Exec(ctx, `SELECT resume_order($1, $2)`, orderID, claimed)
		}
		if actErr != nil {
			var r *refusal
			if !errors.As(operatorError(actErr), &r) {
				return actErr
			}
			if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT act"); err != nil {
				return err
			}
			outcome, detail = "failed", r.msg
		}
		if _, err := tx.Exec(ctx, `UPDATE bulk_job_orders SET outcome = $3, detail = left($4, 1000), at = now() WHERE job_id = $1 AND order_id = $2`,
			job.ID, orderID, outcome, detail); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE bulk_jobs SET done = done + (CASE WHEN $2 = 'done' THEN 1 ELSE 0 END),
			failed = failed + (CASE WHEN $2 = 'failed' THEN 1 ELSE 0 END), updated_at = now() WHERE id = $1`, job.ID, outcome)
		return err
	})
	if errors.Is(err, errLeaseLost) {
		return err
	}
	if err != nil {
		return fmt.Errorf("bulk job %d, order %s: %w", job.ID, orderID, classify(err))
	}
	return nil
}

// ErrLeaseLost reports whether err says the job is no longer the
// caller's to run (stopped, done, or taken over after its lease ran out).
func ErrLeaseLost(err error) bool { return errors.Is(err, errLeaseLost) }
