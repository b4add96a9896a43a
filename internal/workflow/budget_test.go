package workflow

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// costlyPayload is a 9 KB payload of 300 strings: a quadratic expression
// over it is a few hundred thousand operations.
func costlyPayload() []byte { return listPayload(300) }

func listPayload(n int) []byte {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`"item-%04d-xxxxxxxxxxxxxxxxxx"`, i)
	}
	return []byte(`{"items":[` + strings.Join(items, ",") + `]}`)
}

const quadratic = "payload.items.map(x, payload.items.filter(y, y == x).size()).size()"

// TestSubmitExpressionsAreBounded: a search attribute or a concurrency
// key read at every submit, on every entrance, stops at its budget (a
// tenth of a step's cost, SubmitExprTime for them all): the attribute is
// left out, the key is "", the order is not refused.
func TestSubmitExpressionsAreBounded(t *testing.T) {
	t.Parallel()
	reg, err := Parse("w.yaml", []byte(`
workflows:
  - name: w
    search_attributes:
      - {name: cheap, type: number, expr: "payload.items.size()"}
      - {name: costly, type: number, expr: "`+quadratic+`"}
    concurrency_key: "string(`+quadratic+`)"
    steps:
      - {action: a, agent: k}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := reg.Lookup("w")
	attrs := wf.Attributes(costlyPayload())
	if len(attrs) != 1 || attrs[0].Name != "cheap" || attrs[0].Value != 300.0 {
		t.Fatalf("attributes %+v, want only cheap=300", attrs)
	}
	if k, ok := wf.Key(costlyPayload()); !ok || k != "" {
		t.Fatalf("key %q %v, want \"\" (its expression stopped)", k, ok)
	}
}

// TestAnEvaluationStopsWhenItsTimeIsUp: the clock bounds an evaluation as
// well as its counted cost: one whose time is up says so.
func TestAnEvaluationStopsWhenItsTimeIsUp(t *testing.T) {
	t.Parallel()
	e, err := CompileExpr(quadratic, UseInput)
	if err != nil {
		t.Fatal(err)
	}
	act, err := Vars{Payload: costlyPayload()}.activation(UseInput)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.evalIn(ctx, act); err == nil || !strings.Contains(err.Error(), "took longer than it may") {
		t.Fatalf("an evaluation out of time: %v", err)
	}
	// With its time, it ends.
	if v, err := e.JSON(Vars{Payload: listPayload(50)}); err != nil || string(v) != "50" {
		t.Fatalf("within its budget: %s %v", v, err)
	}
}
