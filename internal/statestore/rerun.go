package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Rerun is an operator's re-run of an order held in error with a
// corrected payload, in one transaction: the payload it had is kept in
// order_payloads with who replaced it, the order takes payload (its
// search attributes attrs, read from it), every step in error takes a
// new idempotency key (the service may remember the refused call under
// the old one), and the order is resubmitted as Resubmit does, from step
// (0: its failed step). The caller has checked payload against the
// workflow's schema. Refusals are Resubmit's; the order keeps its
// original payload_hash, so the original submit sent again is still the
// same order.
func (s *Store) Rerun(ctx context.Context, orderID string, step int, payload []byte, attrs []Attribute, claimed string) ([]int, error) {
	var reset []int
	err := againOnLock(ctx, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			reset = nil
			var status string
			err := tx.QueryRow(ctx, `SELECT status FROM orders WHERE order_id = $1 FOR UPDATE`, orderID).Scan(&status)
			if errors.Is(err, pgx.ErrNoRows) {
				return &refusal{"order " + orderID + " not found", ErrNotFound}
			}
			if err != nil {
				return err
			}
			if status != OrderError {
				return &refusal{fmt.Sprintf("order %s is %s, only an order in error can be re-run", orderID, status), ErrInvalidState}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO order_payloads (order_id, payload, replaced_by)
			SELECT order_id, payload, $2 FROM orders WHERE order_id = $1`, orderID, claimed); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE orders SET payload = $2, updated_at = now() WHERE order_id = $1`, orderID, string(payload)); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE steps SET idempotency_key = regexp_replace(idempotency_key, '/rerun-[0-9]+$', '') || '/rerun-' || attempt
			WHERE order_id = $1 AND process_state = 'error'`, orderID); err != nil {
				return err
			}
			if err := replaceAttributes(ctx, tx, orderID, attrs); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT operator_resubmit($1, $2, $3)`, orderID, step, claimed)
			if err != nil {
				return err
			}
			steps, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			for _, n := range steps {
				reset = append(reset, int(n))
			}
			return err
		})
	})
	if err != nil {
		return nil, fmt.Errorf("re-run: %w", classify(operatorError(err)))
	}
	return reset, nil
}

// replaceAttributes writes an order's search attributes anew.
func replaceAttributes(ctx context.Context, tx pgx.Tx, orderID string, attrs []Attribute) error {
	if _, err := tx.Exec(ctx, `DELETE FROM order_attributes WHERE order_id = $1`, orderID); err != nil {
		return err
	}
	if len(attrs) == 0 {
		return nil
	}
	var a insertArrays
	a.add(NewOrder{Attributes: attrs}, 1)
	_, err := tx.Exec(ctx, `INSERT INTO order_attributes (order_id, name, created_at, v_text, v_num, v_bool, v_time)
		SELECT o.order_id, a.name, o.created_at, a.v_text, a.v_num, a.v_bool, a.v_time
		FROM unnest($2::text[], $3::text[], $4::float8[], $5::bool[], $6::timestamptz[]) AS a(name, v_text, v_num, v_bool, v_time),
		     orders o WHERE o.order_id = $1`, orderID, a.attrNames, a.attrText, a.attrNum, a.attrBool, a.attrTime)
	return err
}

// PayloadChange is a payload an order had before a re-run replaced it.
type PayloadChange struct {
	ReplacedAt time.Time       `json:"replaced_at"`
	ReplacedBy string          `json:"replaced_by"`
	Payload    json.RawMessage `json:"payload"`
}

// PayloadHistory lists the payloads an order had before re-runs replaced
// them, oldest first.
func (s *Store) PayloadHistory(ctx context.Context, orderID string) ([]PayloadChange, error) {
	rows, err := s.pool.Query(ctx, `SELECT replaced_at, replaced_by, payload FROM order_payloads WHERE order_id = $1 ORDER BY replaced_at`, orderID)
	if err != nil {
		return nil, fmt.Errorf("payload history of %s: %w", orderID, classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PayloadChange, error) {
		var c PayloadChange
		err := row.Scan(&c.ReplacedAt, &c.ReplacedBy, &c.Payload)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("payload history of %s: %w", orderID, classify(err))
	}
	return out, nil
}

// Attributes reads an order's search attributes.
func (s *Store) Attributes(ctx context.Context, orderID string) ([]Attribute, error) {
	rows, err := s.pool.Query(ctx, `SELECT name, v_text, v_num, v_bool, v_time FROM order_attributes WHERE order_id = $1 ORDER BY name`, orderID)
	if err != nil {
		return nil, fmt.Errorf("attributes of %s: %w", orderID, classify(err))
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Attribute, error) {
		var a Attribute
		err := row.Scan(&a.Name, &a.Text, &a.Num, &a.Bool, &a.Time)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("attributes of %s: %w", orderID, classify(err))
	}
	return out, nil
}
