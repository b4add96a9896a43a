package statestore_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// heldOrder writes an order and fails its first step: held in error.
func heldOrder(t *testing.T, b bundle, attrs ...statestore.Attribute) statestore.NewOrder {
	t.Helper()
	o := order(2, time.Hour, 3)
	o.Attributes = attrs
	insert(t, b, o)
	claimed, err := b.store.ClaimPending(ctxFor(t), "s", 1, "")
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := b.store.ApplyReply(ctxFor(t), statestore.Reply{OrderID: o.OrderID, Step: 1, Attempt: 1, OK: false, Error: "refused", Actor: "s"}); err != nil {
		t.Fatal(err)
	}
	return o
}

func text(s string) *string  { return &s }
func num(f float64) *float64 { return &f }

func TestAPITokens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	tok, secret, err := b.store.CreateAPIToken(ctx, "shop-app", statestore.TokenSubmitter, "sasctl:alice")
	if err != nil || !strings.HasPrefix(secret, "sas_") || tok.Role != statestore.TokenSubmitter {
		t.Fatalf("create: %+v %q %v", tok, secret, err)
	}
	if n := count(t, b, `SELECT count(*) FROM api_tokens WHERE position($1 in encode(secret_hash, 'escape')) > 0`, secret[len(secret)-20:]); n != 0 {
		t.Fatal("the secret is stored")
	}
	if _, _, err := b.store.CreateAPIToken(ctx, "shop-app", statestore.TokenViewer, "x"); !errors.Is(err, statestore.ErrConflict) {
		t.Fatalf("a second token of the same name: %v", err)
	}
	got, err := b.store.APITokenOf(ctx, secret)
	if err != nil || got.Name != "shop-app" || got.ID != tok.ID {
		t.Fatalf("check: %+v %v", got, err)
	}
	for _, bad := range []string{"", "sas_", "sas_x_y", secret + "x", secret[:len(secret)-1], "sas_999999_" + secret[len(secret)-43:],
		strings.Replace(secret, "sas_", "sat_", 1), "sas_-1_abc", "sas_" + strings.Repeat("9", 30) + "_a"} {
		if _, err := b.store.APITokenOf(ctx, bad); !errors.Is(err, statestore.ErrBadToken) {
			t.Errorf("token %q: %v, want ErrBadToken", bad, err)
		}
	}
	if _, err := b.store.RevokeAPIToken(ctx, "shop-app", "sasctl:bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.APITokenOf(ctx, secret); !errors.Is(err, statestore.ErrBadToken) {
		t.Fatalf("a revoked token: %v", err)
	}
	if _, err := b.store.RevokeAPIToken(ctx, "nobody", "x"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("revoke an unknown token: %v", err)
	}
	list, err := b.store.APITokens(ctx)
	if err != nil || len(list) != 1 || list[0].RevokedBy != "sasctl:bob" {
		t.Fatalf("list: %+v %v", list, err)
	}
}

