package statestore

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"sas/internal/workflow"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Namespace is a tenant: its orders, and the API tokens granted it, are
// its own, and so are its quotas.
type Namespace struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	Quotas
	// QuotasBy and QuotasAt: who set the quotas last, and when.
	QuotasBy string     `json:"quotas_by,omitempty"`
	QuotasAt *time.Time `json:"quotas_at,omitempty"`
}

// Quotas are a namespace's limits, each nil for none: the orders it has
// in flight (not ended), the orders it submits a second (a bucket of
// MaxSubmitBurst, by default the rate rounded up, refilled at the rate)
// and the bytes of one order's payload. The default namespace has none.
type Quotas struct {
	MaxInFlight     *int     `json:"max_in_flight,omitempty"`
	MaxSubmitRate   *float64 `json:"max_submit_rate,omitempty"`
	MaxSubmitBurst  *int     `json:"max_submit_burst,omitempty"`
	MaxPayloadBytes *int     `json:"max_payload_bytes,omitempty"`
}

// Share is one partition's share of a namespace's quotas in a
// deployment of n partitions, each partition holding its orders to it:
// in flight, rate and burst split as workflow.Limits.Share splits a
// kind's limits (at least 1 each); a payload's size is every
// partition's.
func (q Quotas) Share(n int) Quotas {
	if n <= 1 {
		return q
	}
	var l workflow.Limits
	if q.MaxInFlight != nil {
		l.MaxInFlight = *q.MaxInFlight
	}
	if q.MaxSubmitRate != nil {
		l.Rate = *q.MaxSubmitRate
	}
	if q.MaxSubmitBurst != nil {
		l.Burst = *q.MaxSubmitBurst
	}
	sh := l.Share(n)
	out := q
	if q.MaxInFlight != nil {
		out.MaxInFlight = &sh.MaxInFlight
	}
	if q.MaxSubmitRate != nil {
		out.MaxSubmitRate = &sh.Rate
	}
	if q.MaxSubmitBurst != nil {
		out.MaxSubmitBurst = &sh.Burst
	}
	return out
}

// Any reports whether any quota is set.
func (q Quotas) Any() bool {
	return q.MaxInFlight != nil || q.MaxSubmitRate != nil || q.MaxSubmitBurst != nil || q.MaxPayloadBytes != nil
}

// The quotas a QuotaRefusal names.
const (
	QuotaInFlight     = "in_flight"
	QuotaSubmitRate   = "submit_rate"
	QuotaPayloadBytes = "payload_bytes"
)

// QuotaRefusal is a namespace's quota refusing an order: which (one of
// the Quota constants), what to say, and how soon to try again (0: not
// as the order is).
type QuotaRefusal struct {
	Quota      string
	Detail     string
	RetryAfter time.Duration
}

