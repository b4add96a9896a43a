package statestore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestEveryRuleOfARowHolds: each rule a row of steps and of orders keeps
// (their CHECK constraints) refuses a row that breaks it, with SQLSTATE
// 23514 naming one of the table's constraints, and lets the row at its
// edge pass; nothing a refused statement tried is left behind. A rule
// lost or loosened by a migration fails a case here.
func TestEveryRuleOfARowHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := order(1, time.Minute, 3)
	insert(t, b, o)
	cases := []struct {
		table, set string
		ok         bool
	}{
		{"steps", "step = 0", false},
		{"steps", "name = ''", false},
		{"steps", "name = repeat('n', 101)", false},
		{"steps", "name = repeat('n', 100)", true},
		{"steps", "agent = repeat('a', 101)", false},
		{"steps", "agent = repeat('a', 100)", true},
		{"steps", "kind = 'other'", false},
		{"steps", "kind = 'compensation'", false},
		{"steps", "compensates = 1", false},
		{"steps", "kind = 'compensation', compensates = 1", true},
		{"steps", "process_state = 'lost'", false},
		{"steps", "process_state = 'processing', locked_by = NULL, complete_by = now()", false},
		{"steps", "process_state = 'processing', locked_by = 'x', complete_by = NULL", false},
		{"steps", "process_state = 'processing', locked_by = 'x', complete_by = now(), moves = moves + 1, moved_by = 'test', moved_why = 'claimed'", true},
		{"steps", "process_state = 'delayed', due_at = NULL", false},
		{"steps", "process_state = 'awaiting', due_at = NULL", false},
		{"steps", "priority = 10", false},
		{"steps", "priority = -1", false},
		{"steps", "priority = 9", true},
		{"steps", "attempt = -1", false},
		{"steps", "failure_count = -1", false},
		{"steps", "max_failures = 0", false},
		{"steps", "unsent_attempts = -1", false},
		{"steps", "timeout = '0s'", false},
		{"steps", "backoff_base = '0s'", false},
		{"steps", "backoff_max = '-1s'", false},
		{"steps", "agent_call_us = -1", false},
		{"steps", "item_index = -1", false},
		{"steps", "item_index = 0, agent_call_us = 0", true},
		{"steps", "fair_key = repeat('k', 321)", false},
		{"steps", "fair_key = repeat('k', 320), fair_max = 1", true},
		{"steps", "fair_max = 0", false},
		{"orders", "status = 'lost'", false},
		{"orders", "failure_policy = 'retry'", false},
		{"orders", "priority = 10", false},
		{"orders", "priority = -1", false},
		{"orders", "priority = 9", true},
		{"orders", "depth = 6", false},
		{"orders", "depth = 5", true},
		{"orders", "parent_order = order_id", false},
		{"orders", "parent_step = 1", false},
		{"orders", "payload = '[]'", false},
		{"orders", "payload_hash = '\\x00'", false},
		{"orders", "reply_to = ''", false},
		{"orders", "reply_to = repeat('r', 256)", false},
		{"orders", "reply_to = repeat('r', 255)", true},
		{"orders", "traceparent = repeat('t', 129)", false},
		{"orders", "traceparent = repeat('t', 128)", true},
		{"orders", "namespace = 'Bad_Name'", false},
		{"orders", "namespace = '-a'", false},
		{"orders", "namespace = 'a-b'", true},
	}
	errRollBack := errors.New("roll back")
	for _, c := range cases {
		err := pgx.BeginFunc(ctxFor(t), b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctxFor(t), `UPDATE `+c.table+` SET `+c.set+` WHERE order_id = $1`, o.OrderID); err != nil {
				return err
			}
			return errRollBack
		})
		var pgErr *pgconn.PgError
		switch {
		case c.ok && !errors.Is(err, errRollBack):
			t.Errorf("%s SET %s: %v, want the row to pass", c.table, c.set, err)
		case !c.ok && !errors.As(err, &pgErr):
			t.Errorf("%s SET %s: %v, want a check violation", c.table, c.set, err)
		case !c.ok && (pgErr.Code != "23514" || !strings.HasPrefix(pgErr.ConstraintName, c.table+"_")):
			t.Errorf("%s SET %s: SQLSTATE %s on %q (%s), want 23514 on a constraint of %s", c.table, c.set, pgErr.Code, pgErr.ConstraintName, pgErr.Message, c.table)
		}
	}
	// Nothing above changed the order.
	if n := count(t, b, `SELECT count(*) FROM steps WHERE order_id = $1 AND process_state = 'pending' AND priority = 0 AND name = 'step1'`, o.OrderID); n != 1 {
		t.Fatalf("the order's step changed: %d rows as inserted", n)
	}
}

// TestFewRuleTextsAreReadAtEachWrite: PostgreSQL reads every CHECK
// constraint of a table back from its stored node text, and prepares it,
// at each statement that writes a row of the table. The rules of one
// column of steps and orders are their columns' domains (read once a
// session, checked where a statement assigns the column), so that little
// text is left to read at each write: 4,150 and 1,194 characters, against
// 12,809 and 7,992 when every rule was a CHECK constraint. Only the state
// lists, whose columns triggers and partial indexes read, the step's
// number (a column of the key) and the rules of several columns stay
// CHECK constraints.
func TestFewRuleTextsAreReadAtEachWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, c := range []struct {
		table string
		most  int
	}{{"steps", 5000}, {"orders", 1500}} {
		if n := count(t, b, `SELECT coalesce(sum(length(conbin::text)), 0)::int FROM pg_constraint
			WHERE contype = 'c' AND conrelid = $1::regclass`, c.table); n > c.most {
			t.Errorf("the CHECK constraints of %s hold %d characters of node text, more than %d", c.table, n, c.most)
		}
		if n := count(t, b, `SELECT count(*) FROM pg_constraint WHERE contype = 'c' AND conrelid = $1::regclass
			AND cardinality(conkey) = 1 AND conname NOT IN ('steps_process_state_check', 'steps_kind_check', 'steps_step_check', 'orders_status_check')`,
			c.table); n != 0 {
			t.Errorf("%s has %d CHECK constraints of one column: make them the column's domain's", c.table, n)
		}
	}
}
