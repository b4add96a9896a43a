package statestore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/harness/testenv"
	"sas/internal/statestore"
	"sas/internal/statestore/lab"
)

// explainVisits runs the prepared statement name (with args) in a
// transaction that is rolled back, and returns how many rows its plan
// visited (every scan's rows, those its filters removed included, and
// every row a join's filter removed, times its loops) and how many rows
// its outermost node returned.
func explainVisits(t *testing.T, ctx context.Context, conn *pgx.Conn, name, args string) (visited, rows int) {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var out []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE `+name+`(`+args+`)`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	var plan []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatal(err)
	}
	return plan[0].Plan.visited(), plan[0].Plan.Rows
}

type planNode struct {
	Type          string     `json:"Node Type"`
	Relation      string     `json:"Relation Name"`
	Rows          int        `json:"Actual Rows"`
	Loops         int        `json:"Actual Loops"`
	RemovedFilter int        `json:"Rows Removed by Filter"`
	RemovedJoin   int        `json:"Rows Removed by Join Filter"`
	Plans         []planNode `json:"Plans"`
}

func (n planNode) visited() int {
	v := n.RemovedJoin * max(n.Loops, 1)
	if strings.HasSuffix(n.Type, "Scan") && n.Type != "CTE Scan" && n.Type != "Function Scan" && n.Type != "Subquery Scan" {
		v += (n.Rows + n.RemovedFilter) * max(n.Loops, 1)
	}
	for _, c := range n.Plans {
		v += c.visited()
	}
	return v
}

// keyedConn is one session of a pool as the services open it (keyed
// plans), released and closed when the test ends.
func keyedConn(t *testing.T, b bundle) *pgxpool.Conn {
	t.Helper()
	pool, err := statestore.Open(statestore.Options{URL: b.url, MaxConns: 1, Keyed: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctxFor(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// TestHotStatementsVisitRowsByTheirWork: the claim and the batched reply
// visit a number of rows that follows the steps they claim or apply, not
// the rows the tables hold: with 6,000 pending orders they visit no more
// a step than with 200, through the plans a pool keeps (generic, made
// when the tables were empty and had no statistics, as a new schema's
// are with autovacuum off). Such a plan scanned the received orders for
// each claim, and every step for each reply of a batch: the claim's
// slow mode.
func TestHotStatementsVisitRowsByTheirWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	conn := keyedConn(t, b)
	// The plans a pool keeps: generic, made once, when the tables were
	// small and had no statistics, then used as they grow.
	for _, stmt := range []string{
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE claim(text, int, text[], int[]) AS ` + statestore.ClaimKindsSQL,
		`PREPARE reply(uuid[], int[], int[], jsonb[], timestamptz[], timestamptz[], bigint[], text, boolean, text[], bigint) AS ` + statestore.ApplyOKRepliesSQL,
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		_, _ = conn.Exec(context.Background(), `DEALLOCATE claim; DEALLOCATE reply; RESET plan_cache_mode`)
	}()
	// Their generic plans are made now, for empty tables.
	explainVisits(t, ctx, conn.Conn(), "claim", `'s', 1, '{k}', '{1}'`)
	explainVisits(t, ctx, conn.Conn(), "reply", `'{}', '{}', '{}', '{}', '{}', '{}', '{}', 's', true, '{}', 10000`)
	const batch = 50
	perStep := map[int][2]float64{}
	for _, backlog := range []int{200, 6000} {
		orders := make([]statestore.NewOrder, backlog-count(t, b, `SELECT count(*) FROM orders`))
		for i := range orders {
			orders[i] = order(1, time.Hour, 3)
			orders[i].Steps[0].Agent = "k"
		}
		for len(orders) > 0 {
			n := min(len(orders), 500)
			if _, errs := b.store.InsertOrders(ctx, orders[:n]); errs[0] != nil {
				t.Fatal(errs[0])
			}
			orders = orders[n:]
		}
		claim, claimed := explainVisits(t, ctx, conn.Conn(), "claim", fmt.Sprintf(`'s', %d, '{k}', '{%d}'`, batch, batch))
		if claimed != batch {
			t.Fatalf("with %d pending: claimed %d, want %d", backlog, claimed, batch)
		}
		// Replies to a batch claimed for real.
		steps, err := b.store.ClaimKinds(ctx, "s", map[string]int{"k": batch})
		if err != nil || len(steps) != batch {
			t.Fatalf("claim: %d %v", len(steps), err)
		}
		var ids, nums, attempts []string
		for _, s := range steps {
			ids, nums, attempts = append(ids, s.OrderID), append(nums, fmt.Sprint(s.Step)), append(attempts, fmt.Sprint(s.Attempt))
		}
		arr := func(xs []string) string { return fmt.Sprintf("'{%s}'", joinComma(xs)) }
		nulls := make([]string, batch)
		for i := range nulls {
			nulls[i] = "NULL"
		}
		reply, applied := explainVisits(t, ctx, conn.Conn(), "reply", fmt.Sprintf(`%s, %s, %s, %s, %s, %s, %s, 's', true, '{}', 10000`, arr(ids), arr(nums), arr(attempts), arr(nulls), arr(nulls), arr(nulls), arr(nulls)))
		if applied != batch {
			t.Fatalf("with %d pending: applied %d replies, want %d", backlog, applied, batch)
		}
		perStep[backlog] = [2]float64{float64(claim) / batch, float64(reply) / batch}
		t.Logf("%d orders pending: %.1f rows visited a claimed step, %.1f an applied reply", backlog, perStep[backlog][0], perStep[backlog][1])
	}
	for i, what := range []string{"claim", "reply"} {
		small, large := perStep[200][i], perStep[6000][i]
		if large > 1.3*small+10 {
			t.Errorf("the %s visits %.1f rows a step with 6,000 orders pending, %.1f with 200: its cost follows the table", what, large, small)
		}
	}
}

