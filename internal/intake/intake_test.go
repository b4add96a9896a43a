package intake

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

const intakeFile = `
workflows:
  - name: shop
    payload_schema:
      type: object
      required: [customer, amount]
      properties:
        customer: {type: string}
        amount: {type: number}
    concurrency_key: payload.customer
    max_per_key: 2
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
      - {name: amount, type: number, expr: payload.amount}
      - {name: express, type: bool, expr: payload.express}
    steps:
      - {action: pay, agent: payments, timeout: 20s, compensation: {action: refund, agent: payments}}
      - {action: ship, agent: shipping}
  - name: parcels
    steps:
      - {action: label, agent: shipping, for_each: payload.parcels, max_items: 2}
  - name: team-b-only
    namespaces: [team-b]
    steps:
      - {action: label, agent: shipping}
`

func registry(t *testing.T) *workflow.Registry {
	t.Helper()
	reg, err := workflow.Parse("intake_test.yaml", []byte(intakeFile))
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func refusal(t *testing.T, err error) *Refusal {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) {
		t.Fatalf("%v is not a refusal", err)
	}
	return r
}

// TestPrepareRefusesWhatItsWorkflowRefuses: an order of no workflow, a
// payload its schema refuses (the place it names), a for_each list past
// max_items: each a refusal with its reason and a detail a person reads.
func TestPrepareRefusesWhatItsWorkflowRefuses(t *testing.T) {
	t.Parallel()
	reg := registry(t)
	for _, tc := range []struct {
		name, workflow, payload, reason, detail string
	}{
		{"no such workflow", "nope", `{}`, ReasonUnknownWorkflow, `workflow "nope" is not defined (known: [parcels shop])`},
		{"another namespace's workflow", "team-b-only", `{}`, ReasonUnknownWorkflow, `workflow "team-b-only" is not defined (known: [parcels shop])`},
		{"a required key missing", "shop", `{"customer": "c-1"}`, messages.ReasonInvalidPayload, "at /: "},
		{"a wrong type", "shop", `{"customer": "c-1", "amount": "ten"}`, messages.ReasonInvalidPayload, "at /amount: "},
		{"a list too long", "parcels", `{"parcels": [1, 2, 3]}`, messages.ReasonInvalidPayload, "max_items"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: tc.workflow,
				Payload: json.RawMessage(tc.payload)}
			_, err := Prepare(reg, o, "", 0, "test")
			r := refusal(t, err)
			if r.Reason != tc.reason || !strings.Contains(r.Detail, tc.detail) {
				t.Fatalf("refusal %q %q, want %q containing %q", r.Reason, r.Detail, tc.reason, tc.detail)
			}
		})
	}
}

// TestPrepareMakesTheSameOrderEitherWay: the order to write carries its
// workflow's version, policy, steps (with their compensations), search
// attributes and concurrency key; a step budget set by the service
// replaces every step's; and the same payload written with other spaces
// or key order hashes the same (a resubmission is not a conflict).
func TestPrepareMakesTheSameOrderEitherWay(t *testing.T) {
	t.Parallel()
	reg := registry(t)
	id := messages.NewID()
	at := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: id, Workflow: "shop", Priority: 3, ReplyTo: "client.r",
		PlacedAt: &at, Payload: json.RawMessage(`{"customer": "c-1", "amount": 12.5, "express": true}`)}
	got, err := Prepare(reg, o, "", 0, "submitter:1")
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("shop")
	if got.OrderID != id || got.Workflow != "shop" || got.WorkflowVersion != wf.Version() || got.Priority != 3 || got.ReplyTo != "client.r" ||
		got.PlacedAt == nil || !got.PlacedAt.Equal(at) || got.Actor != "submitter:1" || got.FailurePolicy != wf.Policy {
		t.Fatalf("order %+v", got)
	}
	if len(got.Steps) != 3 || got.Steps[0].Name != "pay" || got.Steps[0].Timeout != 20*time.Second || got.Steps[2].Name != "refund" {
		t.Fatalf("steps %+v", got.Steps)
	}
	if got.Key == nil || got.Key.Key != "c-1" || got.Key.MaxPerKey != 2 {
		t.Fatalf("key %+v", got.Key)
	}
	if len(got.Attributes) != 3 || *got.Attributes[0].Text != "c-1" || *got.Attributes[1].Num != 12.5 || !*got.Attributes[2].Bool {
		t.Fatalf("attributes %+v", got.Attributes)
	}
	budget, err := Prepare(reg, o, "", 5*time.Second, "submitter:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range budget.Steps {
		if st.Timeout != 5*time.Second {
			t.Fatalf("a service's step budget was not applied: %+v", budget.Steps)
		}
	}
	o.Payload = json.RawMessage(`{ "express":true,"amount":12.5,  "customer":"c-1" }`)
	again, err := Prepare(reg, o, "", 0, "api:1")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.PayloadHash, got.PayloadHash) {
		t.Fatal("the same payload, spaced and ordered otherwise, hashes otherwise")
	}
	o.Payload = json.RawMessage(`{"customer": "c-1", "amount": 13}`)
	other, err := Prepare(reg, o, "", 0, "api:1")
	if err != nil || bytes.Equal(other.PayloadHash, got.PayloadHash) {
		t.Fatalf("another payload hashes the same (%v)", err)
	}
}

