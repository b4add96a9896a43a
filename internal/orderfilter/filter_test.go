package orderfilter_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"sas/internal/orderfilter"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

const file = `workflows:
  - name: shop
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
      - {name: amount, type: number, expr: payload.amount}
      - {name: express, type: bool, expr: payload.express}
      - {name: due, type: time, expr: payload.due}
    steps: [{action: pay, agent: payments}]
  - name: other
    search_attributes:
      - {name: customer, type: number, expr: payload.customer}
    steps: [{action: pay, agent: payments}]
`

func TestWhereIsTypedByTheWorkflows(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("w.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		desc, workflow, where string
		want                  any    // the condition's value
		op                    string // its comparison
		err                   string // or the error it gives
	}{
		{"a string", "shop", "customer=42", "42", "=", ""},
		{"a quoted string with spaces around", "shop", ` customer = "c 1" `, "c 1", "=", ""},
		{"a number", "", "amount>=10.5", 10.5, ">=", ""},
		{"a bool", "", "express!=true", true, "!=", ""},
		{"a time", "", "due<2026-11-24T10:00", time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC), "<", ""},
		{"two types for one name", "", "customer=42", nil, "", "name the workflow too"},
		{"the other workflow's type", "other", "customer=42", 42.0, "=", ""},
		{"not a number", "", "amount=lots", nil, "", `"lots" is not a number`},
		{"a bool compared by size", "", "express<true", nil, "", "compare it with = or !="},
		{"no such attribute", "", "colour=red", nil, "", "no workflow declares it"},
		{"no operator", "", "customer", nil, "", "is not NAME=VALUE"},
		{"an injection", "", "customer=1' OR '1'='1", "1' OR '1'='1", "=", "name the workflow too"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := orderfilter.ParseWhere(reg, tc.workflow, tc.where)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want an error saying %q", c, err, tc.err)
				}
				return
			}
			if err != nil || c.Op != tc.op || c.Value.Value() != tc.want {
				t.Fatalf("got %s %#v, %v; want %s %#v", c.Op, c.Value.Value(), err, tc.op, tc.want)
			}
		})
	}
}

func TestFilterListsEveryProblem(t *testing.T) {
	t.Parallel()
	reg, _ := workflow.Parse("w.yaml", []byte(file))
	f := orderfilter.FromValues(url.Values{"status": {"lost"}, "from": {"yesterday"}, "id": {"xyz"}, "where": {"colour=red"}})
	_, err := f.Query(reg)
	var p orderfilter.Problems
	if !errors.As(err, &p) || len(p) != 4 {
		t.Fatalf("got %v, want 4 problems", err)
	}
	q, err := orderfilter.Filter{Status: "error", Where: []string{"amount>1"}, ID: "ab-C"}.Query(reg)
	if err != nil || q.Status != "error" || len(q.Attrs) != 1 || q.IDLow != "abc00000-0000-0000-0000-000000000000" {
		t.Fatalf("got %+v, %v", q, err)
	}
}

func TestCursorsRoundTripAndRefuseForgeries(t *testing.T) {
	t.Parallel()
	c := &statestore.OrderCursor{CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), OrderID: "0b5c1f3e-2a4d-4e8f-9a6b-7c8d9e0f1a2b"}
	got, err := orderfilter.DecodeCursor(orderfilter.EncodeCursor(c))
	if err != nil || !got.CreatedAt.Equal(c.CreatedAt) || got.OrderID != c.OrderID {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, bad := range []string{"x", "!!!", strings.Repeat("A", 300), "MjAyNnwx", orderfilter.EncodeCursor(c)[:10]} {
		if _, err := orderfilter.DecodeCursor(bad); !errors.Is(err, orderfilter.ErrCursor) {
			t.Errorf("cursor %q: %v", bad, err)
		}
	}
}
