package statestore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
)

// OverviewMinute is one minute of one workflow in the console's charts
// (overview_minutes): of the orders that came in that minute, how many
// completed and failed and the completed ones' p50 and p95 submit-to-end
// time, and the steps pending at the minute's last sample.
type OverviewMinute struct {
	Minute    time.Time
	Workflow  string
	Completed int
	Failed    int
	P50, P95  *time.Duration
	Pending   int
}

// SampleOverview writes the charts' rows of the last minutes, if holder
// holds lease (see the overview_sample function); it returns the rows
// written.
func (s *Store) SampleOverview(ctx context.Context, holder, lease string) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT overview_sample($1, $2)`, holder, lease).Scan(&n); err != nil {
		return 0, fmt.Errorf("overview sample: %w", classify(err))
	}
	return n, nil
}

// OverviewMinutes reads the charts' rows of the last window, by workflow
// then minute, and the database's time.
func (s *Store) OverviewMinutes(ctx context.Context, window time.Duration) ([]OverviewMinute, time.Time, error) {
	var now time.Time
	var out []OverviewMinute
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT minute, workflow, completed, failed, p50_ms, p95_ms, pending FROM overview_minutes
			WHERE minute > date_trunc('minute', now()) - make_interval(secs => $1) ORDER BY workflow, minute`, window.Seconds())
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (OverviewMinute, error) {
			var m OverviewMinute
			var p50, p95 *float64
			err := row.Scan(&m.Minute, &m.Workflow, &m.Completed, &m.Failed, &p50, &p95, &m.Pending)
			m.P50, m.P95 = msDuration(p50), msDuration(p95)
			return m, err
		})
		return err
	})
	if err != nil {
		return nil, now, fmt.Errorf("overview minutes: %w", classify(err))
	}
	return out, now, nil
}

func msDuration(ms *float64) *time.Duration {
	if ms == nil {
		return nil
	}
	d := time.Duration(math.Round(*ms * float64(time.Millisecond)))
	return &d
}
