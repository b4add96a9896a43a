package workflow_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

// TestListsKeepTheirVersions: a file valid before graphs means the same
// and hashes the same: the built-in workflows keep the versions they had.
func TestListsKeepTheirVersions(t *testing.T) {
	t.Parallel()
	want := map[string]string{"order": "444ef1f7548df3f9", "order_hold": "d56db27c81e5c830", "single": "6f7515c7b5ca7e12"}
	for _, wf := range workflow.Builtin().All() {
		if _, old := want[wf.Name]; !old {
			continue // added since
		}
		if wf.Graph {
			t.Errorf("%s is a list, read as a graph", wf.Name)
		}
		if wf.Version() != want[wf.Name] {
			t.Errorf("%s version %s, was %s", wf.Name, wf.Version(), want[wf.Name])
		}
	}
	// Spelling out a list's needs keeps it a list.
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: w
    steps:
      - {action: a, agent: x, needs: []}
      - {action: b, agent: x, needs: [a]}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("w")
	if wf.Graph || wf.Steps[1].Needs != nil {
		t.Fatalf("default needs made a graph: %+v", wf)
	}
}

const fulfil = `
workflows:
  - name: fulfil
    steps:
      - action: reserve_stock
        agent: inventory
        compensation: {action: release_stock}
      - action: charge_card
        agent: payment
        needs: []
        compensation: {action: refund_card}
      - action: book_parcel
        agent: shipping
        needs: [reserve_stock, charge_card]
        for_each: payload.parcels
        max_parallel: 5
        compensation: {action: cancel_parcel}
      - action: manual_review
        agent: review
        needs: [charge_card]
        when: payload.amount > 100000
`

func TestGraphRowsNeedsAndCompensationOrder(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(fulfil))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("fulfil")
	if !wf.Graph {
		t.Fatal("fulfil is not a graph")
	}
	rows := wf.Rows()
	got := []string{}
	for i, row := range rows {
		got = append(got, fmt.Sprintf("%d %s needs %v anc %v", i+1, row.Name, row.Needs, row.Ancestors))
	}
	want := []string{
		"1 reserve_stock needs [] anc []",
		"2 charge_card needs [] anc []",
		"3 book_parcel needs [1 2] anc [1 2]",
		"4 manual_review needs [2] anc [2]",
		// compensations: last action first; cancel_parcel first (nothing
		// after book_parcel), refund_card and release_stock after it.
		"5 cancel_parcel needs [] anc [1 2 3 4]",
		"6 refund_card needs [5] anc [1 2 3 4]",
		"7 release_stock needs [5] anc [1 2 3 4]",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if wf.Steps[2].MaxItems != workflow.DefaultMaxItems || wf.Steps[2].MaxParallel != 5 {
		t.Fatalf("for_each bounds %d/%d", wf.Steps[2].MaxItems, wf.Steps[2].MaxParallel)
	}
	levels := wf.Levels()
	if fmt.Sprint(levels) != "[[0 1] [2 3]]" {
		t.Fatalf("levels %v", levels)
	}
	if err := wf.CheckForEach([]byte(`{"parcels":[1,2,3]}`)); err != nil {
		t.Fatal(err)
	}
	long := `{"parcels":[` + strings.TrimSuffix(strings.Repeat("1,", 101), ",") + `]}`
	if err := checkForEachInTime(wf, long); err == nil || !strings.Contains(err.Error(), "101 items") {
		t.Fatalf("a list of 101 past max_items 100: %v", err)
	}
	// A list that is none refuses the order at submit: book_parcel has no
	// when, so it would fail at run time on the same payload.
	for _, payload := range []string{`{"parcels":null}`, `{}`, `{"parcels":{"a":1}}`, `{"parcels":"p1"}`, `{"parcels":3}`} {
		if err := checkForEachInTime(wf, payload); err == nil || !strings.Contains(err.Error(), "step book_parcel") {
			t.Errorf("for_each over %s: %v, want a refusal naming the step", payload, err)
		}
	}
}

// checkForEachInTime is CheckForEach on payload, asked again when it
// returned nil: a check that outran the submit's budget of time
// (SubmitExprTime) leaves the lists to run time and says nil, which a
// loaded machine running the race detector (make test) met once. Within
// the budget the answer is always the same: five tries give the check
// five chances to finish in time.
func checkForEachInTime(wf workflow.Workflow, payload string) error {
	var err error
	for range 5 {
		if err = wf.CheckForEach([]byte(payload)); err != nil {
			return err
		}
	}
	return err
}

