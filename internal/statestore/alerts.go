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
// or failed for good), open until an operator acknowledges it, or until
// its order ends after it was raised (resubmitted and completed, or
// cancelled and undone): then it is resolved, and says how.
type Alert struct {
	ID int64 `json:"id"`
	// Partition, in a partitioned deployment's merged lists, is the
	// partition that raised it: ids are each partition's own (the store
	// leaves it empty).
	Partition string `json:"partition,omitempty"`
	MessageID string `json:"message_id"`
	OrderID   string `json:"order_id"`
	// Namespace is its order's namespace: who may see it.
	Namespace    string     `json:"namespace"`
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
	// ResolvedAt is when its order ended after it was raised, and
	// Resolution how ("the order completed", "the order failed: its
	// actions were undone"); nil when the order has not ended since.
	ResolvedAt *time.Time `json:"resolved_at,omitempty"`
	Resolution string     `json:"resolution,omitempty"`
}

// Open reports whether the alert still needs a person: neither
// acknowledged nor resolved.
func (a Alert) Open() bool { return a.AckedAt == nil && a.ResolvedAt == nil }

// alertResolved is true for an alert (a) whose order (o) ended after it
// was raised.
const alertResolved = `(o.status IN ('completed', 'failed') AND o.updated_at >= a.raised_at)`

// alertsFrom is where alerts are read: with their order, for whether it
// ended since.
const alertsFrom = ` FROM alerts a LEFT JOIN orders o ON o.order_id = a.order_id `

// AlertFilter selects alerts for ListAlerts.
type AlertFilter struct {
	OpenOnly bool          // only those that still need a person: neither acknowledged nor resolved
	Since    time.Duration // raised within this long (database clock); 0 for any
	AfterID  int64         // only ids above this one (to follow new ones)
	OrderID  string        // only this order's; "" for any
	// Namespaces: only the alerts of these namespaces' orders; nil for
	// every namespace. An alert whose order is gone is in none.
	Namespaces []string
	Limit      int // <= 0 for 100
	// Oldest lists oldest first (to follow); otherwise newest first.
	Oldest bool
}

const alertColumns = `a.id, a.message_id::text, a.order_id::text, coalesce(o.namespace, ''), a.step, a.reason, a.failure_count, a.raised_at, a.raised_by,
	a.acked_at, coalesce(a.acked_by, ''), coalesce(a.acked_as, ''),
	CASE WHEN ` + alertResolved + ` THEN o.updated_at END, coalesce(o.status, '')`

func scanAlert(row pgx.Row) (Alert, error) {
	var a Alert
	var status string
	err := row.Scan(&a.ID, &a.MessageID, &a.OrderID, &a.Namespace, &a.Step, &a.Reason, &a.FailureCount, &a.RaisedAt, &a.RaisedBy,
		&a.AckedAt, &a.AckedBy, &a.AckedAs, &a.ResolvedAt, &status)
	if a.ResolvedAt != nil {
		a.Resolution = "the order completed"
		if status == OrderFailed {
			a.Resolution = "the order failed: what it had done was undone"
		}
	}
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
	rows, err := s.pool.Query(ctx, `SELECT `+alertColumns+alertsFrom+`
		WHERE (NOT $1 OR (a.acked_at IS NULL AND NOT coalesce(`+alertResolved+`, false)))
		  AND ($2::float8 = 0 OR a.raised_at >= now() - make_interval(secs => $2::float8))
		  AND a.id > $3
		  AND ($4 = '' OR a.order_id = $4::uuid)
		  AND ($6::text[] IS NULL OR o.namespace = ANY($6))
		ORDER BY a.id `+order+`
		LIMIT $5`, f.OpenOnly, f.Since.Seconds(), f.AfterID, f.OrderID, limit, f.Namespaces)
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
// alert). Unknown ids, and with namespaces (nil: every one) an alert of
// another namespace's order, give ErrNotFound.
func (s *Store) AckAlert(ctx context.Context, id int64, claimed string, namespaces []string) (Alert, bool, error) {
	var already bool
	var a Alert
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if namespaces != nil {
				var ours bool
				if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1`+alertsFrom+`WHERE a.id = $1 AND o.namespace = ANY($2))`, id, namespaces).
					Scan(&ours); err != nil {
					return err
				}
				if !ours {
					return pgx.ErrNoRows
				}
			}
			var ackedAt time.Time
			var by, as *string
			if err := tx.QueryRow(ctx, `SELECT acked_at, acked_by, acked_as, already FROM ack_alert($1, $2)`, id, claimed).
				Scan(&ackedAt, &by, &as, &already); err != nil {
				return err
			}
			var err error
			a, err = scanAlert(tx.QueryRow(ctx, `SELECT `+alertColumns+alertsFrom+`WHERE a.id = $1`, id))
			return err
		})
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return a, false, fmt.Errorf("alert %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return a, false, fmt.Errorf("acknowledge alert: %w", operatorError(err))
	}
	return a, already, nil
}

// openAlertsSQL counts the alerts that still need a person: neither
// acknowledged nor resolved (their order ended since).
const openAlertsSQL = `SELECT count(*)` + alertsFrom + `WHERE a.acked_at IS NULL AND NOT coalesce(` + alertResolved + `, false)`

// openAlertsByNamespaceSQL counts them by their order's namespace (ns,
// open); one whose order is gone counts in default.
const openAlertsByNamespaceSQL = `SELECT coalesce(o.namespace, 'default') AS ns, count(*) AS open` + alertsFrom +
	`WHERE a.acked_at IS NULL AND NOT coalesce(` + alertResolved + `, false) GROUP BY 1`

// OpenAlerts counts the alerts that still need a person: neither
// acknowledged nor resolved.
func (s *Store) OpenAlerts(ctx context.Context) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, openAlertsSQL).Scan(&n); err != nil {
		return 0, fmt.Errorf("open alerts: %w", err)
	}
	return n, nil
}