func joinComma(xs []string) string { return strings.Join(xs, ",") }

// indexBuffers runs the prepared statement name (with args) in a
// transaction that is rolled back and returns how many buffers its index
// scans read (the index's pages and the rows they lead to).
func indexBuffers(t *testing.T, ctx context.Context, conn *pgx.Conn, name, args string) int {
	t.Helper()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var out []byte
	if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE `+name+`(`+args+`)`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	type node struct {
		Type  string `json:"Node Type"`
		Hit   int    `json:"Shared Hit Blocks"`
		Read  int    `json:"Shared Read Blocks"`
		Plans []node `json:"Plans"`
	}
	var plan []struct {
		Plan node `json:"Plan"`
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatal(err)
	}
	var sum func(n node) int
	sum = func(n node) int {
		if strings.HasPrefix(n.Type, "Index") {
			return n.Hit + n.Read
		}
		total := 0
		for _, c := range n.Plans {
			total += sum(c)
		}
		return total
	}
	return sum(plan[0].Plan)
}

// TestVacuumDeadKeepsTheClaimShort: 4,000 orders run and ended leave
// their steps' entries dead at the front of the pending index, older than
// any live one, which a claim reads through page by page; once the
// leader vacuums the tables with many dead rows (VacuumDead), a claim's
// pick of the next 50 reads what it reads on a new schema.
func TestVacuumDeadKeepsTheClaimShort(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	conn := keyedConn(t, b)
	// The claim's pick, alone and without its locks: what it reads of the
	// pending index.
	if _, err := conn.Exec(ctx, `PREPARE pick(text, int) AS SELECT order_id, step FROM steps
		WHERE process_state = 'pending' AND agent = $1 AND fair_key IS NULL AND available_at <= now()
		ORDER BY agent, priority DESC, available_at, order_id, step LIMIT $2`); err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = conn.Exec(context.Background(), `DEALLOCATE pick`) }()
	write := func(n int) {
		t.Helper()
		orders := make([]statestore.NewOrder, n)
		for i := range orders {
			orders[i] = order(1, time.Hour, 3)
			orders[i].Steps[0].Agent = "k"
		}
		for len(orders) > 0 {
			k := min(len(orders), 500)
			if _, errs := b.store.InsertOrders(ctx, orders[:k]); errs[0] != nil {
				t.Fatal(errs[0])
			}
			orders = orders[k:]
		}
	}
	write(50)
	fresh := indexBuffers(t, ctx, conn.Conn(), "pick", `'k', 50`)
	// A history: 4,000 more orders claimed and answered.
	write(4000)
	for {
		steps, err := b.store.ClaimKinds(ctx, "s", map[string]int{"k": 500})
		if err != nil {
			t.Fatal(err)
		}
		if len(steps) == 0 {
			break
		}
		replies := make([]statestore.Reply, len(steps))
		for i, s := range steps {
			replies[i] = statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Actor: "s"}
		}
		for _, err := range func() []error { _, errs := b.store.ApplyReplies(ctx, replies); return errs }() {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	write(50)
	before := indexBuffers(t, ctx, conn.Conn(), "pick", `'k', 50`)
	waitDeadSteps(ctx, t, b.pool, 4000)
	vacuumed, err := b.store.VacuumDead(ctx, 1000, 0)
	if err != nil || !slices.Contains(vacuumed, "steps") {
		t.Fatalf("vacuumed %v (%v), want steps among them", vacuumed, err)
	}
	// A vacuum removes only the rows no open transaction may still see:
	// the tests running beside this one hold back that horizon for a
	// while, so the leader's next rounds remove the rest.
	after := indexBuffers(t, ctx, conn.Conn(), "pick", `'k', 50`)
	for deadline := time.Now().Add(20 * time.Second); after > 2*fresh+2 && time.Now().Before(deadline); {
		if _, err := b.store.VacuumDead(ctx, 1, 0); err != nil {
			t.Fatal(err)
		}
		after = indexBuffers(t, ctx, conn.Conn(), "pick", `'k', 50`)
	}

	t.Logf("a claim's pick of 50 read %d buffers on a new schema, %d behind 4,000 ended orders, %d once vacuumed", fresh, before, after)
	if after > 2*fresh+2 || before <= 2*after {
		t.Fatalf("a claim of 50 reads %d buffers once vacuumed (%d before, %d on a new schema)", after, before, fresh)
	}
}

// waitDeadSteps waits until the statistics count at least n dead step
// rows.
func waitDeadSteps(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "dead step rows in the statistics", func() bool {
		var dead int
		if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = current_schema() AND relname = 'steps'`).Scan(&dead); err != nil {
			t.Fatal(err)
		}
		return dead >= n
	})
}

// TestGaugesVisitOnlyTheLiveWork: the supervisor reads its gauges every
// few seconds; each read must visit rows by the work in flight, not by
// the table, which holds every ended order's steps until retention.
func TestGaugesVisitOnlyTheLiveWork(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := lab.Fill(ctx, b.pool, 4000, 0); err != nil {
		t.Fatal(err)
	}
	const live = 100
	orders := make([]statestore.NewOrder, live)
	for i := range orders {
		orders[i] = order(1, time.Hour, 3)
	}
	if _, errs := b.store.InsertOrders(ctx, orders); errs[0] != nil {
		t.Fatal(errs[0])
	}
	for name, q := range statestore.GaugeStatements() {
		var out []byte
		if err := b.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q[0].(string), q[1:]...).Scan(&out); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var plan []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(out, &plan); err != nil {
			t.Fatal(err)
		}
		// 24,000 ended steps and 4,000 orders beside 100 live orders.
		if v := plan[0].Plan.visited(); v > 4*live+100 {
			t.Errorf("%s visits %d rows for %d live orders: it reads what has ended", name, v, live)
		}
	}
}
