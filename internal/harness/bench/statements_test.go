package bench

import (
	"math"
	"strings"
	"testing"

	"sas/internal/statestore/lab"
)

// TestStatementsAreReportedPerOrder: each statement's figures are per
// completed order and per call, its share is of the clients' statements
// alone (a trigger's statement is inside its caller's time), and the
// printed table marks what a function ran.
func TestStatementsAreReportedPerOrder(t *testing.T) {
	r := &benchReport{}
	r.fillStatements([]lab.Statement{
		{Query: "WITH r AS (reply)", Calls: 50, TotalMS: 300, Rows: 1000, TopLevel: true},
		{Query: "INSERT INTO transitions", Calls: 100, TotalMS: 120, Rows: 3000},
		{Query: "WITH o AS (insert)", Calls: 20, TotalMS: 100, Rows: 1000, TopLevel: true},
	}, 1000)
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	want := []statementUse{
		{Query: "WITH r AS (reply)", Calls: 50, CallsPerOrder: 0.05, MSPerCall: 6, MSPerOrder: 0.3, RowsPerCall: 20, SharePercent: 75, TopLevel: true},
		{Query: "INSERT INTO transitions", Calls: 100, CallsPerOrder: 0.1, MSPerCall: 1.2, MSPerOrder: 0.12, RowsPerCall: 30, SharePercent: 30},
		{Query: "WITH o AS (insert)", Calls: 20, CallsPerOrder: 0.02, MSPerCall: 5, MSPerOrder: 0.1, RowsPerCall: 50, SharePercent: 25, TopLevel: true},
	}
	if len(r.Statements) != len(want) {
		t.Fatalf("%d statements reported, want %d", len(r.Statements), len(want))
	}
	for i, w := range want {
		g := r.Statements[i]
		if g.Query != w.Query || g.Calls != w.Calls || g.TopLevel != w.TopLevel || !near(g.CallsPerOrder, w.CallsPerOrder) ||
			!near(g.MSPerCall, w.MSPerCall) || !near(g.MSPerOrder, w.MSPerOrder) || !near(g.RowsPerCall, w.RowsPerCall) || !near(g.SharePercent, w.SharePercent) {
			t.Errorf("statement %d: %+v, want %+v", i, g, w)
		}
	}
	var b strings.Builder
	printStatements(&b, r.Statements)
	out := b.String()
	if !strings.Contains(out, "(inside a function) INSERT INTO transitions") || strings.Contains(out, "(inside a function) WITH") {
		t.Errorf("the table does not mark only the function's statement:\n%s", out)
	}
	if !strings.Contains(out, "0.300") || !strings.Contains(out, "75.0%") {
		t.Errorf("the table lacks the reply's ms per order or share:\n%s", out)
	}

	// No order completed: per call only, never a division by zero.
	r = &benchReport{}
	r.fillStatements([]lab.Statement{{Query: "SELECT 1", Calls: 4, TotalMS: 2, TopLevel: true}}, 0)
	if s := r.Statements[0]; s.MSPerOrder != 0 || s.CallsPerOrder != 0 || s.MSPerCall != 0.5 || s.SharePercent != 100 {
		t.Errorf("with no order completed: %+v", s)
	}
}
