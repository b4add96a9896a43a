package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// TestTheDoorIsTheRegistry: the moves the state store lets a step and an
// order make (step_moves, order_moves, which its doors check) are those
// internal/workflow/shapes.go declares, no more and no fewer, each step
// move with the step event it tells.
func TestTheDoorIsTheRegistry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want, got []string
	for _, m := range workflow.StepMoves() {
		want = append(want, fmt.Sprintf("%s>%s via %q %q tells %q", m.From, m.To, m.Via, m.ViaWhy, m.Event))
	}
	got = texts(t, b, `SELECT format('%s>%s via %s %s tells %s', from_state, to_state,
		to_json(coalesce(via, ''))::text, to_json(coalesce(via_why, ''))::text, to_json(coalesce(event, ''))::text) FROM step_moves`)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		t.Errorf("step_moves differs from workflow.StepMoves:\n table:    %q\n registry: %q", got, want)
	}
	want, got = nil, nil
	for _, m := range workflow.OrderMoves() {
		want = append(want, m.From+">"+m.To)
	}
	got = texts(t, b, `SELECT from_status || '>' || to_status FROM order_moves`)
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(want, got) {
		t.Errorf("order_moves differs from workflow.OrderMoves:\n table:    %q\n registry: %q", got, want)
	}
}