// TestCheckPayloadBoundsARerunsPayload: a re-run's corrected payload is
// checked as a submit's is: JSON, within bounds, valid for its schema.
func TestCheckPayloadBoundsARerunsPayload(t *testing.T) {
	t.Parallel()
	wf, _ := registry(t).Lookup("shop")
	for _, tc := range []struct {
		payload string
		ok      bool
	}{
		{`{"customer": "c-2", "amount": 1}`, true},
		{`{"customer": "c-2"`, false},
		{`{"customer": 2, "amount": 1}`, false},
		{`{"customer": "` + strings.Repeat("x", messages.MaxPayloadBytes) + `", "amount": 1}`, false},
	} {
		err := CheckPayload(wf, []byte(tc.payload))
		if tc.ok != (err == nil) {
			t.Fatalf("payload %.60s: %v", tc.payload, err)
		}
		if err != nil && refusal(t, err).Reason != messages.ReasonInvalidPayload {
			t.Fatalf("payload %.60s: reason %v", tc.payload, err)
		}
	}
}

// TestAttributeKeepsEachTypeInItsColumn: a search attribute's value goes
// to the column of its type, and to no other.
func TestAttributeKeepsEachTypeInItsColumn(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, tc := range []struct {
		v    any
		want func(a statestore.Attribute) bool
	}{
		{"x", func(a statestore.Attribute) bool {
			return a.Text != nil && *a.Text == "x" && a.Num == nil && a.Bool == nil && a.Time == nil
		}},
		{2.5, func(a statestore.Attribute) bool { return a.Num != nil && *a.Num == 2.5 && a.Text == nil }},
		{true, func(a statestore.Attribute) bool { return a.Bool != nil && *a.Bool && a.Num == nil }},
		{now, func(a statestore.Attribute) bool { return a.Time != nil && a.Time.Equal(now) && a.Text == nil }},
		{[]int{1}, func(a statestore.Attribute) bool {
			return a.Text == nil && a.Num == nil && a.Bool == nil && a.Time == nil
		}},
	} {
		if a := Attribute("n", tc.v); a.Name != "n" || !tc.want(a) {
			t.Fatalf("%v kept as %+v", tc.v, a)
		}
	}
}

// TestPrepareGivesTheOrderItsDeadline: an order runs under its
// workflow's deadline and on_deadline, or under its own deadline when
// it gives one; a deadline that is not a duration from 1s to 366d is
// refused with why, at every way in (Validate is the submit queue's
// and the API's check).
func TestPrepareGivesTheOrderItsDeadline(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("w.yaml", []byte(`
workflows:
  - name: bounded
    deadline: 2h
    on_deadline: hold
    steps: [{action: a, agent: x}]
  - name: open
    steps: [{action: a, agent: x}]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		workflow, own string
		want          time.Duration
		how           string
	}{
		{"bounded", "", 2 * time.Hour, workflow.Hold},
		{"bounded", "90m", 90 * time.Minute, workflow.Hold},
		{"open", "", 0, ""},
		{"open", "14d", 14 * 24 * time.Hour, workflow.Compensate},
	} {
		o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: tc.workflow,
			Payload: json.RawMessage(`{}`), Deadline: tc.own}
		if err := o.Validate(); err != nil {
			t.Fatalf("%s %q: %v", tc.workflow, tc.own, err)
		}
		n, err := Prepare(reg, o, "", 0, "test")
		if err != nil || n.Deadline != tc.want || n.OnDeadline != tc.how {
			t.Fatalf("%s with deadline %q: %v %q (%v), want %v %q", tc.workflow, tc.own, n.Deadline, n.OnDeadline, err, tc.want, tc.how)
		}
	}
	for _, bad := range []string{"soon", "500ms", "367d", "-2h", "2h" + strings.Repeat("0s", 20), "1d2h"} {
		o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: "open",
			Payload: json.RawMessage(`{}`), Deadline: bad}
		err := o.Validate()
		var r *messages.DecodeError
		if !errors.As(err, &r) || r.Reason != messages.ReasonInvalidValue || !strings.Contains(r.Detail, "not a duration from 1s to 366d") {
			t.Fatalf("deadline %q: %v, want invalid_value saying what a deadline is", bad, err)
		}
	}
}

// A workflow of some namespaces is there for their submits alone.
func TestPrepareTakesAWorkflowInItsNamespaces(t *testing.T) {
	t.Parallel()
	reg := registry(t)
	o := messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: "team-b-only", Payload: json.RawMessage(`{}`)}
	if n, err := Prepare(reg, o, "team-b", 0, "test"); err != nil || n.Workflow != "team-b-only" {
		t.Fatalf("team-b's submit: %+v %v", n, err)
	}
	for _, ns := range []string{"", "default", "team-a"} {
		if r := refusal(t, func() error { _, err := Prepare(reg, o, ns, 0, "test"); return err }()); r.Reason != ReasonUnknownWorkflow ||
			strings.Contains(r.Detail, "known: [parcels shop team-b-only]") {
			t.Fatalf("namespace %q's submit: %q %q", ns, r.Reason, r.Detail)
		}
	}
}
