package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Namespace is a tenant: its orders, and the API tokens granted it, are
// its own.
type Namespace struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
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
	rows, err := s.pool.Query(ctx, `SELECT name, created_at, created_by FROM namespaces ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", classify(err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Namespace])
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", classify(err))
	}
	return out, nil
}

// NamespaceNames lists every namespace's name.
func (s *Store) NamespaceNames(ctx context.Context) ([]string, error) {
	var names []string
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM namespaces`).Scan(&names); err != nil {
		return nil, fmt.Errorf("list namespaces: %w", classify(err))
	}
	return names, nil
}
