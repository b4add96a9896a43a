package workflow_test

import (
	"fmt"
	"strings"
	"testing"

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
