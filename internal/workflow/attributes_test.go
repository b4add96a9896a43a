package workflow_test

import (
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

const withAttributes = `workflows:
  - name: shop
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
      - {name: amount, type: number, expr: payload.amount}
      - {name: express, type: bool, expr: "has(payload.express) && payload.express"}
      - {name: due, type: time, expr: payload.due}
      - {name: region, type: string, expr: payload.address.region}
    steps:
      - {action: pay, agent: payments}
`

// TestSearchAttributesAreReadTyped: each attribute's expression is read
// from the payload and converted to its type; one the payload lacks, or
// of another type, is left out and never refuses the order.
func TestSearchAttributesAreReadTyped(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("w.yaml", []byte(withAttributes))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("shop")
	for _, tc := range []struct {
		desc, payload string
		want          map[string]any
	}{
		{"all of them", `{"customer": "c-42", "amount": 12, "express": true, "due": "2026-11-24T10:00:00Z", "address": {"region": "eu"}}`,
			map[string]any{"customer": "c-42", "amount": 12.0, "express": true, "due": time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC), "region": "eu"}},
		{"a number as the string attribute, no express, no address", `{"customer": 42, "amount": 1.5}`,
			map[string]any{"customer": "42", "amount": 1.5, "express": false}},
		{"wrong types are left out", `{"customer": {"id": 1}, "amount": "12", "due": "tomorrow", "express": "yes"}`,
			map[string]any{}},
		{"a string longer than the limit is left out", `{"customer": "` + strings.Repeat("x", workflow.MaxAttrText+1) + `"}`,
			map[string]any{"express": false}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			got := map[string]any{}
			for _, a := range wf.Attributes([]byte(tc.payload)) {
				got[a.Name] = a.Value
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %#v, want %#v", k, got[k], v)
				}
			}
		})
	}
}

func TestBadSearchAttributesAreRefusedAtTheirLines(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ desc, attrs, want string }{
		{"unknown type", `[{name: a, type: money, expr: payload.a}]`, `type "money" is not known`},
		{"bad name", `[{name: A-b, type: string, expr: payload.a}]`, `name "A-b" is not a name`},
		{"reads results", `[{name: a, type: string, expr: results.x}]`, `does not compile`},
		{"twice", `[{name: a, type: string, expr: payload.a}, {name: a, type: number, expr: payload.b}]`, `declared twice`},
		{"no expr", `[{name: a, type: string}]`, `expr`},
		{"not a list", `{name: a}`, `must be a list`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			file := "workflows:\n  - name: shop\n    search_attributes: " + tc.attrs + "\n    steps:\n      - {action: pay, agent: payments}\n"
			_, err := workflow.Parse("w.yaml", []byte(file))
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "w.yaml:3") {
				t.Fatalf("got %v, want an error at line 3 saying %q", err, tc.want)
			}
		})
	}
}
