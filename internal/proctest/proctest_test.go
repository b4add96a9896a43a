package proctest_test

import (
	"bytes"
	"context"
	"encoding/xml"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/proctest"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// open reads a cases file and its workflows and makes their schema.
func open(t *testing.T, cases string) (*proctest.Suite, *workflow.Registry, *proctest.Env) {
	t.Helper()
	testenv.Reachable(t)
	s, err := proctest.Load(cases, "")
	if err != nil {
		t.Fatal(err)
	}
	reg, err := workflow.Load(s.Workflows)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(reg); err != nil {
		t.Fatal(err)
	}
	env, err := proctest.Open(ctxFor(t), statestore.Options{URL: testenv.DatabaseURL()}, reg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	return s, reg, env
}

func runAll(t *testing.T, s *proctest.Suite, env *proctest.Env) []proctest.Result {
	t.Helper()
	var results []proctest.Result
	for _, c := range s.Cases {
		o := env.Run(ctxFor(t), c)
		r := proctest.Result{Suite: s.Path, Case: c, Outcome: o, Diffs: proctest.Diff(c, o)}
		if !r.Passed() {
			var b bytes.Buffer
			proctest.Print(&b, r, true)
			t.Errorf("case %q failed:\n%s", c.Name, b.String())
		}
		results = append(results, r)
	}
	return results
}

// TestTheProjectsOwnCasesPass: the loan example's cases and the demo
// workflows' run through the real state machine and get what they
// expect (a payout refused after the cooling-off undoes, among the rest,
// the identity check's completed sub-process: before migration 0051 the
// door refused that undo, and the order never ended).
func TestTheProjectsOwnCasesPass(t *testing.T) {
	for _, file := range []string{"../../examples/loan/loan.cases.yaml", "../../deploy/workflows.cases.yaml"} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			s, reg, env := open(t, file)
			if file == "../../examples/loan/loan.cases.yaml" && len(s.Cases) < 12 {
				t.Fatalf("the loan example has %d cases, want at least 12", len(s.Cases))
			}
			results := runAll(t, s, env)
			items := proctest.Coverage(reg, results)
			if len(items) == 0 {
				t.Fatal("no coverage items")
			}
			var b bytes.Buffer
			proctest.PrintCoverage(&b, items)
			if !strings.Contains(b.String(), "coverage of workflow ") {
				t.Fatalf("coverage output:\n%s", b.String())
			}
		})
	}
}

// TestTimeIsVirtual: a 14-day timer and a 72-hour wait take the virtual
// time they say, exactly, and little time on the wall clock.
func TestTimeIsVirtual(t *testing.T) {
	s, _, env := open(t, "../../examples/loan/loan.cases.yaml")
	byName := cases(s)
	start := time.Now()
	o := env.Run(ctxFor(t), byName["a payout that fails after the cooling-off undoes everything before"])
	if o.Err != nil {
		t.Fatal(o.Err)
	}
	// The contract's callback an hour after its 202, then 14 days.
	if want := time.Hour + 14*24*time.Hour; o.Took != want {
		t.Fatalf("the order took %s of virtual time, want %s:\n%s", o.Took, want, strings.Join(o.Trace, "\n"))
	}
	o = env.Run(ctxFor(t), byName["an approval that never comes times out after 72 hours"])
	if o.Took != 72*time.Hour || o.Status != statestore.OrderFailed {
		t.Fatalf("the wait's timeout: order %s after %s", o.Status, o.Took)
	}
	if wall := time.Since(start); wall > 30*time.Second {
		t.Fatalf("17 days of virtual time took %s on the wall clock", wall)
	}
}

func cases(s *proctest.Suite) map[string]proctest.Case {
	m := map[string]proctest.Case{}
	for _, c := range s.Cases {
		m[c.Name] = c
	}
	return m
}