// TestOrdersAreFoundByTheirAttributes: an attribute filter selects
// through its index, pages by keyset as the plain list does, and combines
// with the others; the attributes go with their order.
func TestOrdersAreFoundByTheirAttributes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	var c42 []string
	for i := range 12 {
		o := order(1, time.Hour, 3)
		cust := "c-7"
		if i%2 == 0 {
			cust = "c-42"
		}
		o.Attributes = []statestore.Attribute{{Name: "customer", Text: text(cust)}, {Name: "amount", Num: num(float64(i))}}
		insert(t, b, o)
		if cust == "c-42" {
			c42 = append(c42, o.OrderID)
		}
	}
	insert(t, b, order(1, time.Hour, 3)) // no attributes
	walk := func(q statestore.OrderQuery) []string {
		var ids []string
		for {
			page, next, err := b.store.OrderPage(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range page {
				ids = append(ids, o.OrderID)
			}
			if next == nil {
				return ids
			}
			q.After = next
		}
	}
	eq := statestore.AttrCond{Op: "=", Value: statestore.Attribute{Name: "customer", Text: text("c-42")}}
	if got := walk(statestore.OrderQuery{Attrs: []statestore.AttrCond{eq}, Limit: 4}); len(got) != 6 {
		t.Fatalf("customer = c-42: %d orders, want 6", len(got))
	}
	big := statestore.AttrCond{Op: ">=", Value: statestore.Attribute{Name: "amount", Num: num(6)}}
	if got := walk(statestore.OrderQuery{Attrs: []statestore.AttrCond{eq, big}, Limit: 2}); len(got) != 3 {
		t.Fatalf("customer = c-42 and amount >= 6: %d orders, want 3", len(got))
	}
	not := statestore.AttrCond{Op: "!=", Value: statestore.Attribute{Name: "customer", Text: text("c-42")}}
	if got := walk(statestore.OrderQuery{Attrs: []statestore.AttrCond{not}, Limit: 5}); len(got) != 6 {
		t.Fatalf("customer != c-42: %d orders, want 6", len(got))
	}
	if n, err := b.store.CountSelected(ctx, statestore.OrderQuery{Attrs: []statestore.AttrCond{eq}}, 100); err != nil || n != 6 {
		t.Fatalf("count: %d %v", n, err)
	}
	if n, err := b.store.CountSelected(ctx, statestore.OrderQuery{Attrs: []statestore.AttrCond{eq}}, 3); err != nil || n != 4 {
		t.Fatalf("count up to 3: %d %v, want 4 (more than 3)", n, err)
	}
	if _, _, err := b.store.OrderPage(ctx, statestore.OrderQuery{Limit: 5, Attrs: []statestore.AttrCond{{Op: "~", Value: eq.Value}}}); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("an unknown comparison: %v", err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM orders WHERE order_id = $1`, c42[0]); err != nil {
		t.Fatal(err)
	}
	if n := count(t, b, `SELECT count(*) FROM order_attributes WHERE order_id = $1`, c42[0]); n != 0 {
		t.Fatalf("%d attributes left of a deleted order", n)
	}
}

func TestRerunKeepsTheOriginalPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := heldOrder(t, b, statestore.Attribute{Name: "customer", Text: text("c-1")})
	var key string
	if err := b.pool.QueryRow(ctx, `SELECT idempotency_key FROM steps WHERE order_id = $1 AND step = 1`, o.OrderID).Scan(&key); err != nil {
		t.Fatal(err)
	}
	reset, err := b.store.Rerun(ctx, o.OrderID, 0, []byte(`{"customer":"c-2"}`), []statestore.Attribute{{Name: "customer", Text: text("c-2")}}, "api:ops")
	if err != nil || len(reset) != 1 || reset[0] != 1 {
		t.Fatalf("re-run: %v %v", reset, err)
	}
	d, err := b.store.GetOrder(ctx, o.OrderID)
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Order.Payload) != `{"customer": "c-2"}` || d.Order.Status != statestore.OrderProcessing || d.Steps[0].IdempotencyKey == key {
		t.Fatalf("after the re-run: payload %s, status %s, key %s (was %s)", d.Order.Payload, d.Order.Status, d.Steps[0].IdempotencyKey, key)
	}
	hist, err := b.store.PayloadHistory(ctx, o.OrderID)
	if err != nil || len(hist) != 1 || string(hist[0].Payload) != `{"customer": "c"}` || hist[0].ReplacedBy != "api:ops" {
		t.Fatalf("payload history: %+v %v", hist, err)
	}
	attrs, err := b.store.Attributes(ctx, o.OrderID)
	if err != nil || len(attrs) != 1 || *attrs[0].Text != "c-2" {
		t.Fatalf("attributes: %+v %v", attrs, err)
	}
	// Not in error any more: refused, nothing changed.
	if _, err := b.store.Rerun(ctx, o.OrderID, 0, []byte(`{"customer":"c-3"}`), nil, "api:ops"); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("re-run of a running order: %v", err)
	}
	if _, err := b.store.Rerun(ctx, messages.NewID(), 0, []byte(`{}`), nil, "api:ops"); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("re-run of an unknown order: %v", err)
	}
	if hist, _ := b.store.PayloadHistory(ctx, o.OrderID); len(hist) != 1 {
		t.Fatalf("a refused re-run changed the history: %+v", hist)
	}
}

// TestBulkJobActsOnEachOrderOnce: two holders racing on one job (as after
// a takeover) act on each order once; a refusal is recorded as failed.
func TestBulkJobActsOnEachOrderOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for range 30 {
		heldOrder(t, b)
	}
	running := order(1, time.Hour, 3)
	insert(t, b, running)
	q := statestore.OrderQuery{Status: statestore.OrderError}
	if _, err := b.store.CreateBulkJob(ctx, statestore.BulkResubmit, q, []byte(`{}`), "api:ops", 10); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("a job over its limit: %v", err)
	}
	job, err := b.store.CreateBulkJob(ctx, statestore.BulkResubmit, statestore.OrderQuery{}, []byte(`{"status":"any"}`), "api:ops", 100)
	if err != nil || job.Total != 31 {
		t.Fatalf("create: %+v %v", job, err)
	}
	var wg sync.WaitGroup
	for _, holder := range []string{"a", "b"} {
		wg.Go(func() {
			for {
				j, ok, err := b.store.TakeBulkJob(ctx, holder, time.Minute)
				if err != nil || !ok {
					return
				}
				n, err := b.store.RunBulkBatch(ctx, j, holder, "bulk job by api:ops", 7)
				if err != nil && !statestore.ErrLeaseLost(err) {
					t.Error(err)
					return
				}
				if n == 0 && err == nil {
					return
				}
			}
		})
	}
	wg.Wait()
	job, err = b.store.BulkJobOf(ctx, job.ID)
	if err != nil || job.State != statestore.BulkDone || job.Done != 30 || job.Failed != 1 {
		t.Fatalf("after: %+v %v", job, err)
	}
	if n := count(t, b, `SELECT count(*) FROM transitions WHERE reason = 'operator resubmit' AND step IS NOT NULL`); n != 30 {
		t.Fatalf("%d steps resubmitted, want 30", n)
	}
	orders, err := b.store.BulkJobOrders(ctx, job.ID, "", 100)
	if err != nil || len(orders) != 31 {
		t.Fatalf("orders: %d %v", len(orders), err)
	}
	for _, o := range orders {
		if (o.OrderID == running.OrderID) != (o.Outcome == "failed") || (o.Outcome == "failed" && !strings.Contains(o.Detail, "only an order in error")) {
			t.Errorf("order %s: %+v", o.OrderID, o)
		}
	}
	if stopped, err := b.store.StopBulkJob(ctx, job.ID, "api:ops"); err != nil || stopped.State != statestore.BulkDone {
		t.Fatalf("stopping a job that is done: %+v %v", stopped, err)
	}
}

// TestABulkJobsShareIsFoundByItsOrigin: a partition's share of a job
// made across partitions names the first partition's id as its origin,
// by which it is found; a job of its own has none, and an origin is
// taken once.
func TestABulkJobsShareIsFoundByItsOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for range 3 {
		heldOrder(t, b)
	}
	q := statestore.OrderQuery{Status: statestore.OrderError}
	own, err := b.store.CreateBulkJob(ctx, statestore.BulkResubmit, q, []byte(`{}`), "api:ops", 10)
	if err != nil {
		t.Fatal(err)
	}
	part, err := b.store.CreateBulkJobPart(ctx, 9041, statestore.BulkResubmit, q, []byte(`{}`), "api:ops", 10)
	if err != nil || part.Total != 3 || part.ID == 9041 {
		t.Fatalf("a share: %+v %v", part, err)
	}
	if _, err := b.store.CreateBulkJobPart(ctx, 9041, statestore.BulkCancel, q, []byte(`{}`), "api:ops", 10); err == nil {
		t.Fatal("a second share of the same origin was made")
	}
	if _, err := b.store.CreateBulkJobPart(ctx, 0, statestore.BulkCancel, q, []byte(`{}`), "api:ops", 10); !errors.Is(err, statestore.ErrInvalidData) {
		t.Fatalf("a share of no origin: %v", err)
	}
	found, err := b.store.BulkJobsOf(ctx, []int64{9041, own.ID, 777})
	if err != nil || len(found) != 1 || found[9041].ID != part.ID || found[9041].Total != 3 {
		t.Fatalf("by origin: %+v %v", found, err)
	}
}

// TestStatusEventOfIsCompact: an order's status event as the API serves
// it reads as the events sent on the exchange do, without jsonb's spaces.
func TestStatusEventOfIsCompact(t *testing.T) {
	t.Parallel()
	b := setup(t)
	o := heldOrder(t, b)
	status, body, err := b.store.StatusEventOf(ctxFor(t), o.OrderID)
	if err != nil || status != "error" {
		t.Fatalf("%q %v", status, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, body); err != nil || !bytes.Equal(compact.Bytes(), body) {
		t.Fatalf("not compact JSON (%v): %s", err, body)
	}
	if ev, err := messages.DecodeStatusEvent(body); err != nil || ev.OrderID != o.OrderID || ev.Status != messages.StatusError {
		t.Fatalf("%+v %v", ev, err)
	}
}

// TestConsoleRoleRerunsAndMakesBulkJobs: the console's login may re-run
// an order with a corrected payload and make and stop bulk jobs, as the
// API's may, and still may not change an order's state by hand.
func TestConsoleRoleRerunsAndMakesBulkJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	console := storeAs(t, b, statestore.RoleConsole)
	o := heldOrder(t, b, statestore.Attribute{Name: "customer", Text: text("c-1")})
	held := heldOrder(t, b)
	if _, err := console.Rerun(ctx, o.OrderID, 0, []byte(`{"customer":"c-2"}`), []statestore.Attribute{{Name: "customer", Text: text("c-2")}}, "console:alice"); err != nil {
		t.Fatalf("console re-runs: %v", err)
	}
	if hist, err := console.PayloadHistory(ctx, o.OrderID); err != nil || len(hist) != 1 || hist[0].ReplacedBy != "console:alice" {
		t.Fatalf("payload history: %+v %v", hist, err)
	}
	job, err := console.CreateBulkJob(ctx, statestore.BulkResubmit, statestore.OrderQuery{Status: statestore.OrderError}, []byte(`{"status":"error"}`), "console:alice", 10)
	if err != nil || job.Total != 1 {
		t.Fatalf("console makes a bulk job: %+v %v", job, err)
	}
	if n, err := console.BulkJobOrders(ctx, job.ID, "", 10); err != nil || len(n) != 1 || n[0].OrderID != held.OrderID {
		t.Fatalf("its orders: %+v %v", n, err)
	}
	if j, err := console.StopBulkJob(ctx, job.ID, "console:alice"); err != nil || j.State != statestore.BulkStopped {
		t.Fatalf("console stops it: %+v %v", j, err)
	}
	for _, stmt := range []string{`UPDATE orders SET status = 'completed'`, `UPDATE steps SET process_state = 'pending'`,
		`UPDATE bulk_jobs SET done = 5`} {
		if _, err := asRole(t, b, statestore.RoleConsole, stmt); !denied(err) {
			t.Errorf("console may %s: %v", stmt, err)
		}
	}
}

// TestRefusalsAreInTheRulesWords: a name or value a rule of the store
// refuses is refused before the database sees it, in the rule's words;
// one only the database refuses (a NUL in a text) is refused in words
// that never quote the database (a constraint's name, SQLSTATE).
func TestRefusalsAreInTheRulesWords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	for _, name := range []string{"", "a b", "-lead", strings.Repeat("n", 65), "nul\x00", "Zoë"} {
		_, _, err := b.store.CreateAPIToken(ctx, name, statestore.TokenViewer, "test")
		if !errors.Is(err, statestore.ErrInvalidData) || !strings.Contains(err.Error(), "is not a name") || strings.Contains(err.Error(), "constraint") {
			t.Errorf("token name %q: %v", name, err)
		}
	}
	if _, _, err := b.store.CreateAPIToken(ctx, "ok", "root", "test"); !errors.Is(err, statestore.ErrInvalidData) || !strings.Contains(err.Error(), "one of") {
		t.Errorf("role root: %v", err)
	}
	if n := count(t, b, `SELECT count(*) FROM api_tokens`); n != 0 {
		t.Fatalf("%d tokens made by refused names", n)
	}
	// A value no Go rule checks, which only the database refuses.
	err := b.store.RecordOperatorAction(ctx, "x\x00", "t", "d", "ann")
	if !errors.Is(err, statestore.ErrInvalidData) || strings.Contains(err.Error(), "SQLSTATE") || strings.Contains(err.Error(), "\\x00") {
		t.Fatalf("a NUL only the database refuses: %v", err)
	}
}
