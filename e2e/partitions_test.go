package e2e

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"sas/client"
	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/partition"
	"sas/internal/scheduler"
	"sas/internal/statestore"
	"sas/internal/submitter"
	"sas/internal/workflow"
)

// TestPartitionsRouteByOrderID, with sasctl and a RabbitMQ node of its
// own with the consistent-hash exchange plugin: sasctl partitions setup
// declares a layout of three partitions over 256 buckets; 4,000 submits
// published through its routing exchange, the order id as routing key,
// each reach exactly the partition partition.Layout.Of names for its id
// (the broker's hash and sas's agree), each partition's count within
// five standard deviations of its buckets' share and the buckets'
// counts passing a χ² test; after setup runs again they still do; the
// Go client given the routing exchange publishes there as
// well. Then three state stores (schemas of the test database), each
// with a whole sas on it, and RabbitMQ restarted under them (its
// application, in the node's runtime: every connection cut, the ring
// renumbered as it recovers its bindings): 600 orders each written
// and ended once in the store its id names, those the ring sent astray
// passed on by the submitters, and
// none once sasctl partitions setup --renumber has bound the buckets in
// order again; sasctl shows an order from its store and lists the newest
// of all three merged.
func TestPartitionsRouteByOrderID(t *testing.T) {
	t.Parallel()
	node := startRabbitNodes(t, "saschx", "5740", 1, "", "rabbitmq_consistent_hash_exchange")
	dir := t.TempDir()
	file := filepath.Join(dir, "partitions.yaml")
	layout := "exchange: saschx.route\nbuckets: 256\npartitions:\n"
	for i := 1; i <= 3; i++ {
		layout += fmt.Sprintf("  - {name: p%d, queue_prefix: saschx.p%d., database_url_env: SAS_P%d_DATABASE_URL}\n", i, i, i)
	}
	if err := os.WriteFile(file, []byte(layout), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := partition.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	environ := env("SAS_AMQP_URL="+node.urls, "SAS_PARTITIONS_FILE="+file, "SAS_QUEUE_PREFIX=saschx.tool.")

	// Each partition's submit queue and entrance, as its submitter declares them.
	conn, err := amqp.Dial(node.urls)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Partitions {
		topo := broker.Topology{Prefix: p.QueuePrefix, QueueType: broker.QueueClassic, Inputs: []string{submitter.Input}, Entrances: []string{submitter.Input}}
		if err := topo.Declare(ch); err != nil {
			t.Fatal(err)
		}
	}
	ch.Close()
	conn.Close()

	out, errOut, code := sasctl(t, environ, "partitions", "setup")
	if code != 0 || !strings.Contains(out, "p1: 86 buckets (0-85)") || !strings.Contains(out, "p3: 85 buckets (171-255)") {
		t.Fatalf("partitions setup: exit %d\n%s%s", code, out, errOut)
	}
	submit := func(n int) []string {
		t.Helper()
		out, errOut, code := sasctl(t, environ, "submit", "--count", fmt.Sprint(n), "--print-ids", "--concurrency", "128")
		ids := strings.Fields(out)
		if code != 0 || len(ids) != n {
			t.Fatalf("sasctl submit: exit %d, %d of %d ids\n%s", code, len(ids), n, errOut)
		}
		return ids
	}
	// drain takes every message of each partition's submit queue and
	// checks it is there by its id's bucket; it returns how many each
	// partition took.
	drain := func(want int) []int {
		t.Helper()
		conn, err := amqp.Dial(node.urls)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, len(l.Partitions))
		for i, p := range l.Partitions {
			q := p.QueuePrefix + submitter.Input
			deadline := time.Now().Add(time.Minute)
			for {
				msg, ok, err := ch.Get(q, true)
				if err != nil {
					t.Fatalf("get from %s: %v", q, err)
				}
				if !ok {
					break
				}
				if _, owner := l.Of(msg.MessageId); owner.Name != p.Name {
					t.Fatalf("order %s reached partition %s; its bucket %d is %s's", msg.MessageId, p.Name, partition.BucketOf(msg.MessageId, l.Buckets), owner.Name)
				}
				counts[i]++
				if time.Now().After(deadline) {
					t.Fatalf("draining %s took over a minute", q)
				}
			}
		}
		total := 0
		for _, c := range counts {
			total += c
		}
		if total != want {
			t.Fatalf("the partitions took %d messages (%v), want %d: each exactly once", total, counts, want)
		}
		return counts
	}

	ids := submit(4000)
	counts := drain(len(ids))
	// Each partition's count is binomial: its buckets' share of the
	// 4,000 (86, 85 and 85 of 256), give or take five standard
	// deviations (about 11 %: a fixed bound near one standard deviation
	// would fail runs by chance alone). Where each one went is checked
	// one by one above.
	for i, c := range counts {
		share := float64(len(l.Owned(i))) / float64(l.Buckets)
		want, sd := share*float64(len(ids)), math.Sqrt(float64(len(ids))*share*(1-share))
		if math.Abs(float64(c)-want) > 5*sd {
			t.Errorf("partition %s took %d of 4,000 orders, want %.0f ± %.0f (five standard deviations) for its %d buckets (%v)",
				l.Partitions[i].Name, c, want, 5*sd, len(l.Owned(i)), counts)
		}
	}
	// χ² of the buckets' counts against an even spread: 255 degrees of
	// freedom, 330.5 its critical value at p = 0.001.
	buckets := make([]float64, l.Buckets)
	for _, id := range ids {
		buckets[partition.BucketOf(id, l.Buckets)]++
	}
	expected := float64(len(ids)) / float64(l.Buckets)
	chi2 := 0.0
	for _, c := range buckets {
		chi2 += (c - expected) * (c - expected) / expected
	}
	t.Logf("4,000 orders: partitions %v, χ² of the 256 buckets %.1f", counts, chi2)
	if chi2 > 330.5 {
		t.Errorf("χ² of the bucket counts %.1f over 255 degrees of freedom: not an even spread", chi2)
	}

	// Setup again changes nothing.
	if out, errOut, code := sasctl(t, environ, "partitions", "setup"); code != 0 {
		t.Fatalf("partitions setup again: exit %d\n%s%s", code, out, errOut)
	}
	drain(len(submit(300)))

	// The Go client publishes there too, given the routing exchange.
	cl, err := client.Connect(t.Context(), client.Config{URL: node.urls, QueuePrefix: "saschx.client.", SubmitExchange: l.Exchange})
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if _, err := cl.Submit(t.Context(), client.Order{Workflow: "order_fulfillment", Payload: map[string]any{}}); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()
	drain(30)

	// Three state stores, each with a whole sas on it under its
	// partition's prefix: every order is written in the store its id
	// names, ends there once, and no other store holds it.
	stacks, pipes := startPartitionsInSchemas(t, l, file, node.urls)
	// RabbitMQ restarts under them: RabbitMQ 3.10's plugin numbers the
	// buckets afresh from its bindings, not in the order setup made them,
	// so most submits now reach a partition that does not own them; its
	// submitter passes each to its owner.
	node.restartApp(t, 1)
	orders := submit(600)
	mine := make([][]string, len(pipes))
	for _, id := range orders {
		_, p := l.Of(id)
		i := slices.IndexFunc(l.Partitions, func(q partition.Partition) bool { return q == p })
		mine[i] = append(mine[i], id)
	}
	for i, pp := range pipes {
		pp.waitTerminal(t, mine[i], 3*time.Minute)
		if n := pp.count(t, `SELECT count(*) FROM orders`); n != len(mine[i]) {
			t.Fatalf("partition %s's store holds %d orders, want its own %d", l.Partitions[i].Name, n, len(mine[i]))
		}
		if completed, failed := pp.checkSaga(t, mine[i]); completed+failed != len(mine[i]) {
			t.Fatalf("partition %s: %d completed and %d failed of %d", l.Partitions[i].Name, completed, failed, len(mine[i]))
		}
		if r := pp.checkInvariants(t, mine[i]); !r.OK() {
			t.Fatalf("partition %s: invariants: %v", l.Partitions[i].Name, r.Violations)
		}
	}
	// Each partition's processes label their metrics with its name.
	forwarded := 0.0
	for i, pp := range pipes {
		forwarded += pp.submitter.metric(t, `sas_submitter_orders_total{outcome="forwarded",partition="`+l.Partitions[i].Name+`"}`)
	}
	if forwarded == 0 {
		t.Fatal("no submit was passed on by the submitters (sas_submitter_orders_total{outcome=\"forwarded\",partition=...}) after the ring was renumbered by the restart")
	}
	t.Logf("600 orders over three stores after the broker's restart: %d, %d, %d; %.0f passed on by a submitter to their partition",
		len(mine[0]), len(mine[1]), len(mine[2]), forwarded)

	// Renumbered, the ring sends every submit to its own partition again:
	// none is passed on.
	if out, errOut, code := sasctl(t, environ, "partitions", "setup", "--renumber"); code != 0 || !strings.Contains(out, "renumbered the 256 buckets") {
		t.Fatalf("partitions setup --renumber: exit %d\n%s%s", code, out, errOut)
	}
	again := submit(300)
	for i, pp := range pipes {
		var its []string
		for _, id := range again {
			if _, p := l.Of(id); p.Name == l.Partitions[i].Name {
				its = append(its, id)
			}
		}
		pp.waitTerminal(t, its, 2*time.Minute)
	}
	after := 0.0
	for i, pp := range pipes {
		after += pp.submitter.metric(t, `sas_submitter_orders_total{outcome="forwarded",partition="`+l.Partitions[i].Name+`"}`)
	}
	if after != forwarded {
		t.Fatalf("%.0f of 300 submits passed on after the ring was renumbered, want none", after-forwarded)
	}

	// sasctl reads across them: an order from its own store, and the
	// newest orders of all three merged newest first.
	for i, p := range l.Partitions {
		environ = append(environ, p.DatabaseURLEnv+"="+pipes[i].dbURL)
	}
	out, errOut, code = sasctl(t, environ, "orders", "show", mine[1][0])
	if code != 0 || !strings.Contains(out, mine[1][0]) {
		t.Fatalf("orders show of partition p2's order: exit %d\n%s%s", code, out, errOut)
	}
	type listed struct {
		id      string
		created time.Time
	}
	var newest []listed
	for _, pp := range pipes {
		rows, err := pp.pool.Query(t.Context(), `SELECT order_id::text, created_at FROM orders ORDER BY created_at DESC, order_id DESC LIMIT 40`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var o listed
			if err := rows.Scan(&o.id, &o.created); err != nil {
				t.Fatal(err)
			}
			newest = append(newest, o)
		}
		rows.Close()
	}
	slices.SortFunc(newest, func(x, y listed) int {
		if c := y.created.Compare(x.created); c != 0 {
			return c
		}
		return strings.Compare(y.id, x.id)
	})
	out, errOut, code = sasctl(t, environ, "orders", "list", "--limit", "40")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 41 || !strings.HasSuffix(strings.TrimSpace(lines[0]), "PARTITION") {
		t.Fatalf("orders list across partitions: exit %d, %d lines\n%s%s", code, len(lines), out, errOut)
	}
	for i, line := range lines[1:] {
		f := strings.Fields(line)
		if f[0] != newest[i].id {
			t.Fatalf("orders list's line %d is order %s, want %s (the newest 40 of every partition, newest first)\n%s", i+1, f[0], newest[i].id, out)
		}
		if _, p := l.Of(f[0]); f[len(f)-1] != p.Name {
			t.Fatalf("orders list says order %s is in %s; its bucket is %s's", f[0], f[len(f)-1], p.Name)
		}
	}

	// Dead letters are read from every partition's queues.
	pubConn, err := amqp.Dial(node.urls)
	if err != nil {
		t.Fatal(err)
	}
	pubCh, err := pubConn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	badID := messages.NewID()
	if err := pubCh.PublishWithContext(t.Context(), "", l.Partitions[1].QueuePrefix+submitter.Input, false, false,
		amqp.Publishing{MessageId: badID, Body: []byte("not an order")}); err != nil {
		t.Fatal(err)
	}
	pubConn.Close()
	testenv.Eventually(t, 30*time.Second, "the bad submit dead-lettered in partition p2 and listed", func() bool {
		out, _, code := sasctl(t, environ, "dlq", "list")
		return code == 0 && strings.Contains(out, badID) && strings.Contains(out, l.Partitions[1].QueuePrefix+submitter.Input)
	})

	// Alerts are read from every partition, each named.
	out, errOut, code = sasctl(t, environ, "alerts", "list", "--json")
	var alerts []struct {
		Partition string `json:"partition"`
		OrderID   string `json:"order_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &alerts) != nil {
		t.Fatalf("alerts list across partitions: exit %d\n%s%s", code, out, errOut)
	}
	for _, al := range alerts {
		if _, p := l.Of(al.OrderID); p.Name != al.Partition {
			t.Fatalf("alert of order %s named partition %q; its bucket is %s's", al.OrderID, al.Partition, p.Name)
		}
	}

	// A kind's limits set from sasctl hold across the partitions: each
	// keeps its share, so that together they do not pass them.
	out, errOut, code = sasctl(t, environ, "limits", "set", "shipping", "--rate", "3000/s", "--max-in-flight", "900")
	if code != 0 || strings.Count(out, "agent shipping: ") != 3 {
		t.Fatalf("limits set across partitions: exit %d\n%s%s", code, out, errOut)
	}
	for i, pp := range pipes {
		if n := pp.count(t, `SELECT count(*) FROM agent_limits WHERE agent = 'shipping' AND set_rate = 1000 AND set_max_in_flight = 300`); n != 1 {
			t.Fatalf("partition %s does not keep its third of shipping's limits (1000/s, 300 in flight)", l.Partitions[i].Name)
		}
	}
	if out, errOut, code := sasctl(t, environ, "limits", "reset", "shipping"); code != 0 {
		t.Fatalf("limits reset across partitions: exit %d\n%s%s", code, out, errOut)
	}
	for i, pp := range pipes {
		if n := pp.count(t, `SELECT count(*) FROM agent_limits WHERE agent = 'shipping' AND set_rate IS NOT NULL`); n != 0 {
			t.Fatalf("partition %s keeps shipping's limits after the reset", l.Partitions[i].Name)
		}
	}

	// A namespace is made in every partition, and its quotas shared.
	if out, errOut, code := sasctl(t, environ, "namespaces", "add", "team-x"); code != 0 {
		t.Fatalf("namespaces add across partitions: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sasctl(t, environ, "namespaces", "quota", "team-x", "--in-flight", "30", "--rate", "30/s", "--payload-bytes", "4096"); code != 0 {
		t.Fatalf("namespaces quota across partitions: exit %d\n%s%s", code, out, errOut)
	}
	for i, pp := range pipes {
		if n := pp.count(t, `SELECT count(*) FROM namespaces WHERE name = 'team-x' AND max_in_flight = 10 AND max_submit_rate = 10 AND max_payload_bytes = 4096`); n != 1 {
			t.Fatalf("partition %s does not hold team-x with its third of the quotas", l.Partitions[i].Name)
		}
	}

	// sasctl says where an order lives as the exchange does.
	out, _, code = sasctl(t, environ, "partitions", "of", ids[0])
	if b, p := l.Of(ids[0]); code != 0 || !strings.Contains(out, fmt.Sprintf("%s  %d", ids[0], b)) || !strings.Contains(out, p.Name) {
		t.Fatalf("partitions of %s: exit %d\n%s", ids[0], code, out)
	}

	checkAPIAcrossPartitions(t, l, stacks, pipes)
}

// checkAPIAcrossPartitions: one API over the three partitions (its own
// store p1's, for its tokens) writes each order it is given in the
// partition its id names, reads and awaits an order of every partition
// from there, pauses a workflow in all of them, and pages through every
// order of all three in (created_at, order_id) order, each once.
func checkAPIAcrossPartitions(t *testing.T, l partition.Layout, stacks []stack, pipes []*pipeline) {
	t.Helper()
	extra := []string{"SAS_PARTITION="}
	for i, p := range l.Partitions {
		login := apiLogin(t, stacks[i])
		if i == 0 {
			extra = append(extra, "SAS_DATABASE_URL="+login)
		}
		extra = append(extra, p.DatabaseURLEnv+"="+login)
	}
	api := startAPI(t, stacks[0], "", extra...)
	// Of every namespace: team-x exists by now.
	out := sasctlOK(t, stacks[0].env, "api", "token", "create", "--name", "across", "--role", statestore.TokenOperator, "--namespace", "*")
	token := strings.TrimSpace(out)

	var submitted []string
	for len(submitted) < 30 {
		id := messages.NewID()
		code, _, body := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token,
			body: submitBody(id, "order", `{"customer":"c","items":[{"sku":"S","qty":1}],"amount":1,"currency":"EUR"}`)})
		if code != 202 {
			t.Fatalf("submit through the API: %d %s", code, body)
		}
		submitted = append(submitted, id)
	}
	for _, id := range submitted {
		_, owner := l.Of(id)
		for i, pp := range pipes {
			n := pp.count(t, `SELECT count(*) FROM orders WHERE order_id = '`+id+`'`)
			if mine := l.Partitions[i].Name == owner.Name; mine != (n == 1) {
				t.Fatalf("order %s submitted through the API: %d rows in partition %s; it is %s's", id, n, l.Partitions[i].Name, owner.Name)
			}
		}
	}
	// Read and awaited from its own partition, whichever it is.
	seen := map[string]bool{}
	for _, id := range submitted {
		_, owner := l.Of(id)
		if seen[owner.Name] {
			continue
		}
		seen[owner.Name] = true
		code, hdr, body := api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + id + "/await?timeout=60s", token: token})
		if code != 200 || hdr.Get("Sas-Ended") != "true" {
			t.Fatalf("await order %s of partition %s: %d %s %s", id, owner.Name, code, hdr.Get("Sas-Ended"), body)
		}
		code, _, body = api.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + id, token: token})
		if code != 200 || !strings.Contains(string(body), id) {
			t.Fatalf("get order %s of partition %s: %d %s", id, owner.Name, code, body)
		}
	}
	if len(seen) != len(l.Partitions) {
		t.Fatalf("30 orders reached only partitions %v", seen)
	}
	// A workflow paused through the API is paused in every partition;
	// orders submitted meanwhile are written and held, and a bulk cancel
	// by filter reaches each in its own partition, and no other order.
	code, _, body := api.call(t, apiCall{method: "POST", path: "/api/v1/workflows/order/pause", token: token, body: `{"reason":"across"}`})
	if code != 200 {
		t.Fatalf("pause a workflow across partitions: %d %s", code, body)
	}
	for i, pp := range pipes {
		if n := pp.count(t, `SELECT count(*) FROM workflow_pauses WHERE workflow = 'order'`); n != 1 {
			t.Fatalf("partition %s: workflow order paused %d times, want once", l.Partitions[i].Name, n)
		}
	}
	held := map[string]bool{}
	for len(held) < 45 {
		id := messages.NewID()
		code, _, body := api.call(t, apiCall{method: "POST", path: "/api/v1/orders", token: token,
			body: submitBody(id, "order", `{"customer":"c","items":[{"sku":"S","qty":1}],"amount":1,"currency":"EUR"}`)})
		if code != 202 {
			t.Fatalf("submit while paused: %d %s", code, body)
		}
		held[id] = true
	}
	code, _, body = api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/cancel", token: token, body: `{"filter":{"workflow":"order","status":"received"},"dry_run":true}`})
	if code != 200 || !strings.Contains(string(body), `"count":45`) {
		t.Fatalf("bulk cancel dry run across partitions: %d %s", code, body)
	}
	code, _, body = api.call(t, apiCall{method: "POST", path: "/api/v1/bulk/cancel", token: token, body: `{"filter":{"workflow":"order","status":"received"}}`})
	var job struct {
		ID    int64  `json:"id"`
		State string `json:"state"`
		Total int    `json:"total"`
		Done  int    `json:"done"`
	}
	if code != 202 || json.Unmarshal(body, &job) != nil || job.Total != 45 {
		t.Fatalf("bulk cancel across partitions: %d %s", code, body)
	}
	testenv.Eventually(t, time.Minute, "the bulk cancel to end in every partition", func() bool {
		code, _, body := api.call(t, apiCall{method: "GET", path: fmt.Sprintf("/api/v1/bulk/%d", job.ID), token: token})
		return code == 200 && json.Unmarshal(body, &job) == nil && job.State == "done"
	})
	if job.Done != 45 {
		t.Fatalf("bulk cancel across partitions: %+v, want 45 done", job)
	}
	code, _, body = api.call(t, apiCall{method: "GET", path: fmt.Sprintf("/api/v1/bulk/%d/orders", job.ID), token: token})
	var acted struct {
		Orders []struct {
			OrderID string `json:"order_id"`
			Outcome string `json:"outcome"`
		} `json:"orders"`
	}
	if code != 200 || json.Unmarshal(body, &acted) != nil || len(acted.Orders) != 45 {
		t.Fatalf("bulk job's orders across partitions: %d %.300s", code, body)
	}
	for i, o := range acted.Orders {
		if !held[o.OrderID] || o.Outcome != "done" || i > 0 && o.OrderID <= acted.Orders[i-1].OrderID {
			t.Fatalf("bulk job's order %d: %+v (want each held order once, by id, done)", i, o)
		}
	}
	for i, pp := range pipes {
		mine := 0
		for id := range held {
			if _, p := l.Of(id); p.Name == l.Partitions[i].Name {
				mine++
			}
		}
		if n := pp.count(t, `SELECT count(DISTINCT order_id) FROM transitions WHERE reason = 'operator cancel'`); n != mine {
			t.Fatalf("partition %s: the bulk job acted on %d orders, want its %d held ones", l.Partitions[i].Name, n, mine)
		}
		if n := pp.count(t, `SELECT count(*) FROM orders WHERE workflow = 'order' AND status = 'received'`); n != 0 {
			t.Fatalf("partition %s: %d held orders left after the bulk cancel", l.Partitions[i].Name, n)
		}
	}
	if code, _, body := api.call(t, apiCall{method: "POST", path: "/api/v1/workflows/order/resume", token: token}); code != 200 {
		t.Fatalf("resume a workflow across partitions: %d %s\napi's log:\n%s", code, body, api.tail())
	}

	// The merged list: every order of the three, newest first, each once,
	// each named with its partition.
	type row struct {
		id      string
		created time.Time
	}
	var want []row
	for _, pp := range pipes {
		rows, err := pp.pool.Query(t.Context(), `SELECT order_id::text, created_at FROM orders`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var o row
			if err := rows.Scan(&o.id, &o.created); err != nil {
				t.Fatal(err)
			}
			want = append(want, o)
		}
		rows.Close()
	}
	slices.SortFunc(want, func(x, y row) int {
		if c := y.created.Compare(x.created); c != 0 {
			return c
		}
		return strings.Compare(y.id, x.id)
	})
	var got []string
	after, pages := "", 0
	for {
		path := "/api/v1/orders?limit=500"
		if after != "" {
			path += "&after=" + after
		}
		code, _, body := api.call(t, apiCall{method: "GET", path: path, token: token})
		var page struct {
			Orders []struct {
				OrderID   string `json:"order_id"`
				Partition string `json:"partition"`
			} `json:"orders"`
			Next string `json:"next"`
		}
		if code != 200 || json.Unmarshal(body, &page) != nil {
			t.Fatalf("list page %d: %d %.300s", pages+1, code, body)
		}
		pages++
		for _, o := range page.Orders {
			if _, p := l.Of(o.OrderID); p.Name != o.Partition {
				t.Fatalf("the list says order %s is %q's; its bucket is %s's", o.OrderID, o.Partition, p.Name)
			}
			got = append(got, o.OrderID)
		}
		if page.Next == "" {
			break
		}
		after = url.QueryEscape(page.Next)
	}
	if len(got) != len(want) {
		t.Fatalf("the merged list has %d orders in %d pages, the partitions %d", len(got), pages, len(want))
	}
	for i := range want {
		if got[i] != want[i].id {
			t.Fatalf("the merged list's order %d is %s, want %s: (created_at, order_id) newest first across partitions", i, got[i], want[i].id)
		}
	}
	t.Logf("the API listed %d orders of three partitions in %d pages of 500, in order", len(got), pages)

	// The console too: an order of every partition shown from its own
	// store, and the orders list merged, page after page, in order.
	cextra := []string{"SAS_PARTITION="}
	for i, p := range l.Partitions {
		cextra = append(cextra, p.DatabaseURLEnv+"="+consoleLogin(t, stacks[i]))
	}
	c := startConsole(t, stacks[0], cextra...)
	alice := newWebClient(t, c.url)
	if status := alice.login("alice", "alice's password"); status != http.StatusSeeOther {
		t.Fatalf("alice logs in: %d", status)
	}
	for _, id := range submitted[:6] {
		if status, page := alice.do("GET", "/orders/"+id, nil); status != 200 || !strings.Contains(page, id) {
			t.Fatalf("the console's page of order %s: %d", id, status)
		}
	}
	rowID := regexp.MustCompile(`<a href="/orders/([0-9a-f-]{36})" class="mono">`)
	rowPartition := regexp.MustCompile(`<td class="partition">([a-z0-9-]*)</td>`)
	nextLink := regexp.MustCompile(`<a href="([^"]+)" id="next">`)
	var shown []string
	path := "/orders"
	for pages = 0; path != ""; pages++ {
		status, page := alice.do("GET", path, nil)
		if status != 200 {
			t.Fatalf("the console's orders page %d: %d %.2000s\n%s", pages+1, status, page, c.logText())
		}
		ids, parts := rowID.FindAllStringSubmatch(page, -1), rowPartition.FindAllStringSubmatch(page, -1)
		if len(ids) != len(parts) {
			t.Fatalf("the console's orders page %d: %d orders, %d partitions named", pages+1, len(ids), len(parts))
		}
		for k, m := range ids {
			if _, p := l.Of(m[1]); p.Name != parts[k][1] {
				t.Fatalf("the console says order %s is %q's; its bucket is %s's", m[1], parts[k][1], p.Name)
			}
			shown = append(shown, m[1])
		}
		path = ""
		if m := nextLink.FindStringSubmatch(page); m != nil {
			path = html.UnescapeString(m[1])
		}
	}
	if !slices.Equal(shown, got) {
		t.Fatalf("the console's merged list shows %d orders in %d pages; the API's %d differ in order or content", len(shown), pages, len(got))
	}
	t.Logf("the console listed the same %d orders in %d pages", len(shown), pages)

	// Alerts of every partition on one page, each acknowledged in its own
	// partition: the same alert id in p1 and p2 are two alerts.
	var alertIDs [2]int64
	for i := range 2 {
		k := slices.IndexFunc(submitted, func(id string) bool { _, p := l.Of(id); return p.Name == l.Partitions[i].Name })
		if err := pipes[i].pool.QueryRow(t.Context(), `INSERT INTO alerts (message_id, order_id, step, reason, failure_count, raised_by)
			VALUES (gen_random_uuid(), $1, 1, 'partition `+l.Partitions[i].Name+`''s alert', 1, 'test') RETURNING id`, submitted[k]).Scan(&alertIDs[i]); err != nil {
			t.Fatal(err)
		}
	}
	status, page := alice.do("GET", "/alerts", nil)
	if status != 200 || !strings.Contains(page, "partition p1&#39;s alert") || !strings.Contains(page, "partition p2&#39;s alert") ||
		!strings.Contains(page, `<td class="partition">p2</td>`) {
		t.Fatalf("the console's alerts across partitions: %d\n%.3000s", status, page)
	}
	ackPath := fmt.Sprintf("/alerts/%d/ack?partition=p2", alertIDs[1])
	status, page = alice.do("GET", ackPath, nil)
	if status != 200 || !strings.Contains(page, "partition p2&#39;s alert") {
		t.Fatalf("confirm the ack of p2's alert: %d\n%.2000s", status, page)
	}
	if status, _ := alice.do("POST", ackPath, url.Values{"csrf": {csrfOf(t, page)}}); status != http.StatusSeeOther {
		t.Fatalf("ack p2's alert: %d", status)
	}
	for i, want := range []int{0, 1} {
		if n := pipes[i].count(t, `SELECT count(*) FROM alerts WHERE id = $1 AND acked_at IS NOT NULL`, alertIDs[i]); n != want {
			t.Fatalf("partition %s's alert %d: acked %d, want %d (only p2's)", l.Partitions[i].Name, alertIDs[i], n, want)
		}
	}
	if status, _ := alice.do("GET", "/alerts/1/ack?partition=p9", nil); status != http.StatusNotFound {
		t.Fatalf("an alert of no partition: %d, want 404", status)
	}

	// Dead letters per partition and in sum: the bad submit is p2's.
	status, page = alice.do("GET", "/dead-letters", nil)
	if status != 200 || !strings.Contains(page, `<td class="partition">p2</td><td><a href="/dead-letters/submit?partition=p2">submit</a></td><td class="num">1</td>`) ||
		!regexp.MustCompile(`id="dead-letters-total">[1-9]`).MatchString(page) {
		t.Fatalf("the console's dead letters across partitions: %d\n%.3000s", status, page)
	}
	if status, page := alice.do("GET", "/dead-letters/submit?partition=p2", nil); status != 200 || !strings.Contains(page, "not an order") {
		t.Fatalf("p2's dead letters of submit: %d\n%.2000s", status, page)
	}
	if status, page := alice.do("GET", "/dead-letters/submit?partition=p1", nil); status != 200 || strings.Contains(page, "not an order") {
		t.Fatalf("p1's dead letters of submit show p2's: %d", status)
	}
	if status, _ := alice.do("GET", "/dead-letters/submit?partition=p9", nil); status != http.StatusNotFound {
		t.Fatalf("the dead letters of no partition: %d, want 404", status)
	}

	// Limits: the deployment's (every partition's share summed) and each
	// partition's; a change from the console gives each its share. A
	// deployment's page: an operator of every namespace's.
	cmd := exec.Command(filepath.Join(binDir, "sasctl"), "console", "user", "add", "olga", "--role", "operator", "--namespace", "*", "--file", c.users, "--cost", "4")
	cmd.Env, cmd.Stdin = env(), strings.NewReader("olga's password\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("console user add olga: %v\n%s", err, out)
	}
	alice = newWebClient(t, c.url)
	if status := alice.login("olga", "olga's password"); status != http.StatusSeeOther {
		t.Fatalf("olga logs in: %d", status)
	}
	for _, pp := range pipes {
		// Each partition's share of 300/s, as sasctl limits set leaves it.
		if _, err := pp.pool.Exec(t.Context(), `INSERT INTO agent_limits (agent, set_rate, set_by, set_at) VALUES ('shipping', 100, 'test', now())
			ON CONFLICT (agent) DO UPDATE SET set_rate = 100, set_by = 'test', set_at = now()`); err != nil {
			t.Fatal(err)
		}
	}
	status, page = alice.do("GET", "/limits", nil)
	if status != 200 || !strings.Contains(page, "300/s") || strings.Count(page, "100/s") != 3 || !strings.Contains(page, "p3: ") {
		t.Fatalf("the console's limits across partitions: %d\n%.3000s", status, page)
	}
	status, page = alice.do("GET", "/limits/shipping/set", nil)
	if status != 200 {
		t.Fatalf("confirm a limits change: %d", status)
	}
	if status, _ := alice.do("POST", "/limits/shipping/set", url.Values{"csrf": {csrfOf(t, page)}, "rate": {"600/s"}}); status != http.StatusSeeOther {
		t.Fatalf("change shipping's limits from the console: %d", status)
	}
	for i, pp := range pipes {
		if n := pp.count(t, `SELECT count(*) FROM agent_limits WHERE agent = 'shipping' AND set_rate = 200`); n != 1 {
			t.Fatalf("partition %s does not keep its third of the console's 600/s", l.Partitions[i].Name)
		}
	}

	// Schedules: each kept by one partition, listed together, each
	// naming its partition.
	if _, err := pipes[1].pool.Exec(t.Context(), `INSERT INTO schedules (name, workflow, cron, timezone, payload, overlap, catch_up, version, in_file, next_tick)
		VALUES ('nightly-p2', 'single', '0 3 * * *', 'UTC', '{}', 'skip', 'none', 'v', false, now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	if status, page := alice.do("GET", "/schedules", nil); status != 200 || !strings.Contains(page, "nightly-p2<br><span class=\"muted partition\">partition p2</span>") {
		t.Fatalf("the console's schedules across partitions: %d\n%.3000s", status, page)
	}
}

// partitionServer is a partition's PostgreSQL server, as pg-standby.sh
// names it.
type partitionServer struct{ dir, base string }

// startPartitions starts, for each partition of layout l (file), a
// PostgreSQL server of its own (ports from base, ten apart) and a whole
// sas on it under the partition's prefix, given the layout and its
// partition, on the broker at urls.
func startPartitions(t *testing.T, l partition.Layout, file, urls string, base int, name string) ([]stack, []*pipeline, []partitionServer) {
	t.Helper()
	var stacks []stack
	var pipes []*pipeline
	var servers []partitionServer
	for i, p := range l.Partitions {
		port := fmt.Sprint(base + 10*i)
		dir, dbURL := startPostgresServers(t, "alone", port, filepath.Join(os.TempDir(), "sas-pg-"+name+"-"+port))
		servers = append(servers, partitionServer{dir, port})
		pool, err := pgxpool.New(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		st, pipe := startPartition(t, p, file, urls, dbURL, pool)
		stacks = append(stacks, st)
		pipes = append(pipes, pipe)
	}
	return stacks, pipes, servers
}

// startPartitionsInSchemas is startPartitions with each partition's store
// a schema of the test database: stores as separate as servers for
// routing, without a server's start-up to wait for.
func startPartitionsInSchemas(t *testing.T, l partition.Layout, file, urls string) ([]stack, []*pipeline) {
	t.Helper()
	var stacks []stack
	var pipes []*pipeline
	for _, p := range l.Partitions {
		dbURL, pool := testenv.EmptyDatabase(t)
		st, pipe := startPartition(t, p, file, urls, dbURL, pool)
		stacks = append(stacks, st)
		pipes = append(pipes, pipe)
	}
	return stacks, pipes
}

// startPartition migrates the store at dbURL (pool open on it) with
// sasctl and starts a whole sas on it for partition p of the layout in
// file.
func startPartition(t *testing.T, p partition.Partition, file, urls, dbURL string, pool *pgxpool.Pool) (stack, *pipeline) {
	t.Helper()
	topo := scheduler.Topology(p.QueuePrefix, 10, broker.QueueClassic, workflow.Builtin().Agents())
	topo.Inputs = append(topo.Inputs, submitter.Input)
	st := stack{dbURL: dbURL, topo: topo, submit: topo.Queue(submitter.Input), dlq: topo.DeadLetterQueue(submitter.Input),
		env: env("SAS_DATABASE_URL="+dbURL, "SAS_AMQP_URL="+urls, "SAS_QUEUE_PREFIX="+p.QueuePrefix, "SAS_QUEUE_TYPE=classic",
			"SAS_PARTITIONS_FILE="+file, "SAS_PARTITION="+p.Name)}
	if out, errOut, code := sasctl(t, st.env, "migrate"); code != 0 {
		t.Fatalf("migrate partition %s: exit %d: %s %s", p.Name, code, out, errOut)
	}
	st.pool = pool
	pipe := newPipeline(t, pipelineOpts{on: &st, supervisors: 1})
	return st, pipe
}
