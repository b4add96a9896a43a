package statestore_test

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

const hooked = `
workflows:
  - name: hooked
    webhooks:
      - {url: "https://hooks.example.com/all", secret_env: HOOK_SECRET}
      - {url: "https://hooks.example.com/failures", secret_env: OPS_SECRET, events: [failed, error]}
    steps:
      - {action: a, agent: x}
  - name: quiet
    steps:
      - {action: a, agent: x}
  - name: tenanted
    webhooks:
      - {url: "https://hooks.example.com/default", secret_env: HOOK_SECRET}
      - {url: "https://hooks.example.com/team-a", secret_env: HOOK_SECRET, namespace: team-a, events: [completed, step.claimed]}
      - {url: "https://hooks.example.com/every", secret_env: HOOK_SECRET, namespace: "*"}
    steps:
      - {action: a, agent: x}
  - name: approval
    webhooks:
      - {url: "https://hooks.example.com/approvals", secret_env: HOOK_SECRET, events: [step.awaiting, completed]}
    steps:
      - {action: a, agent: x}
      - {id: approved, wait: {signal: approved, timeout: 1h}}
`

// hookedOrder is an order of workflow name of hooked, its version stored.
func hookedOrder(t *testing.T, b bundle, name string) statestore.NewOrder {
	t.Helper()
	reg, err := workflow.Parse("hooked.yaml", []byte(hooked))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup(name)
	if err := b.store.StoreWorkflowVersions(ctxFor(t), []statestore.WorkflowVersion{{Name: name, Version: wf.Version(), Definition: wf.Definition(),
		CreatedBy: "test"}}); err != nil {
		t.Fatal(err)
	}
	o := graphOrder(t, hooked, name, `{}`, statestore.PolicyCompensate)
	o.WorkflowVersion = wf.Version()
	return o
}

// TestAnOrdersEndIsDeliveredToItsWebhooks: the end of an order is written
// for each webhook of its workflow's version told of it, with the end's
// status event, in the transaction that ended it; an order of a workflow
// without webhooks writes none. A try that fails is due again after its
// backoff and dead at the last try; a dead one replays; a sent one does
// not; claiming holds a delivery for its lease.
func TestAnOrdersEndIsDeliveredToItsWebhooks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	done, quiet := hookedOrder(t, b, "hooked"), hookedOrder(t, b, "quiet")
	insert(t, b, done)
	insert(t, b, quiet)
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	for _, c := range claimed {
		reply(t, b, c, true, `{"n":1}`)
	}
	ds, err := b.store.ListWebhooks(ctx, statestore.WebhookFilter{Limit: 10})
	if err != nil || len(ds) != 1 || ds[0].OrderID != done.OrderID || ds[0].URL != "https://hooks.example.com/all" ||
		ds[0].Event != "completed" || ds[0].SecretEnv != "HOOK_SECRET" || ds[0].State != statestore.WebhookPending {
		t.Fatalf("deliveries %+v %v", ds, err)
	}
	var ev struct {
		Status  string          `json:"status"`
		Results json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(ds[0].Body, &ev); err != nil || ev.Status != "completed" || string(ev.Results) != `{"a": {"n": 1}}` {
		t.Fatalf("the delivery's body %s: %v", ds[0].Body, err)
	}

	failed := hookedOrder(t, b, "hooked")
	insert(t, b, failed)
	reply(t, b, claimAll(t, b, failed.OrderID)["a"], false, "")
	if n := count(t, b, `SELECT count(*) FROM webhook_deliveries WHERE order_id = $1 AND event = 'failed'`, failed.OrderID); n != 2 {
		t.Fatalf("a failed order: %d deliveries, want 2 (both webhooks are told of failures)", n)
	}

	due, err := b.store.ClaimWebhooks(ctx, 10, time.Minute)
	if err != nil || len(due) != 3 {
		t.Fatalf("claim: %d %v", len(due), err)
	}
	if again, _ := b.store.ClaimWebhooks(ctx, 10, time.Minute); len(again) != 0 {
		t.Fatalf("deliveries claimed twice within their lease: %+v", again)
	}
	try := statestore.WebhookTry{MaxAttempts: 2, Backoff: time.Millisecond, BackoffMax: time.Millisecond}
	ok, fail := try, try
	ok.ID, ok.OK = due[0].ID, true
	if state, err := b.store.WebhookTried(ctx, ok); err != nil || state != statestore.WebhookSent {
		t.Fatalf("a delivery taken: %s %v", state, err)
	}
	fail.ID, fail.Why = due[1].ID, "answered 500 Internal Server Error"
	if state, err := b.store.WebhookTried(ctx, fail); err != nil || state != statestore.WebhookPending {
		t.Fatalf("a first failure: %s %v", state, err)
	}
	if state, err := b.store.WebhookTried(ctx, fail); err != nil || state != statestore.WebhookDead {
		t.Fatalf("the last failure: %s %v", state, err)
	}
	dead, _ := b.store.ListWebhooks(ctx, statestore.WebhookFilter{State: statestore.WebhookDead, Limit: 10})
	if len(dead) != 1 || dead[0].Attempts != 2 || dead[0].LastError != "answered 500 Internal Server Error" {
		t.Fatalf("dead %+v", dead)
	}
	if err := b.store.ReplayWebhook(ctx, due[0].ID); !errors.Is(err, statestore.ErrInvalidState) {
		t.Fatalf("replaying a sent delivery: %v", err)
	}
	if err := b.store.ReplayWebhook(ctx, 1<<40); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("replaying an unknown delivery: %v", err)
	}
	if err := b.store.ReplayWebhook(ctx, dead[0].ID); err != nil {
		t.Fatal(err)
	}
	back, _ := b.store.ListWebhooks(ctx, statestore.WebhookFilter{OrderID: dead[0].OrderID, Limit: 10})
	for _, d := range back {
		if d.ID == dead[0].ID && (d.State != statestore.WebhookPending || d.Attempts != 0 || d.LastError != "") {
			t.Fatalf("replayed %+v", d)
		}
	}
}