// TestForEachTakesOnlyAList: a for_each expression yields a list or
// fails with what it yields instead; null is not an empty list.
func TestForEachTakesOnlyAList(t *testing.T) {
	t.Parallel()
	e, err := workflow.CompileExpr("payload.items", workflow.UseForEach)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		desc, payload string
		items         int
		want          string
	}{
		{"a list", `{"items":[1,{"a":2},null]}`, 3, ""},
		{"an empty list", `{"items":[]}`, 0, ""},
		{"null", `{"items":null}`, 0, "yields null_type, not a list"},
		{"a missing field", `{}`, 0, "no such key: items"},
		{"an object", `{"items":{"a":1}}`, 0, "not a list"},
		{"a string", `{"items":"abc"}`, 0, "not a list"},
		{"a number", `{"items":5}`, 0, "not a list"},
		{"a bool", `{"items":true}`, 0, "not a list"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			items, err := e.List(workflow.Vars{Payload: []byte(c.payload)})
			if c.want == "" {
				if err != nil || len(items) != c.items {
					t.Fatalf("%d items, %v; want %d", len(items), err, c.items)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%d items, %v; want an error saying %q", len(items), err, c.want)
			}
		})
	}
}

// TestGraphProblemsAtTheirLines: each kind of mistake is refused at its
// line, saying what to write instead, all at once.
func TestGraphProblemsAtTheirLines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, steps string
		line        int
		want        string
	}{
		{"unknown needs", `
      - {action: a, agent: x}
      - {action: b, agent: x, needs: [aa]}`, 7, `needs "aa": workflow "w" has no such step; did you mean "a"?`},
		{"cycle", `
      - {action: a, agent: x, needs: [b]}
      - {action: b, agent: x, needs: [a]}`, 6, "form a cycle"},
		{"self cycle", `
      - {action: a, agent: x, needs: [a]}`, 6, "a → a form a cycle"},
		{"unreachable", `
      - {action: a, agent: x, when: "false"}
      - {action: b, agent: x, needs: [a]}`, 6, "can never run: its when is always false"},
		{"needs a step that never runs", `
      - {action: a, agent: x, when: "1 > 2"}
      - {action: b, agent: x, needs: [a]}
      - {action: c, agent: x, needs: [b]}`, 7, `step "b" is unreachable: it needs "a"`},
		{"expression does not compile", `
      - {action: a, agent: x, when: "payload.amount >"}`, 6, "does not compile"},
		{"when not a bool", `
      - {action: a, agent: x, when: "1 + 2"}`, 6, "yields int, not a bool"},
		{"for_each not a list", `
      - {action: a, agent: x, for_each: "'text'"}`, 6, "not a list"},
		{"input does not compile", `
      - {action: a, agent: x, needs: [], input: "item.sku"}`, 6, "undeclared reference to 'item'"},
		{"for_each unbounded", `
      - {action: a, agent: x, for_each: payload.lines, max_items: 10}`, 6, "lets lines have 500 items, more than max_items 10"},
		{"max_items too high", `
      - {action: a, agent: x, for_each: payload.lines, max_items: 5000}`, 6, "max_items \"5000\" is not a whole number from 1 to 1000"},
		{"bound without for_each", `
      - {action: a, agent: x, max_parallel: 3}`, 6, "bound a for_each step"},
		{"duplicate ids", `
      - {action: a, agent: x, id: one}
      - {action: a, agent: x, id: one, needs: []}`, 7, `id "one" is used twice`},
		{"delay not a duration", `
      - {action: a, agent: x, delay: soon}`, 6, `delay "soon" is not a duration from 1ms to 366d`},
		{"delay past a year", `
      - {action: a, agent: x, delay: 400d}`, 6, `delay "400d" is not a duration`},
		{"delay on a compensation", `
      - {action: a, agent: x, compensation: {action: undo_a, delay: 1h}}`, 6, `delay`},
		{"wait with an agent", `
      - {id: ok, agent: x, wait: {signal: approved, timeout: 1h}}`, 6, "a wait step calls no agent"},
		{"wait without an id", `
      - {wait: {signal: approved, timeout: 1h}}`, 6, `a wait step has no "id"`},
		{"wait with a delay", `
      - {id: ok, delay: 1h, wait: {signal: approved, timeout: 1h}}`, 6, "a wait step cannot have a delay"},
		{"wait without a timeout", `
      - {id: ok, wait: {signal: approved}}`, 6, `wait has no "timeout"`},
		{"wait on_timeout unknown", `
      - {id: ok, wait: {signal: approved, timeout: 1h, on_timeout: retry}}`, 6, `on_timeout "retry" is not fail or skip`},
		{"wait with a compensation", `
      - id: ok
        wait: {signal: approved, timeout: 1h}
        compensation: {action: undo}`, 8, "a wait step does nothing to undo"},
		{"no agent and no delay", `
      - {action: a}`, 6, `a step has no "agent"`},
		{"N-of-M join needing every one", `
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: 2, of: [a, b]}}`, 8, `any must be fewer than the steps it names`},
		{"N-of-M join without any", `
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - {action: j, agent: x, needs: {of: [a, b]}}`, 8, `says how many of its steps must end`},
		{"N-of-M join with any not a number", `
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - {action: c, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: two, of: [a, b, c]}}`, 9, `needs' any "two" is not a whole number from 1 to 1000`},
		{"N-of-M join with an unknown key", `
      - {action: a, agent: x}
      - {action: b, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: 1, of: [a, b], all: 2}}`, 8, `needs has no key "all"`},
		{"N-of-M join of no list", `
      - {action: a, agent: x}
      - {action: j, agent: x, needs: {any: 1, of: a}}`, 7, `needs must be a list`},
		{"N-of-M join of steps that never run", `
      - {action: a, agent: x, when: "false"}
      - {action: b, agent: x, when: "false", needs: []}
      - {action: c, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: 2, of: [a, b, c]}}`, 9, `step "j" is unreachable: it needs "b"`},
		{"action twice without ids", `
      - {action: a, agent: x}
      - {action: a, agent: x, needs: []}`, 7, `or each use of the action its own "id:"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			file := `
workflows:
  - name: w
    payload_schema: {type: object, properties: {lines: {type: array, maxItems: 500}}}
    steps:` + c.steps + "\n"
			_, err := workflow.Parse("f.yaml", []byte(file))
			ps, ok := workflow.AsProblems(err)
			if !ok {
				t.Fatalf("accepted (%v)", err)
			}
			for _, p := range ps {
				if p.Line == c.line && strings.Contains(p.Msg, c.want) {
					return
				}
			}
			t.Fatalf("want %q at line %d, got:\n%v", c.want, c.line, err)
		})
	}
}

// TestActionUsedTwiceWithIDs: ids name the uses of one action, in needs
// and in the definition.
func TestActionUsedTwiceWithIDs(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: w
    steps:
      - {action: notify, agent: mail, id: notify_start}
      - {action: work, agent: x, needs: [notify_start]}
      - {action: notify, agent: mail, id: notify_end, needs: [work]}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("w")
	if !wf.Graph || wf.Steps[2].Ref() != "notify_end" || !strings.Contains(string(wf.Definition()), `"id":"notify_end"`) {
		t.Fatalf("%s", wf.Definition())
	}
}

// TestDelayMakesAGraph: a step's delay, in days or any unit, makes its
// workflow a graph (lists keep their versions) and goes into its row's
// spec in milliseconds, where the state store reads it.
func TestDelayMakesAGraph(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: w
    steps:
      - {action: score, agent: risk}
      - {action: cooling_off, agent: x, delay: 14d}
      - {action: open_account, agent: x, delay: 250ms}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("w")
	rows := wf.Rows()
	if !wf.Graph || wf.Steps[1].Delay != 14*24*time.Hour || string(rows[1].Spec()) != `{"delay_ms":1209600000}` ||
		string(rows[2].Spec()) != `{"delay_ms":250}` || rows[0].Spec() != nil || fmt.Sprint(rows[2].Needs) != "[2]" {
		t.Fatalf("graph %v, delay %v, specs %s %s %s, needs %v", wf.Graph, wf.Steps[1].Delay, rows[0].Spec(), rows[1].Spec(),
			rows[2].Spec(), rows[2].Needs)
	}
}

// TestMaxDurationRidesInTheSpec: a step's max_duration is kept in its
// row's spec, in a list (whose rows carry no other spec) and for a
// compensation too, without making the list a graph or changing the
// version of a file that says none.
func TestMaxDurationRidesInTheSpec(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: w
    steps:
      - action: a
        agent: x
        max_duration: 2h
        compensation: {action: undo_a, max_duration: 30m}
      - {action: b, agent: x}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("w")
	rows := wf.Rows()
	if wf.Graph || string(rows[0].Spec()) != `{"max_duration_ms":7200000}` || rows[1].Spec() != nil ||
		string(rows[2].Spec()) != `{"max_duration_ms":1800000}` {
		t.Fatalf("graph %v, specs %s %s %s", wf.Graph, rows[0].Spec(), rows[1].Spec(), rows[2].Spec())
	}
}

// TestWaitsAndTimersAlone: a wait step takes its id for its name and
// keeps its signal, timeout and schema in its row's spec; a step with a
// delay and no agent is a timer alone; neither is an agent kind.
func TestWaitsAndTimersAlone(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk}
      - id: approval
        wait: {signal: approved, timeout: 72h, on_timeout: skip, schema: {type: object}}
      - {action: cooling_off, delay: 14d, needs: [approval]}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("loan")
	rows := wf.Rows()
	if rows[1].Name != "approval" || !rows[1].InSystem() || !rows[2].InSystem() || !r.HasSystemSteps() ||
		!slices.Equal(r.Agents(), []string{"risk"}) {
		t.Fatalf("rows %+v, agents %v", rows, r.Agents())
	}
	if got := string(rows[1].Spec()); got != `{"id":"approval","wait":{"signal":"approved","timeout_ms":259200000,"on_timeout":"skip","schema":{"type":"object"}}}` {
		t.Fatalf("the wait's spec %s", got)
	}
}

func TestExpressionsEvaluate(t *testing.T) {
	t.Parallel()
	when, err := workflow.CompileExpr("payload.amount > 100000 && results.charge.ok", workflow.UseWhen)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := when.Bool(workflow.Vars{Payload: []byte(`{"amount":200000}`), Results: []byte(`{"charge":{"ok":true}}`)})
	if err != nil || !ok {
		t.Fatalf("%v %v", ok, err)
	}
	if _, err := when.Bool(workflow.Vars{Payload: []byte(`{}`)}); err == nil || !strings.Contains(err.Error(), "no such key") {
		t.Fatalf("a missing key: %v", err)
	}
	input, err := workflow.CompileExpr("{'sku': item.sku, 'n': index, 'all': payload.parcels.size()}", workflow.UseItemInput)
	if err != nil {
		t.Fatal(err)
	}
	out, err := input.JSON(workflow.Vars{Payload: []byte(`{"parcels":[1,2]}`), Item: []byte(`{"sku":"A"}`), Index: 1})
	if err != nil || string(out) != `{"all":2,"n":1,"sku":"A"}` && string(out) != `{"all":2, "n":1, "sku":"A"}` {
		t.Fatalf("input %s %v", out, err)
	}
	list, _ := workflow.CompileExpr("payload.parcels", workflow.UseForEach)
	if _, err := list.List(workflow.Vars{Payload: []byte(`{"parcels":"no"}`)}); err == nil {
		t.Fatal("a string read as a list")
	}
	// A payload cannot make an expression run away.
	// Each of the 300 items searches a 100,000-character text: cheap to
	// run, dear by CEL's cost, so the cost limit ends it long before any
	// clock could (a clock would make the test depend on the machine's load).
	heavy, _ := workflow.CompileExpr("payload.xs.map(a, payload.s.contains('ab')).size() > 0", workflow.UseWhen)
	xs := `{"s":"` + strings.Repeat("a", 100_000) + `","xs":[` + strings.TrimSuffix(strings.Repeat("1,", 300), ",") + `]}`
	if _, err := heavy.Bool(workflow.Vars{Payload: []byte(xs)}); err == nil || !strings.Contains(err.Error(), "cost") {
		t.Fatalf("an expression past its cost limit: %v", err)
	}
}

// TestJoinOfAnyN: needs {any: N, of: [...]} makes an N-of-M join: a
// graph whose join row needs every branch and says N in its spec.
func TestJoinOfAnyN(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: quorum
    steps:
      - {action: a, agent: x, when: "payload.go"}
      - {action: b, agent: x, needs: []}
      - {action: c, agent: x, needs: []}
      - {action: j, agent: x, needs: {any: 2, of: [a, b, c]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("quorum")
	rows := wf.Rows()
	if !wf.Graph || wf.Steps[3].Any != 2 || !slices.Equal(rows[3].Needs, []int{1, 2, 3}) {
		t.Fatalf("graph %v, the join %+v (row needs %v)", wf.Graph, wf.Steps[3], rows[3].Needs)
	}
	if got := string(rows[3].Spec()); got != `{"needs_any":2}` {
		t.Fatalf("the join's spec %s", got)
	}
	if got := string(rows[1].Spec()); got != "" {
		t.Fatalf("a branch's spec %s, want none", got)
	}
}

// TestSubProcesses: a workflow step names its child workflow, takes its
// name from its id (or the workflow), makes its workflow a graph and gets
// a compensation that undoes the child, sas's own; both rows keep the
// child's workflow in their spec.
func TestSubProcesses(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(`
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk}
      - id: kyc
        workflow: kyc_check
        input: '{"person": payload.applicant}'
  - name: kyc_check
    steps:
      - {action: check_id, agent: kyc}
`))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("loan")
	rows := wf.Rows()
	if !wf.Graph || len(rows) != 3 || rows[1].Name != "kyc" || !rows[1].InSystem() || rows[2].Compensates != 2 || rows[2].Name != "undo_kyc" ||
		!rows[2].InSystem() || !r.HasSystemSteps() || slices.Contains(r.Agents(), "") {
		t.Fatalf("graph %v, rows %+v, agents %v", wf.Graph, rows, r.Agents())
	}
	if a, c := string(rows[1].Spec()), string(rows[2].Spec()); !strings.Contains(a, `"workflow":"kyc_check"`) || c != `{"workflow":"kyc_check"}` {
		t.Fatalf("specs %s and %s", a, c)
	}
}

// TestSubProcessMistakes: a child workflow that is not in the file, a
// cycle (direct or through others), children nested too deep, and keys a
// sub-process cannot have are each refused at their line.
func TestSubProcessMistakes(t *testing.T) {
	t.Parallel()
	chain := "workflows:\n"
	for i := range 7 {
		chain += fmt.Sprintf("  - name: w%d\n    steps:\n      - {workflow: w%d}\n", i, i+1)
	}
	chain += "  - name: w7\n    steps:\n      - {action: a, agent: x}\n"
	for _, tc := range []struct{ desc, file, want string }{
		{"unknown", "workflows:\n  - name: a\n    steps:\n      - {workflow: nope}\n", `workflow "nope" is not in the file`},
		{"itself", "workflows:\n  - name: a\n    steps:\n      - {workflow: a}\n", "a cycle of sub-processes"},
		{"cycle", "workflows:\n  - name: a\n    steps:\n      - {workflow: b}\n  - name: b\n    steps:\n      - {id: x, workflow: c}\n  - name: c\n    steps:\n      - {workflow: a}\n",
			"a cycle of sub-processes"},
		{"too deep", chain, "nests children 6 deep"},
		{"with an agent", "workflows:\n  - name: a\n    steps:\n      - {workflow: b, agent: x}\n  - name: b\n    steps:\n      - {action: a, agent: x}\n", "calls no agent"},
		{"with a compensation", "workflows:\n  - name: a\n    steps:\n      - {workflow: b, compensation: {action: u, agent: x}}\n  - name: b\n    steps:\n      - {action: a, agent: x}\n",
			"undone by its child's own compensations"},
		{"for each", "workflows:\n  - name: a\n    steps:\n      - {workflow: b, for_each: 'payload.xs', max_items: 3}\n  - name: b\n    steps:\n      - {action: a, agent: x}\n",
			"cannot have for_each"},
	} {
		_, err := workflow.Parse("w.yaml", []byte(tc.file))
		ps, ok := workflow.AsProblems(err)
		if !ok || !strings.Contains(ps.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.desc, err, tc.want)
		}
	}
}
