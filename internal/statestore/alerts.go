package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Alert is an operator alert as the store keeps it: raised with the state
// change that needed a person (a step that reached its failure threshold
// or failed for good), open until an operator acknowledges it.
type Alert struct {
	ID           int64      `json:"id"`
	MessageID    string     `json:"message_id"`
	OrderID      string     `json:"order_id"`
	Step         *int       `json:"step"`
	Reason       string     `json:"reason"`
	FailureCount int        `json:"failure_count"`
	RaisedAt     time.Time  `json:"raised_at"`
	RaisedBy     string     `json:"raised_by"`
	AckedAt      *time.Time `json:"acked_at,omitempty"`
	// AckedBy is the database login that acknowledged it; AckedAs the
	// name that login gave (a label, not a proof).
	AckedBy string `json:"acked_by,omitempty"`
	AckedAs string `json:"acked_as,omitempty"`
}

// AlertFilter selects alerts for ListAlerts.
type AlertFilter struct {
	OpenOnly bool          // only those not acknowledged
	Since    time.Duration // raised within this long (database clock); 0 for any
	AfterID  int64         // only ids above this one (to follow new ones)
	OrderID  string        // only this order's; "" for any
	Limit    int           // <= 0 for 100
	// Oldest lists oldest first (to follow); otherwise newest first.
	Oldest bool
}

const alertColumns = `id, message_id::text, order_id::text, step, reason, failure_count, raised_at, raised_by,
	acked_at, coalesce(acked_by, ''), coalesce(acked_as, '')`

func scanAlert(row pgx.Row) (Alert, error) {
	var a Alert
	err := row.Scan(&a.ID, &a.MessageID, &a.OrderID, &a.Step, &a.Reason, &a.FailureCount, &a.RaisedAt, &a.RaisedBy,
		&a.AckedAt, &a.AckedBy, &a.AckedAs)
	return a, err
}

// ListAlerts returns alerts as f selects them. Reading them changes
// nothing: every operator sees every alert until it is acknowledged, and
// after.
func (s *Store) ListAlerts(ctx context.Context, f AlertFilter) ([]Alert, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	order := "DESC"
	if f.Oldest {
		order = "ASC"
	}
	rows, err := s.pool.Query(ctx, `SELECT `+alertColumns+` FROM alerts
		WHERE (NOT $1 OR acked_at IS NULL)
		  AND ($2::float8 = 0 OR raised_at >= now() - make_interval(secs => $2::float8))
		  AND id > $3
		  AND ($4 = '' OR order_id = $4::uuid)
		ORDER BY id `+order+`
		LIMIT $5`, f.OpenOnly, f.Since.Seconds(), f.AfterID, f.OrderID, limit)
	if err != nil {
		return nil, fmt.Errorf("list alerts: %w", err)
	}
	alerts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Alert, error) { return scanAlert(row) })
	if err != nil {
		return nil, fmt.Errorf("list alerts: %w", err)
	}
	return alerts, nil
}

// LastAlertID is the id of the newest alert, 0 if none: where following
// new alerts starts.
func (s *Store) LastAlertID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM alerts`).Scan(&id); err != nil {
		return 0, fmt.Errorf("last alert: %w", err)
	}
	return id, nil
}

// AckAlert acknowledges an open alert as the session's database login,
// with claimed as the name it gives. It returns the alert as it is now
// and whether it had been acknowledged already (by whom is in the
// alert). Unknown ids give ErrNotFound.
func (s *Store) AckAlert(ctx context.Context, id int64, claimed string) (Alert, bool, error) {
	var already bool
	var a Alert
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ackedAt time.Time
		var by, as *string
		if err := tx.QueryRow(ctx, `SELECT acked_at, acked_by, acked_as, already FROM ack_alert($1, $2)`, id, claimed).
			Scan(&ackedAt, &by, &as, &already); err != nil {
			return err
		}
		var err error
		a, err = scanAlert(tx.QueryRow(ctx, `SELECT `+alertColumns+` FROM alerts WHERE id = $1`, id))
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false, fmt.Errorf("alert %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return a, false, fmt.Errorf("acknowledge alert: %w", operatorError(err))
	}
	return a, already, nil
}

// OpenAlerts counts the alerts nobody has acknowledged.
func (s *Store) OpenAlerts(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM alerts WHERE acked_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("open alerts: %w", err)
	}
	return n, nil
}