// TestAStepsEventIsDeliveredToTheWebhooksThatNameIt: a webhook whose
// events name a step event (step.awaiting) is told of that move, with the
// step event's body, when it happens.
func TestAStepsEventIsDeliveredToTheWebhooksThatNameIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	o := hookedOrder(t, b, "approval")
	insert(t, b, o)
	reply(t, b, claimAll(t, b, o.OrderID)["a"], true, "")
	ds, err := b.store.ListWebhooks(ctx, statestore.WebhookFilter{OrderID: o.OrderID, Limit: 10})
	if err != nil || len(ds) != 1 || ds[0].Event != "step.awaiting" || ds[0].URL != "https://hooks.example.com/approvals" {
		t.Fatalf("deliveries %+v %v", ds, err)
	}
	var ev struct {
		Name, Event, Wait string
	}
	if err := json.Unmarshal(ds[0].Body, &ev); err != nil || ev.Name != "approved" || ev.Event != "awaiting" || ev.Wait != "approved" {
		t.Fatalf("the step event %s: %v", ds[0].Body, err)
	}
}

// TestWebhooksAreToldOfTheirNamespacesOrders: a webhook is told of the
// orders (and steps) of its namespace alone: none said, the default one's;
// '*', every namespace's.
func TestWebhooksAreToldOfTheirNamespacesOrders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	if _, err := b.store.AddNamespace(ctx, "team-a", "test"); err != nil {
		t.Fatal(err)
	}
	plain, teamA := hookedOrder(t, b, "tenanted"), hookedOrder(t, b, "tenanted")
	teamA.Namespace = "team-a"
	insert(t, b, plain)
	insert(t, b, teamA)
	claimed, err := b.store.ClaimPending(ctx, "s", 10, "")
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	for _, c := range claimed {
		reply(t, b, c, true, `{}`)
	}
	for _, c := range []struct {
		order string
		want  []string
	}{
		{plain.OrderID, []string{"completed https://hooks.example.com/default", "completed https://hooks.example.com/every"}},
		{teamA.OrderID, []string{"completed https://hooks.example.com/every", "completed https://hooks.example.com/team-a",
			"step.claimed https://hooks.example.com/team-a"}},
	} {
		ds, err := b.store.ListWebhooks(ctx, statestore.WebhookFilter{OrderID: c.order, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range ds {
			got = append(got, d.Event+" "+d.URL)
		}
		slices.Sort(got)
		if !slices.Equal(got, c.want) {
			t.Errorf("order %s: deliveries %v, want %v", c.order, got, c.want)
		}
	}
}
