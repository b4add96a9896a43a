package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sas/internal/harness/testenv"
)

// TestConsoleActsInBulkAndReruns: in a browser, an operator filters the
// orders list by status and a search attribute (customer=c-bulk), sees
// the dry run's count in the confirmation, resubmits every order the
// filter selects as a bulk job (run by the API service) and follows it
// to its end; the orders of another customer are untouched. An order
// held for a bad payload is re-run from its page with a corrected one;
// a payload its schema refuses is refused and changes nothing; the
// order's page shows the payload it had and who replaced it.
func TestConsoleActsInBulkAndReruns(t *testing.T) {
	t.Parallel()
	g := runFile(t, "api.yaml", apiFile, pipelineOpts{schedulers: 1, agents: 1, faults: `{"charge":{"refuse_if":"bad"}}`})
	p := g.pipeline
	startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file, "SAS_API_BULK_BATCH=2")
	bulk := g.submit(t, "shop", []string{`{"customer":"c-bulk","bad":true}`, `{"customer":"c-bulk","bad":true}`, `{"customer":"c-bulk","bad":true}`,
		`{"customer":"c-bulk","bad":true}`, `{"customer":"c-bulk","bad":true}`})
	others := g.submit(t, "shop", []string{`{"customer":"c-other","bad":true}`, `{"customer":"c-other","bad":true}`, `{"customer":"c-other","bad":true}`})
	done := g.submit(t, "shop", []string{`{"customer":"c-bulk"}`, `{"customer":"c-bulk"}`})
	all := append(append(append([]string{}, bulk...), others...), done...)
	p.waitTerminal(t, all, 2*time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'error'`, all); n != 8 {
		t.Fatalf("%d orders held in error, want 8", n)
	}
	p.setFaults(t, `{}`) // the service is mended

	c := startConsole(t, g.stack, "SAS_WORKFLOWS_FILE="+g.file)
	ctx := browser(t)
	shots := newScreenshots(t)
	login(t, ctx, c.url, "alice", "alice's password")

	// The filter: held in error, customer c-bulk.
	do(t, ctx, "filter by status and customer", chromedp.Navigate(c.url+"/orders"),
		chromedp.SetValue(chromedp.CSS("#f-status"), "error"), chromedp.SendKeys(chromedp.CSS("#f-where"), "customer=c-bulk"),
		chromedp.Click(chromedp.CSS("#f-apply")), chromedp.WaitVisible(chromedp.CSS(`#bulk-resubmit`)))
	listed := text(t, ctx, "#orders")
	for _, id := range bulk {
		if !strings.Contains(listed, id) {
			t.Fatalf("the filter does not list %s:\n%s", id, listed)
		}
	}
	for _, id := range append(append([]string{}, others...), done...) {
		if strings.Contains(listed, id) {
			t.Fatalf("the filter lists %s, of another customer or not held:\n%s", id, listed)
		}
	}
	shots.take(ctx, "orders-filtered")
	do(t, ctx, "bulk resubmit", chromedp.Click(chromedp.CSS("#bulk-resubmit")), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if eval[int](t, ctx, `document.querySelectorAll("#confirm-button").length`) != 1 {
		t.Fatalf("the bulk resubmit's confirmation is not there:\n%s", text(t, ctx, "main"))
	}
	if n := value(t, ctx, "the dry run's count", chromedp.AttributeValue(chromedp.CSS("#confirm-button"), "data-count")).Value; n != "5" {
		t.Fatalf("the confirmation counts %s orders, want 5", n)
	}
	if q := text(t, ctx, "#confirm h1"); !strings.Contains(q, "Resubmit the 5 orders") {
		t.Fatalf("the confirmation asks %q", q)
	}
	shots.take(ctx, "bulk-confirm")
	do(t, ctx, "confirm the bulk resubmit", chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#bulk-job")))
	jobURL := value(t, ctx, "location", chromedp.Location())
	testenv.Eventually(t, 90*time.Second, "the bulk job to end", func() bool {
		do(t, ctx, "reload the job", chromedp.Navigate(jobURL), chromedp.WaitVisible(chromedp.CSS("#bulk-job")))
		return value(t, ctx, "its state", chromedp.AttributeValue(chromedp.CSS("#bulk-job"), "data-state")).Value == "done"
	})
	if d := value(t, ctx, "done", chromedp.AttributeValue(chromedp.CSS("#bulk-job"), "data-done")).Value; d != "5" {
		t.Fatalf("the job shows %s done, want 5", d)
	}
	shots.take(ctx, "bulk-job")
	// A job that is done has nothing to stop, and says so.
	do(t, ctx, "stop the done job", chromedp.Navigate(strings.Split(jobURL, "?")[0]+"/stop"), chromedp.WaitVisible(chromedp.CSS("#confirm-button")),
		chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#failure")))
	if body := text(t, ctx, "#failure"); !strings.Contains(body, "is done: there is nothing to stop") {
		t.Fatalf("stopping a done job says:\n%s", body)
	}
	p.waitTerminal(t, bulk, time.Minute)
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'completed'`, bulk); n != 5 {
		t.Fatalf("%d of the 5 resubmitted orders completed", n)
	}
	if n := p.count(t, `SELECT count(DISTINCT order_id) FROM transitions WHERE order_id = ANY($1::uuid[]) AND reason = 'operator resubmit' AND claimed_by LIKE 'bulk job % by console:alice'`, bulk); n != 5 {
		t.Fatalf("%d resubmits recorded as the bulk job's by alice, want 5", n)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[]) AND status = 'error'`, others); n != 3 {
		t.Fatalf("the other customer's orders changed: %d of 3 still held", n)
	}

	// A re-run whose payload the schema refuses changes nothing.
	do(t, ctx, "open a held order", chromedp.Navigate(c.url+"/orders/"+others[0]), chromedp.WaitVisible(chromedp.CSS("#rerun")))
	do(t, ctx, "re-run with a payload the schema refuses", chromedp.Click(chromedp.CSS("#rerun")), chromedp.WaitVisible(chromedp.CSS("#payload")),
		chromedp.SetValue(chromedp.CSS("#payload"), `{"amount": 3}`), chromedp.Click(chromedp.CSS("#confirm-button")),
		chromedp.WaitVisible(chromedp.CSS("#failure")))
	if body := text(t, ctx, "#failure"); !strings.Contains(body, "422") || !strings.Contains(body, "customer") || !strings.Contains(body, "refused") {
		t.Fatalf("the refused re-run says:\n%s", body)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE order_id = $1 AND status = 'error' AND payload->>'customer' = 'c-other'`, others[0]); n != 1 {
		t.Fatal("a refused re-run changed the order")
	}
	// The corrected one completes; the page shows both payloads and who.
	do(t, ctx, "re-run with a corrected payload", chromedp.Navigate(c.url+"/orders/"+others[0]+"/rerun"), chromedp.WaitVisible(chromedp.CSS("#payload")))
	if v := value(t, ctx, "the payload field", chromedp.Value(chromedp.CSS("#payload"))); !strings.Contains(v, `"bad": true`) {
		t.Fatalf("the re-run form does not start from the order's payload: %q", v)
	}
	shots.take(ctx, "rerun")
	do(t, ctx, "send the corrected payload", chromedp.SetValue(chromedp.CSS("#payload"), `{"customer": "c-fixed"}`),
		chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	waitStatus(t, ctx, c.url, others[0], "completed")
	if h := text(t, ctx, "#payload-history"); !strings.Contains(h, "console:alice") || !strings.Contains(h, `"bad": true`) {
		t.Fatalf("the page does not show the payload it had and who replaced it:\n%s", h)
	}
	if a := text(t, ctx, "#attributes"); !strings.Contains(a, "customer=c-fixed") {
		t.Fatalf("the page shows attributes %q, want customer=c-fixed", a)
	}
	if n := p.count(t, `SELECT count(*) FROM order_payloads WHERE order_id = $1 AND replaced_by = 'console:alice'`, others[0]); n != 1 {
		t.Fatalf("%d payload history rows by alice, want 1", n)
	}
	shots.take(ctx, "order-rerun")

	// A bulk cancel needs a filter; one that reads nothing is refused.
	do(t, ctx, "a bulk cancel of everything", chromedp.Navigate(c.url+"/bulk/cancel"), chromedp.WaitVisible(chromedp.CSS("#failure")))
	if body := text(t, ctx, "#failure"); !strings.Contains(body, "needs a filter") {
		t.Fatalf("a bulk action without a filter says:\n%s", body)
	}
	do(t, ctx, "a filter by an unknown attribute", chromedp.Navigate(c.url+"/orders?where=colour%3Dred"), chromedp.WaitVisible(chromedp.CSS("#filter-error")))
	if e := text(t, ctx, "#filter-error"); !strings.Contains(e, "colour is not a search attribute") {
		t.Fatalf("an unknown attribute says %q", e)
	}
	if n := p.count(t, `SELECT count(*) FROM bulk_jobs`); n != 1 {
		t.Fatalf("%s bulk jobs, want 1", strconv.Itoa(n))
	}
}