// texts are the rows of a query of one text column.
func texts(t *testing.T, b bundle, sql string, args ...any) []string {
	t.Helper()
	rows, err := b.pool.Query(ctxFor(t), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// refusedMove reports whether err is the door's refusal.
func refusedMove(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" &&
		(strings.Contains(pgErr.Message, "may not move") || strings.Contains(pgErr.Message, "without passing the door"))
}

// TestTheDoorWalksEveryShapesPaths walks every path of every shape
// (workflow.Shapes) through the door of steps, one statement per move,
// and finds each move written to the history as it was made (a move by
// way of another state as two); then tries what no path does, directly:
// a move the table does not hold, and a change of state that does not
// count the move, for a step and for an order. Both are refused and
// change nothing.
func TestTheDoorWalksEveryShapesPaths(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	via := map[[2]string]workflow.StepMove{}
	for _, m := range workflow.StepMoves() {
		if m.Via != "" {
			via[[2]string{m.From, m.To}] = m
		}
	}
	// what every state's row must hold (a claim's holder, a due time)
	const ready = `locked_by = 'walker', complete_by = now() + interval '1 hour', due_at = now() + interval '1 hour'`
	walked := 0
	for _, sh := range workflow.Shapes() {
		for _, path := range sh.Paths {
			o := order(1, time.Minute, 3)
			insert(t, b, o)
			moves := workflow.PathMoves(path)
			testenv.Forge(t, b.pool, `UPDATE steps SET process_state = $2, `+ready+` WHERE order_id = $1 AND step = 1`, o.OrderID, moves[0][0])
			var want []string
			for i, mv := range moves {
				why := fmt.Sprintf("%s move %d", sh.Name, i+1)
				if _, err := b.pool.Exec(ctx, `UPDATE steps SET process_state = $2, moves = moves + 1, moved_by = 'walker', moved_why = $3, `+ready+`
					WHERE order_id = $1 AND step = 1`, o.OrderID, mv[1], why); err != nil {
					t.Fatalf("shape %s, path %q: the door refused %s to %s: %v", sh.Name, path, mv[0], mv[1], err)
				}
				if v, ok := via[mv]; ok {
					want = append(want, mv[0]+">"+v.Via+"/"+v.ViaWhy, v.Via+">"+mv[1]+"/"+why)
				} else {
					want = append(want, mv[0]+">"+mv[1]+"/"+why)
				}
				walked++
			}
			got := texts(t, b, `SELECT from_state || '>' || to_state || '/' || reason FROM transitions
				WHERE order_id = $1 AND step = 1 AND actor = 'walker' ORDER BY id`, o.OrderID)
			if !slices.Equal(got, want) {
				t.Errorf("shape %s, path %q: history %q, want %q", sh.Name, path, got, want)
			}
		}
	}
	if walked < len(workflow.StepMoves()) {
		t.Fatalf("walked %d moves, fewer than the %d declared", walked, len(workflow.StepMoves()))
	}

	o := order(2, time.Minute, 3)
	insert(t, b, o)
	histRows := func() int {
		return count(t, b, `SELECT count(*) FROM transitions WHERE order_id = $1`, o.OrderID)
	}
	before := histRows()
	for _, stmt := range []string{
		// step 1 is pending, step 2 waiting, the order received
		`UPDATE steps SET process_state = 'processed', moves = moves + 1, moved_by = 'x', moved_why = 'y' WHERE order_id = $1 AND step = 1`,
		`UPDATE steps SET process_state = 'processed', moves = moves + 1, moved_by = 'x', moved_why = 'y' WHERE order_id = $1 AND step = 2`,
		`UPDATE steps SET process_state = 'processing', ` + ready + ` WHERE order_id = $1 AND step = 1`,
		`UPDATE steps SET process_state = 'processing', moves = moves + 2, moved_by = 'x', moved_why = 'y', ` + ready + ` WHERE order_id = $1 AND step = 1`,
		`UPDATE orders SET status = 'processing' WHERE order_id = $1`,
		`UPDATE orders SET status = 'received', moves = moves + 1, moved_by = 'x', moved_why = 'y' WHERE order_id = $1`,
		`UPDATE orders SET status = 'compensating', moves = moves + 1, moved_by = 'x', moved_why = 'y' WHERE order_id = $1;
		 UPDATE orders SET status = 'processing', moves = moves + 1, moved_by = 'x', moved_why = 'y' WHERE order_id = $1`,
	} {
		if strings.Contains(stmt, ";") {
			_, err := b.pool.Exec(ctx, "BEGIN; "+strings.ReplaceAll(stmt, "$1", "'"+o.OrderID+"'")+"; COMMIT")
			if !refusedMove(err) {
				t.Errorf("%s: %v, want the door's refusal", stmt, err)
			}
			continue
		}
		if _, err := b.pool.Exec(ctx, stmt, o.OrderID); !refusedMove(err) {
			t.Errorf("%s: %v, want the door's refusal", stmt, err)
		}
	}
	var states, status string
	if err := b.pool.QueryRow(ctx, `SELECT string_agg(process_state, ' ' ORDER BY step), (SELECT status FROM orders WHERE order_id = $1)
		FROM steps WHERE order_id = $1`, o.OrderID).Scan(&states, &status); err != nil {
		t.Fatal(err)
	}
	if states != "pending waiting" || status != "received" || histRows() != before {
		t.Fatalf("a refused move changed something: steps %q, order %q, history %d rows (was %d)", states, status, histRows(), before)
	}
}

// TestAnOrdersMoveIsWrittenAfterItsSteps: in the claim's and the batched
// reply's single statements, which move steps and their order at once,
// the history tells the order's move after the step's that led to it.
func TestAnOrdersMoveIsWrittenAfterItsSteps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := order(1, time.Minute, 3)
	insert(t, b, o)
	claimed, err := b.store.ClaimPending(ctx, "s1", 10, "")
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	c := claimed[0]
	res, errs := b.store.ApplyReplies(ctx, []statestore.Reply{{OrderID: o.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s1"}})
	if errs[0] != nil || res[0].OrderStatus != statestore.OrderCompleted {
		t.Fatalf("reply: %+v %v", res[0], errs[0])
	}
	got := texts(t, b, `SELECT coalesce(step::text, 'order') || ' ' || coalesce(from_state, '') || '>' || to_state
		FROM transitions WHERE order_id = $1 ORDER BY id`, o.OrderID)
	want := []string{"order >received", "1 >pending", "1 pending>processing", "order received>processing",
		"1 processing>processed", "order processing>completed"}
	if !slices.Equal(got, want) {
		t.Fatalf("history %q, want %q", got, want)
	}
}

// TestTheDoorWritesAStatementOfManyMovesInLinearTime: a claim of 40 steps
// and a batch of 40 replies that claims the next 40 move more rows than
// the doors' small-statement insert is planned for; their history is the
// same, move for move and in the same order, as that of an order run
// alone, and the doors pair each row's old and new versions without
// comparing every row with every other (their inserts' plans, read
// through auto_explain, remove no more rows by a join filter than they
// write: the nested loop planned for one row removed 40 × 39).
func TestTheDoorWritesAStatementOfManyMovesInLinearTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, plans := explaining(t, b)
	run := func(orders []statestore.NewOrder) { runTwoSteps(t, store, orders) }
	history := func(id string) []string {
		return texts(t, b, `SELECT coalesce(step::text, 'order') || ' ' || coalesce(from_state, '') || '>' || to_state || ' ' || reason
			FROM transitions WHERE order_id = $1 ORDER BY id`, id)
	}
	alone := order(2, time.Minute, 3)
	run([]statestore.NewOrder{alone})
	want := history(alone.OrderID)
	if len(want) < 9 || !strings.HasPrefix(want[len(want)-1], "order processing>completed") {
		t.Fatalf("an order alone: history %q", want)
	}
	*plans = nil
	many := make([]statestore.NewOrder, 40)
	for i := range many {
		many[i] = order(2, time.Minute, 3)
	}
	run(many)
	for _, o := range many {
		if got := history(o.OrderID); !slices.Equal(got, want) {
			t.Fatalf("order %s of 40: history %q, want %q (as alone)", o.OrderID, got, want)
		}
	}
	inserts := 0
	for _, p := range *plans {
		var e struct {
			Query string   `json:"Query Text"`
			Plan  planNode `json:"Plan"`
		}
		if err := json.Unmarshal([]byte(p), &e); err != nil {
			t.Fatalf("%v: %s", err, p)
		}
		if !strings.HasPrefix(strings.TrimSpace(e.Query), "INSERT INTO transitions") || !strings.Contains(e.Query, "old_rows") {
			continue
		}
		inserts++
		written := 0
		for _, c := range e.Plan.Plans {
			written += c.Rows
		}
		if r := e.Plan.removedByJoins(); r > written {
			t.Errorf("a door's insert removed %d rows by a join filter to write %d:\n%s", r, written, p)
		}
	}
	if inserts < 6 {
		t.Fatalf("%d plans of the doors' inserts read, want the steps' and the orders' of three statements", inserts)
	}
}

// explaining is a store of one connection whose every statement, and
// every statement of the functions and triggers it runs, has its plan
// as executed (auto_explain, JSON, rows but no timings) added to plans.
func explaining(t *testing.T, b bundle) (*statestore.Store, *[]string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	plans := new([]string)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if _, plan, ok := strings.Cut(n.Message, "plan:\n"); ok {
			*plans = append(*plans, plan)
		}
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on;
			SET auto_explain.log_timing = off; SET auto_explain.log_nested_statements = on; SET auto_explain.log_format = json;
			SET auto_explain.log_level = notice`)
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return statestore.New(pool), plans
}

// runTwoSteps inserts orders of two steps, claims their first steps,
// answers them in one batch that claims the second steps, then answers
// those: each one statement for all the orders.
func runTwoSteps(t *testing.T, store *statestore.Store, orders []statestore.NewOrder) {
	t.Helper()
	ctx := ctxFor(t)
	if _, errs := store.InsertOrders(ctx, orders); errs[0] != nil {
		t.Fatal(errs[0])
	}
	claimed, err := store.ClaimKinds(ctx, "s1", map[string]int{"agent": len(orders)})
	if err != nil || len(claimed) != len(orders) {
		t.Fatalf("claim: %d of %d, %v", len(claimed), len(orders), err)
	}
	for range 2 {
		replies := make([]statestore.Reply, len(claimed))
		for i, c := range claimed {
			replies[i] = statestore.Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt, OK: true, Actor: "s1"}
		}
		res, errs := store.ApplyRepliesClaiming(ctx, replies, []string{"agent"})
		claimed = claimed[:0]
		for i := range res {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if c := res[i].Claimed; c != nil {
				claimed = append(claimed, *c)
			}
		}
	}
}

// removedByJoins is how many rows a plan's join filters removed, at
// every loop.
func (n planNode) removedByJoins() int {
	r := n.RemovedJoin * max(n.Loops, 1)
	for _, c := range n.Plans {
		r += c.removedByJoins()
	}
	return r
}

// visitedIn is how many rows of relation a plan's nodes read: those they
// returned and those their filters removed, at every loop.
func (n planNode) visitedIn(relation string) int {
	v := 0
	if n.Relation == relation {
		v = (n.Rows + n.RemovedFilter) * max(n.Loops, 1)
	}
	for _, c := range n.Plans {
		v += c.visitedIn(relation)
	}
	return v
}

// TestAMoveReadsNoMoreWorkflowVersionsAsMoreAreStored: what an order's
// moves read of workflow_versions does not grow with the versions stored.
// The doors ask at each statement whether any version declares webhooks;
// they read webhook_versions (migration 0053), not every definition: an
// order run after 300 versions of a thirty-step workflow were stored reads
// as many rows of workflow_versions as one run after three (before, each
// door's question read all 303, out of line, at every statement).
func TestAMoveReadsNoMoreWorkflowVersionsAsMoreAreStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store, plans := explaining(t, b)
	ctx := ctxFor(t)
	stored := 0
	storeVersions := func(n int) {
		t.Helper()
		vs := make([]statestore.WorkflowVersion, n)
		for i := range vs {
			stored++
			steps := make([]string, 30)
			for j := range steps {
				steps[j] = fmt.Sprintf(`{"action": "step_%d_%016x", "agent": "agent_%d", "timeout": "30s", "retry": {"max": 3}}`, j, stored*100+j, j%5)
			}
			vs[i] = statestore.WorkflowVersion{Name: fmt.Sprintf("wf%d", stored%7), Version: fmt.Sprintf("%016x", stored),
				Definition: []byte(`{"steps": [` + strings.Join(steps, ", ") + `]}`)}
		}
		if err := store.StoreWorkflowVersions(ctx, vs); err != nil {
			t.Fatal(err)
		}
	}
	reads := func() int {
		t.Helper()
		*plans = nil
		runTwoSteps(t, store, []statestore.NewOrder{order(2, time.Minute, 3)})
		v := 0
		for _, p := range *plans {
			var e struct {
				Plan planNode `json:"Plan"`
			}
			if err := json.Unmarshal([]byte(p), &e); err != nil {
				t.Fatalf("%v: %s", err, p)
			}
			v += e.Plan.visitedIn("workflow_versions")
		}
		if len(*plans) < 6 {
			t.Fatalf("%d plans read, want at least the statements of an order's moves and their doors'", len(*plans))
		}
		return v
	}
	storeVersions(3)
	few := reads()
	storeVersions(300)
	if many := reads(); many != few {
		t.Fatalf("an order's moves read %d rows of workflow_versions with %d versions stored, %d with 3", many, stored, few)
	}
}
