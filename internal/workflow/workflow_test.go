package workflow_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

func TestBuiltin(t *testing.T) {
	t.Parallel()
	r := workflow.Builtin()
	wf, ok := r.Lookup("")
	if !ok || wf.Name != workflow.DefaultName || len(wf.Steps) != 3 {
		t.Fatalf("default workflow: %+v %v", wf, ok)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Fatal("found an unknown workflow")
	}
	if got := r.Agents(); len(got) != 3 {
		t.Fatalf("agents %v", got)
	}
}

func TestNewRegistryRejectsBadDefinitions(t *testing.T) {
	t.Parallel()
	ok := workflow.Step{Name: "a", Agent: "x", Timeout: time.Second, MaxFailures: 1}
	for _, tc := range []struct {
		desc string
		wfs  []workflow.Workflow
	}{
		{"no steps", []workflow.Workflow{{Name: "w"}}},
		{"no name", []workflow.Workflow{{Steps: []workflow.Step{ok}}}},
		{"twice", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{ok}}, {Name: "w", Steps: []workflow.Step{ok}}}},
		{"zero timeout", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{{Name: "a", Agent: "x", MaxFailures: 1}}}}},
		{"zero threshold", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{{Name: "a", Agent: "x", Timeout: time.Second}}}}},
	} {
		if _, err := workflow.NewRegistry(tc.wfs...); err == nil {
			t.Errorf("%s: accepted", tc.desc)
		}
	}
}

func TestRowsPutCompensationsInReverse(t *testing.T) {
	t.Parallel()
	wf, _ := workflow.Builtin().Lookup("order")
	var got []string
	for _, r := range wf.Rows() {
		got = append(got, fmt.Sprintf("%s/%d", r.Name, r.Compensates))
	}
	want := "reserve_inventory/0 charge_payment/0 create_shipment/0 cancel_shipment/3 refund_payment/2 release_inventory/1"
	if strings.Join(got, " ") != want {
		t.Fatalf("rows %v, want %s", got, want)
	}
	if hold, _ := workflow.Builtin().Lookup("order_hold"); hold.Policy != workflow.Hold {
		t.Fatalf("order_hold policy %q", hold.Policy)
	}
}
