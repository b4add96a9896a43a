package messages_test

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"

	"sas/internal/broker"
	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/submitter"
)

// TestAsyncAPIMatchesTheMessages keeps docs/asyncapi.yaml in step with
// the code: every channel address is a queue or exchange the services
// use, every message's schema has exactly the fields of its Go type, and
// bodies as the services encode them are valid by those schemas.
func TestAsyncAPIMatchesTheMessages(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../docs/asyncapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var y any
	if err := yaml.Unmarshal(raw, &y); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(y)
	var doc struct {
		AsyncAPI string `json:"asyncapi"`
		Channels map[string]struct {
			Address string `json:"address"`
		} `json:"channels"`
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.AsyncAPI, "3.") {
		t.Fatalf("asyncapi %q, want 3.x", doc.AsyncAPI)
	}
	topo := broker.Topology{Prefix: "{prefix}"}
	var addrs, want []string
	for _, c := range doc.Channels {
		addrs = append(addrs, c.Address)
	}
	want = []string{topo.Queue(submitter.Input), topo.Queue(messages.RequestsQueue("{kind}")), topo.Queue(messages.RepliesQueue), topo.Queue(messages.SignalsQueue),
		topo.StatusExchange(), topo.AlertsExchange()}
	slices.Sort(addrs)
	slices.Sort(want)
	if !slices.Equal(addrs, want) {
		t.Fatalf("channels %v, the services use %v", addrs, want)
	}

	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	id := messages.NewID()
	step := 2
	v1Only := []string{"customer", "items", "amount", "currency"}
	for _, tc := range []struct {
		schema  string
		msg     messages.Message
		without []string // fields of the Go type the schema does not have
	}{
		{"SubmitOrder", messages.SubmitOrder{SchemaVersion: 2, OrderID: id, Workflow: "onboard", Payload: json.RawMessage(`{"Tenant":"x"}`),
			Priority: 1, ReplyTo: "q", PlacedAt: &at, StartAt: &at}, v1Only},
		{"SubmitOrderV1", messages.SubmitOrder{SchemaVersion: 1, OrderID: id, Customer: "c", Items: []messages.Item{{SKU: "a", Qty: 1}},
			Amount: 5, Currency: "EUR", Workflow: "order"}, []string{"payload"}},
		{"StepEvent", messages.StepEvent{SchemaVersion: 1, OrderID: id, Step: 2, Name: "approval", Kind: "action", Event: messages.StepAwaiting,
			State: "awaiting", Attempt: 0, Wait: "approved", At: at, Reason: "waiting for signal approved"}, nil},
		{"StepRequest", messages.StepRequest{SchemaVersion: 2, OrderID: id, Step: 5, Name: "refund", Agent: "payment", Attempt: 1,
			IdempotencyKey: id + "/5/refund", CompleteBy: at, Payload: json.RawMessage(`{"a":1}`), Results: json.RawMessage(`{"charge":{"id":"c"}}`),
			Undoes: id + "/2/charge", UndoneResult: json.RawMessage(`{"id":"c"}`)}, nil},
		{"StepReply", messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 2, Outcome: messages.OutcomeOK,
			Result: json.RawMessage(`{"id":"r"}`), StartedAt: &at, CallMicros: 12, SentAt: &at}, nil},
		{"StatusEvent", messages.StatusEvent{SchemaVersion: 1, OrderID: id, Status: messages.StatusCompleted, Step: &step, At: at,
			Results: json.RawMessage(`{"a":{"id":1}}`)}, nil},
		{"OperatorAlert", messages.OperatorAlert{SchemaVersion: 1, OrderID: id, Step: 2, Reason: "r", FailureCount: 5, At: at}, nil},
		{"OperatorAlert", messages.OperatorAlert{SchemaVersion: 1, OrderID: id, Step: 2, Reason: "r", FailureCount: 5, At: at, Namespace: "team-a"}, nil},
		{"Signal", messages.Signal{SchemaVersion: 1, SignalID: "sig-1", OrderID: id, Name: "approved", Payload: json.RawMessage(`{"by":"ann"}`),
			ReplyTo: "q", By: "ann"}, nil},
		{"Signal", messages.Signal{SchemaVersion: 1, Name: messages.CallbackFail, Token: "st1." + id + ".1.2.mac", Error: "card declined",
			ReplyTo: "q"}, nil},
		{"StepReply", messages.StepReply{SchemaVersion: 1, OrderID: id, Step: 1, Attempt: 2, Outcome: messages.OutcomeAccepted,
			LastAnswer: "202 Accepted: queued", HoldMS: 90000}, nil},
		{"StepRequest", messages.StepRequest{SchemaVersion: 2, OrderID: id, Step: 1, Name: "charge", Agent: "payment", Attempt: 1,
			IdempotencyKey: id + "/1/charge", CompleteBy: at, Payload: json.RawMessage(`{"a":1}`), Token: "st1." + id + ".1.1.mac"}, nil},
	} {
		schema, ok := doc.Components.Schemas[tc.schema]
		if !ok {
			t.Errorf("no schema %s", tc.schema)
			continue
		}
		var props, fields []string
		for p := range schema["properties"].(map[string]any) {
			props = append(props, p)
		}
		rt := reflect.TypeOf(tc.msg)
		for i := range rt.NumField() {
			name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
			if !slices.Contains(tc.without, name) {
				fields = append(fields, name)
			}
		}
		slices.Sort(props)
		slices.Sort(fields)
		if !slices.Equal(props, fields) {
			t.Errorf("%s: documented %v, the message has %v", tc.schema, props, fields)
		}
		body, err := messages.Encode(tc.msg)
		if err != nil {
			t.Fatalf("%s: %v", tc.schema, err)
		}
		sch := testenv.JSONSchema(t, schema, jsonschema.Draft7)
		v, _ := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s: %s is not valid by the document: %v", tc.schema, body, err)
		}
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		m["unexpected"] = true
		if sch.Validate(m) == nil {
			t.Errorf("%s: the documented schema takes an unknown field, the decoder does not", tc.schema)
		}
	}
}
