package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sas/internal/statestore"
	"sas/internal/statestore/lab"
)

// fillOrders writes n orders as they look once run (lab.Fill), 50
// of them in flight.
func fillOrders(t *testing.T, s stack, n int) {
	t.Helper()
	r, err := lab.Fill(context.Background(), s.pool, n, 50)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %d orders in %v, vacuumed and analyzed in %v more; orders, steps, history and alerts take %s",
		n, r.Filled.Round(time.Second), r.Vacuumed.Round(time.Second), r.Size)
}

var serverTimingRE = regexp.MustCompile(`app;dur=([0-9.]+)`)

// timings collects the server time of each kind of page.
type timings map[string][]time.Duration

func (tm timings) get(t *testing.T, c *webClient, kind, path string) string {
	t.Helper()
	status, body := c.do("GET", path, nil)
	if status != http.StatusOK {
		t.Fatalf("GET %s: %d\n%s", path, status, body)
	}
	m := serverTimingRE.FindStringSubmatch(c.last.Header.Get("Server-Timing"))
	if m == nil {
		t.Fatalf("GET %s: no Server-Timing", path)
	}
	ms, _ := strconv.ParseFloat(m[1], 64)
	tm[kind] = append(tm[kind], time.Duration(ms*float64(time.Millisecond)))
	return body
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// pageSizeShown is how many orders a page of the orders list shows.
const pageSizeShown = 50

var orderLinkRE = regexp.MustCompile(`href="/orders/([0-9a-f-]{36})"`)
var nextRE = regexp.MustCompile(`href="(/orders\?[^"]*after=[^"]*)" id="next"`)

// TestConsoleAtAMillionOrders is the console's benchmark (make
// bench-console): with SAS_CONSOLE_BENCH_ORDERS orders in the store
// (1,000,000 there, each with two search attributes), the orders list,
// deep pages and every filter (search attributes too), and
// the order page answer within 50 ms p95 of server time; the overview's
// queries read no table whole. Skipped unless the variable is set.
func TestConsoleAtAMillionOrders(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SAS_CONSOLE_BENCH_ORDERS"))
	if n <= 0 {
		t.Skip("the console's benchmark: make bench-console (SAS_CONSOLE_BENCH_ORDERS=1000000)")
	}
	s := newStack(t)
	fillOrders(t, s, n)
	// Search attributes as the built-in order_approval declares them:
	// a customer among 10,000 and an amount, for every order.
	if _, err := s.pool.Exec(context.Background(), `INSERT INTO order_attributes (order_id, name, created_at, v_text)
		SELECT order_id, 'customer', created_at, 'c-' || (abs(hashtext(order_id::text)) % 10000) FROM orders;
		INSERT INTO order_attributes (order_id, name, created_at, v_num)
		SELECT order_id, 'amount', created_at, abs(hashtext('a' || order_id::text)) % 100000 FROM orders;
		ANALYZE order_attributes`); err != nil {
		t.Fatal(err)
	}
	c := startConsole(t, s)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("login: %d", status)
	}
	tm := timings{}
	// Warm the cache as a running console's would be.
	for range 3 {
		tm.get(t, alice, "warm-up", "/orders")
		tm.get(t, alice, "warm-up", "/")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		body := tm.get(t, alice, "orders: first page", "/orders")
		if len(orderLinkRE.FindAllStringSubmatch(body, -1)) != pageSizeShown {
			t.Fatalf("the first page does not show %d orders", pageSizeShown)
		}
		// Twenty pages deep, following the cursor.
		for range 20 {
			m := nextRE.FindStringSubmatch(body)
			if m == nil {
				t.Fatal("no next page")
			}
			body = tm.get(t, alice, "orders: pages 2-21", strings.ReplaceAll(m[1], "&amp;", "&"))
		}
		for _, f := range []string{"status=completed", "status=error", "status=failed", "status=processing", "workflow=single", "workflow=order_hold&status=error"} {
			tm.get(t, alice, "orders: one filter or two", "/orders?"+f)
		}
		day := time.Now().UTC().Add(-time.Duration(1+rng.IntN(28)) * 24 * time.Hour)
		tm.get(t, alice, "orders: time range", "/orders?from="+day.Format("2006-01-02T15:04")+"&to="+day.Add(time.Hour).Format("2006-01-02T15:04"))
		prefix := fmt.Sprintf("%04x", rng.IntN(1<<16))
		tm.get(t, alice, "orders: id prefix", "/orders?id="+prefix)
		customer := fmt.Sprintf("c-%d", rng.IntN(10000))
		for _, f := range []string{"where=customer%3D" + customer, "where=customer%3D" + customer + "&status=completed",
			"where=amount%3E%3D99000", "where=amount%3C5&where=customer%21%3Dc-1"} {
			tm.get(t, alice, "orders: search attributes", "/orders?"+f)
		}
		tm.get(t, alice, "overview", "/")
	}
	// Orders anywhere in the table, old and new.
	for range 200 {
		i := 1 + rng.IntN(n)
		var id string
		if err := s.pool.QueryRow(context.Background(), `SELECT md5('o' || $1::int)::uuid::text`, i).Scan(&id); err != nil {
			t.Fatal(err)
		}
		tm.get(t, alice, "order page", "/orders/"+id)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d orders; server time (Server-Timing), ms\n%-28s %6s %7s %7s %7s\n", n, "page", "n", "p50", "p95", "max")
	kinds := []string{"orders: first page", "orders: pages 2-21", "orders: one filter or two", "orders: time range", "orders: id prefix",
		"orders: search attributes", "order page", "overview"}
	for _, k := range kinds {
		ds := tm[k]
		fmt.Fprintf(&b, "%-28s %6d %7.1f %7.1f %7.1f\n", k, len(ds), ms(pct(ds, 0.5)), ms(pct(ds, 0.95)), ms(slices.Max(ds)))
	}
	plans, err := statestore.New(s.pool).ExplainOverview(context.Background(), 5*time.Minute, statestore.SupervisorLease)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		fmt.Fprintf(&b, "\n-- %s\n%s\n", p.Name, p.Plan)
		if strings.Contains(p.Plan, "Seq Scan on orders") || strings.Contains(p.Plan, "Seq Scan on steps") || strings.Contains(p.Plan, "transitions") {
			t.Errorf("the overview's %q reads a whole table or the history:\n%s", p.Name, p.Plan)
		}
	}
	t.Log(b.String())
	for _, k := range kinds[:7] {
		if p95 := pct(tm[k], 0.95); p95 > 50*time.Millisecond {
			t.Errorf("%s: p95 %v over 50 ms", k, p95)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