// SetNamespaceQuotas replaces namespace name's quotas (nil: none) and
// starts its submit rate's bucket full. The default namespace takes none
// (ErrInvalidData); an unknown one is ErrNotFound.
func (s *Store) SetNamespaceQuotas(ctx context.Context, name string, q Quotas, by string) error {
	if name == DefaultNamespace && q.Any() {
		return fmt.Errorf("the default namespace has no quotas (every order that names no namespace is in it): %w", ErrInvalidData)
	}
	if q.MaxSubmitBurst != nil && q.MaxSubmitRate == nil {
		return fmt.Errorf("a submit burst needs a submit rate: %w", ErrInvalidData)
	}
	var tag pgconn.CommandTag
	err := againOnLock(ctx, func() error {
		var err error
		tag, err = s.pool.Exec(ctx, `UPDATE namespaces SET max_in_flight = $2, max_submit_rate = $3, max_submit_burst = $4,
		max_payload_bytes = $5, rate_tokens = NULL, rate_at = NULL, in_flight_bound = NULL, quotas_by = $6, quotas_at = now() WHERE name = $1`,
			name, q.MaxInFlight, q.MaxSubmitRate, q.MaxSubmitBurst, q.MaxPayloadBytes, by)
		return err
	})
	if err != nil {
		return fmt.Errorf("set the quotas of namespace %q: %w", name, classify(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("namespace %q: %w", name, ErrNotFound)
	}
	return nil
}

// InsertOrderWithinQuota writes o as InsertOrder does, in one
// transaction with its namespace's admission (namespace_admit): an order
// a quota refuses is not written, and the refusal says why. A repeat of
// an order already written takes nothing of the quotas. For the orders
// of a namespace that has quotas; the others go through InsertOrders.
func (s *Store) InsertOrderWithinQuota(ctx context.Context, o NewOrder) (InsertOutcome, *QuotaRefusal, error) {
	if len(o.Steps) == 0 {
		return 0, nil, fmt.Errorf("insert order %s: no steps", o.OrderID)
	}
	// A submit the quotas refuse as they read now is not written at all,
	// unless it repeats an order written before (a duplicate takes
	// nothing of the quotas).
	var pre QuotaRefusal
	var preMS int
	if err := s.pool.QueryRow(ctx, `SELECT quota, detail, retry_ms FROM namespace_precheck($1, $2)`, cmp.Or(o.Namespace, DefaultNamespace),
		len(o.Payload)).Scan(&pre.Quota, &pre.Detail, &preMS); err != nil {
		return 0, nil, fmt.Errorf("admit order %s: %w", o.OrderID, classify(err))
	}
	if pre.Quota != "" {
		var hash []byte
		err := s.pool.QueryRow(ctx, `SELECT payload_hash FROM orders WHERE order_id = $1`, o.OrderID).Scan(&hash)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			pre.RetryAfter = time.Duration(preMS) * time.Millisecond
			return 0, &pre, nil
		case err != nil:
			return 0, nil, fmt.Errorf("read existing order %s: %w", o.OrderID, err)
		case !bytes.Equal(hash, o.PayloadHash):
			return 0, nil, fmt.Errorf("insert order %s: %w", o.OrderID, ErrConflict)
		}
		return Duplicate, nil, nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("insert order %s: %w", o.OrderID, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	written, err := s.insertOne(ctx, tx, o, true)
	if err != nil {
		return 0, nil, err
	}
	if !written {
		_ = tx.Rollback(ctx)
		outcome, err := s.existing(ctx, o)
		return outcome, nil, err
	}
	var r QuotaRefusal
	var ms int
	if err := tx.QueryRow(ctx, `SELECT quota, detail, retry_ms FROM namespace_admit($1, $2)`, cmp.Or(o.Namespace, DefaultNamespace),
		len(o.Payload)).Scan(&r.Quota, &r.Detail, &ms); err != nil {
		return 0, nil, fmt.Errorf("admit order %s: %w", o.OrderID, classify(err))
	}
	if r.Quota != "" {
		r.RetryAfter = time.Duration(ms) * time.Millisecond
		return 0, &r, nil
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, fmt.Errorf("insert order %s: %w", o.OrderID, classify(err))
	}
	return Inserted, nil, nil
}

// AddNamespace makes a namespace; one that exists is ErrConflict.
func (s *Store) AddNamespace(ctx context.Context, name, by string) (Namespace, error) {
	if err := CheckNamespace(name); err != nil {
		return Namespace{}, fmt.Errorf("%v: %w", err, ErrInvalidData)
	}
	var n Namespace
	err := s.pool.QueryRow(ctx, `INSERT INTO namespaces (name, created_by) VALUES ($1, $2) RETURNING name, created_at, created_by`, name, by).
		Scan(&n.Name, &n.CreatedAt, &n.CreatedBy)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return Namespace{}, fmt.Errorf("namespace %q exists already: %w", name, ErrConflict)
	}
	if err != nil {
		return Namespace{}, fmt.Errorf("add namespace %q: %w", name, classify(err))
	}
	return n, nil
}

// Namespaces lists every namespace by name.
func (s *Store) Namespaces(ctx context.Context) ([]Namespace, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, created_at, created_by, max_in_flight, max_submit_rate, max_submit_burst,
		max_payload_bytes, coalesce(quotas_by, ''), quotas_at FROM namespaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Namespace, error) {
		var n Namespace
		err := row.Scan(&n.Name, &n.CreatedAt, &n.CreatedBy, &n.MaxInFlight, &n.MaxSubmitRate, &n.MaxSubmitBurst,
			&n.MaxPayloadBytes, &n.QuotasBy, &n.QuotasAt)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", classify(err))
	}
	return out, nil
}