// TestAWrongExpectationFailsWithADiff: a case that expects what does not
// happen fails, and says what it wanted and what it got, with the
// order's path; its JUnit XML names the failure.
func TestAWrongExpectationFailsWithADiff(t *testing.T) {
	_, reg, env := open(t, "../../examples/loan/loan.cases.yaml")
	s, err := proctest.Parse("wrong.cases.yaml", []byte(`
cases:
  - name: a refused credit check expected to complete
    workflow: loan
    payload: {applicant: zed, amount: 500, parties: [zed]}
    services:
      credit_check: {refuse: score too low}
    expect:
      status: completed
      compensated: [hold_funds, kyc]
      results: {hold_funds: {held: true}}
`), "../../examples/loan/loan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(reg); err != nil {
		t.Fatal(err)
	}
	o := env.Run(ctxFor(t), s.Cases[0])
	diffs := proctest.Diff(s.Cases[0], o)
	text := strings.Join(diffs, "\n")
	for _, want := range []string{
		"status:\n    want completed\n    got  failed",
		"compensated (in order):\n    want [hold_funds, kyc]\n    got  [kyc, hold_funds]",
		"results.hold_funds:\n    want {\"held\":true}\n    got  {}",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the diff lacks %q:\n%s", want, text)
		}
	}
	r := proctest.Result{Suite: s.Path, Case: s.Cases[0], Outcome: o, Diffs: diffs}
	var b bytes.Buffer
	proctest.Print(&b, r, false)
	for _, want := range []string{"--- FAIL: a refused credit check expected to complete", "loan.credit_check: error", "credit_check answered 422: score too low"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := proctest.JUnit(&b, []proctest.Result{r}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string `xml:"name,attr"`
				Failure *struct {
					Message string `xml:"message,attr"`
				} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("the JUnit XML does not parse: %v\n%s", err, b.String())
	}
	if len(doc.Suites) != 1 || doc.Suites[0].Tests != 1 || doc.Suites[0].Failures != 1 || doc.Suites[0].Cases[0].Failure == nil ||
		doc.Suites[0].Cases[0].Failure.Message != "status:" {
		t.Fatalf("JUnit: %+v\n%s", doc, b.String())
	}
}

// TestCasesFilesAreCheckedWithTheirLines: a mistake in a cases file is
// reported at its line, and a case naming what the workflows lack is
// refused before anything runs.
func TestCasesFilesAreCheckedWithTheirLines(t *testing.T) {
	reg, err := workflow.Load("../../examples/loan/loan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ text, want string }{
		{"cases:\n  - name: a\n    workflow: loan\n    expct: {}\n", "x.yaml: line 4: unknown field \"expct\" in a case"},
		{"cases:\n  - name: a\n    workflow: loan\n    services:\n      hold_funds: {refuse: no, silent: true}\n", "x.yaml:5: service \"hold_funds\": an answer is one of"},
		{"cases:\n  - name: a\n    workflow: loan\n    expect: {status: done}\n", "expect.status \"done\" is not one of"},
		{"cases:\n  - name: a\n    workflow: loan\n    signals: [{at: soon, name: approved}]\n", "signal \"approved\": at:"},
		{"cases:\n  - name: a\n    workflow: loan\n  - name: a\n    workflow: loan\n", "case \"a\" is named twice (first at line 2)"},
		{"cases: []\n", "no cases"},
	} {
		_, err := proctest.Parse("x.yaml", []byte(tc.text), "loan.yaml")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.text, err, tc.want)
		}
	}
	for _, tc := range []struct{ text, want string }{
		{"cases:\n  - name: a\n    workflow: lone\n", "x.yaml:2: case \"a\": workflow \"lone\" is not in loan.yaml"},
		{"cases:\n  - name: a\n    workflow: loan\n    services: {pay: {}}\n", "service \"pay\" answers no action of workflow loan"},
		{"cases:\n  - name: a\n    workflow: loan\n    signals: [{name: aproved}]\n", "signal \"aproved\" is waited for by no step"},
		{"cases:\n  - name: a\n    workflow: loan\n    expect: {ran: [disburse, payout]}\n", "expect names step \"payout\""},
	} {
		s, err := proctest.Parse("x.yaml", []byte(tc.text), "loan.yaml")
		if err != nil {
			t.Fatalf("%q: %v", tc.text, err)
		}
		if err := s.Check(reg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.text, err, tc.want)
		}
	}
}
