package statestore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ArchivedOrder is an order's whole record as it is archived before
// retention deletes it: the order with its steps, history, family and
// deadline (OrderDetail), its alerts, the payloads it had before re-runs
// and its search attributes.
type ArchivedOrder struct {
	SchemaVersion int       `json:"schema_version"`
	ArchivedAt    time.Time `json:"archived_at"`
	OrderDetail
	Alerts         []Alert          `json:"alerts"`
	PayloadHistory []PayloadChange  `json:"payload_history"`
	Attributes     map[string]any   `json:"attributes,omitempty"`
	Signals        []ArchivedSignal `json:"signals,omitempty"`
}

// ArchivedSignal is a signal an order kept or applied.
type ArchivedSignal struct {
	ID      string          `json:"signal_id"`
	Name    string          `json:"name"`
	Payload json.RawMessage `json:"payload,omitempty"`
	At      time.Time       `json:"received_at"`
}

// ArchiveVersion is the version of the archived document.
const ArchiveVersion = 1

// ArchiveCandidates lists up to limit orders retention would delete now
// (ended more than olderThan ago on the database clock; statuses: a
// subset of EndedStatuses, nil for both), the oldest first.
func (s *Store) ArchiveCandidates(ctx context.Context, olderThan time.Duration, statuses []string, limit int) ([]string, error) {
	if statuses == nil {
		statuses = EndedStatuses()
	}
	rows, err := s.pool.Query(ctx, `SELECT order_id::text FROM orders
		WHERE created_at < now() - make_interval(secs => $1::float8) AND updated_at < now() - make_interval(secs => $1::float8)
		  AND status = ANY($2)
		ORDER BY created_at LIMIT $3`, olderThan.Seconds(), statuses, limit)
	if err != nil {
		return nil, fmt.Errorf("archive candidates: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("archive candidates: %w", err)
	}
	return ids, nil
}

// ArchiveDocument reads an order's whole record (ArchivedOrder) as the
// JSON document the archive keeps.
func (s *Store) ArchiveDocument(ctx context.Context, orderID string) ([]byte, error) {
	d, err := s.GetOrder(ctx, orderID)
	if err != nil {
		return nil, err
	}
	a := ArchivedOrder{SchemaVersion: ArchiveVersion, OrderDetail: d, Alerts: []Alert{}, PayloadHistory: []PayloadChange{}}
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&a.ArchivedAt); err != nil {
		return nil, fmt.Errorf("archive %s: %w", orderID, err)
	}
	if a.Alerts, err = s.ListAlerts(ctx, AlertFilter{OrderID: orderID, Limit: 10000, Oldest: true}); err != nil {
		return nil, fmt.Errorf("archive %s: %w", orderID, err)
	}
	if a.PayloadHistory, err = s.PayloadHistory(ctx, orderID); err != nil {
		return nil, fmt.Errorf("archive %s: %w", orderID, err)
	}
	attrs, err := s.Attributes(ctx, orderID)
	if err != nil {
		return nil, fmt.Errorf("archive %s: %w", orderID, err)
	}
	if len(attrs) > 0 {
		a.Attributes = map[string]any{}
		for _, at := range attrs {
			a.Attributes[at.Name] = at.Value()
		}
	}
	rows, err := s.pool.Query(ctx, `SELECT signal_id, name, payload, received_at FROM signals WHERE order_id = $1 ORDER BY received_at`, orderID)
	if err == nil {
		a.Signals, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ArchivedSignal, error) {
			var g ArchivedSignal
			err := row.Scan(&g.ID, &g.Name, &g.Payload, &g.At)
			return g, err
		})
	}
	if err != nil {
		return nil, fmt.Errorf("archive %s: signals: %w", orderID, err)
	}
	return json.Marshal(a)
}

// PurgeOrders deletes the orders of ids that retention may still delete
// (ended more than olderThan ago; statuses as PurgeEnded's), with their
// steps, history and alerts, in one transaction: the orders an archive
// confirmed it keeps. An order that changed meanwhile is left.
func (s *Store) PurgeOrders(ctx context.Context, ids []string, olderThan time.Duration, statuses []string) (Purged, error) {
	if statuses == nil {
		statuses = EndedStatuses()
	}
	var p Purged
	err := s.pool.QueryRow(ctx, `SELECT orders_deleted, steps_deleted, transitions_deleted, alerts_deleted
		FROM purge_orders($1::uuid[], make_interval(secs => $2::float8), $3)`, ids, olderThan.Seconds(), statuses).
		Scan(&p.Orders, &p.Steps, &p.Transitions, &p.Alerts)
	if err != nil {
		return Purged{}, fmt.Errorf("purge archived orders: %w", operatorError(err))
	}
	return p, nil
}
