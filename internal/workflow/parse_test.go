package workflow_test

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

func TestShippedExampleIsTheBuiltinFile(t *testing.T) {
	t.Parallel()
	shipped, err := os.ReadFile("../../deploy/workflows.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, workflow.BuiltinYAML()) {
		t.Fatal("deploy/workflows.yaml differs from internal/workflow/builtin.yaml: copy one onto the other")
	}
	r, err := workflow.Load("../../deploy/workflows.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(r.Names(), ","); got != "order,order_approval,order_hold,single" {
		t.Fatalf("workflows %s", got)
	}
}

const fourSteps = `
workflows:
  - name: onboard
    policy: hold
    payload_schema:
      type: object
      required: [tenant]
      properties:
        tenant: {type: string, minLength: 1}
    steps:
      - action: create_account
        agent: accounts
        timeout: 2s
        max_failures: 3
        backoff: {base: 100ms, max: 1s}
        compensation: {action: delete_account, timeout: 5s}
      - action: provision
        agent: infra
      - action: notify
        agent: mail
        compensation:
          action: retract
          agent: mail2
`

func TestParseReadsEveryField(t *testing.T) {
	t.Parallel()
	r, err := workflow.Parse("f.yaml", []byte(fourSteps))
	if err != nil {
		t.Fatal(err)
	}
	wf, ok := r.Lookup("onboard")
	if !ok || wf.Policy != workflow.Hold || len(wf.Steps) != 3 || !wf.HasSchema() {
		t.Fatalf("%+v", wf)
	}
	s := wf.Steps[0]
	if s.Name != "create_account" || s.Agent != "accounts" || s.Timeout != 2*time.Second || s.MaxFailures != 3 ||
		s.BackoffBase != 100*time.Millisecond || s.BackoffMax != time.Second {
		t.Fatalf("step 1: %+v", s)
	}
	// A compensation takes its step's values unless it gives its own.
	c := s.Compensation
	if c == nil || c.Name != "delete_account" || c.Agent != "accounts" || c.Timeout != 5*time.Second || c.MaxFailures != 3 || c.BackoffBase != 100*time.Millisecond {
		t.Fatalf("compensation: %+v", c)
	}
	if d := wf.Steps[1]; d.Timeout != workflow.DefaultTimeout || d.MaxFailures != workflow.DefaultMaxFailures || d.Compensation != nil {
		t.Fatalf("defaults: %+v", d)
	}
	if got := strings.Join(r.Agents(), ","); got != "accounts,infra,mail,mail2" {
		t.Fatalf("agents %s", got)
	}
	if err := wf.CheckPayload([]byte(`{"tenant":"acme"}`)); err != nil {
		t.Fatal(err)
	}
	var pe *workflow.PayloadError
	if err := wf.CheckPayload([]byte(`{"tenant":""}`)); !errors.As(err, &pe) || pe.Pointer != "/tenant" {
		t.Fatalf("short tenant: %v", err)
	}
	if err := wf.CheckPayload([]byte(`{}`)); !errors.As(err, &pe) || pe.Pointer != "" || !strings.Contains(pe.Detail, "tenant") {
		t.Fatalf("missing tenant: %v", err)
	}
}

func TestVersionFollowsWhatRunsNotTheLayout(t *testing.T) {
	t.Parallel()
	a, _ := workflow.Parse("a", []byte(fourSteps))
	relaid := strings.ReplaceAll(fourSteps, "    policy: hold\n", "    # held for an operator\n    policy: hold\n")
	b, _ := workflow.Parse("b", []byte(relaid))
	changed, _ := workflow.Parse("c", []byte(strings.Replace(fourSteps, "timeout: 2s", "timeout: 3s", 1)))
	va, _ := a.Lookup("onboard")
	vb, _ := b.Lookup("onboard")
	vc, _ := changed.Lookup("onboard")
	if va.Version() != vb.Version() || len(va.Version()) != 16 {
		t.Fatalf("a comment changed the version: %s %s", va.Version(), vb.Version())
	}
	if va.Version() == vc.Version() {
		t.Fatal("a new timeout kept the version")
	}
}

func TestInvalidFilesAreRejectedAtTheirLines(t *testing.T) {
	t.Parallel()
	const head = "workflows:\n  - name: w\n    steps:\n"
	for _, tc := range []struct {
		desc, file string
		line       int
		want       string
	}{
		{"unknown policy", "workflows:\n  - name: w\n    policy: retry\n    steps:\n      - {action: a, agent: x}\n", 3, "write compensate"},
		{"duplicate step", head + "      - {action: a, agent: x}\n      - action: a\n        agent: y\n", 5, `step "a" appears twice`},
		{"compensation of a compensation", head + "      - action: a\n        agent: x\n        compensation:\n          action: b\n          compensation: {action: c}\n", 8, "cannot have a compensation"},
		{"bad duration", head + "      - action: a\n        agent: x\n        timeout: ten seconds\n", 6, "such as 500ms"},
		{"unknown field", head + "      - action: a\n        agent: x\n        timout: 5s\n", 6, `did you mean "timeout"`},
		{"yaml syntax", head + "      - action: a\n        agent: x: y\n", 5, "fix the YAML syntax"},
		{"duplicate workflow", head + "      - {action: a, agent: x}\n  - name: w\n    steps:\n      - {action: a, agent: x}\n", 5, "defined twice"},
		{"no agent", head + "      - action: a\n", 4, `no "agent"`},
		{"bad threshold", head + "      - {action: a, agent: x, max_failures: 0}\n", 4, "max_failures"},
		{"bad schema", "workflows:\n  - name: w\n    payload_schema: {type: 12}\n    steps:\n      - {action: a, agent: x}\n", 3, "not a valid JSON Schema"},
		{"bad name", "workflows:\n  - name: Big Name\n    steps:\n      - {action: a, agent: x}\n", 2, "not a name"},
		{"max_duration below timeout", head + "      - action: a\n        agent: x\n        timeout: 30s\n        max_duration: 10s\n", 7, "below the timeout"},
		{"max_duration of a wait", head + "      - id: w\n        wait: {signal: s, timeout: 1h}\n        max_duration: 2h\n", 4, "remove for_each, input and max_duration"},
		{"empty", "", 0, "empty"},
	} {
		refused(t, tc.desc, tc.file, tc.line, tc.want)
	}
}

// refused checks that Parse refuses file, its first problem at line
// with want in its words, named by the file's name.
func refused(t *testing.T, desc, file string, line int, want string) {
	t.Helper()
	_, err := workflow.Parse("w.yaml", []byte(file))
	ps, ok := workflow.AsProblems(err)
	if !ok || len(ps) == 0 {
		t.Errorf("%s: accepted (%v)", desc, err)
		return
	}
	if ps[0].Line != line || !strings.Contains(ps[0].Msg, want) {
		t.Errorf("%s: got %q, want line %d with %q", desc, ps.Error(), line, want)
	}
	if line > 0 && !strings.HasPrefix(ps[0].String(), "w.yaml:") {
		t.Errorf("%s: %q does not start with the file name", desc, ps[0])
	}
}

func TestEveryProblemIsListed(t *testing.T) {
	t.Parallel()
	file := "workflows:\n  - name: w\n    policy: nope\n    steps:\n      - {action: a, agent: x, timeout: 0s}\n      - {action: b, agent: x, colour: red}\n"
	_, err := workflow.Parse("w.yaml", []byte(file))
	ps, _ := workflow.AsProblems(err)
	if len(ps) != 3 || ps[0].Line != 3 || ps[1].Line != 5 || ps[2].Line != 6 {
		t.Fatalf("problems:\n%v", err)
	}
}

// A workflow may list the namespaces whose orders may run it: to any
// other it does not exist, and what starts its orders (a schedule, an
// inbound route, a parent) must be of one of them.
func TestWorkflowsRunInTheirNamespaces(t *testing.T) {
	t.Parallel()
	const file = `
workflows:
  - name: open
    steps:
      - {action: a, agent: x}
  - name: team-a-only
    namespaces: [team-a, team-b]
    steps:
      - {action: a, agent: x}
  - name: parent
    namespaces: [team-a]
    steps:
      - {id: child, workflow: team-a-only}
`
	r, err := workflow.Parse("ns.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	wf, _ := r.Lookup("team-a-only")
	open, _ := r.Lookup("open")
	if !wf.In("team-a") || !wf.In("team-b") || wf.In("default") || wf.In("") || wf.In("team-c") || !open.In("team-c") || !open.In("") {
		t.Fatalf("In: %v", wf.Namespaces)
	}
	if got := strings.Join(r.NamesIn("team-c"), ","); got != "open" {
		t.Fatalf("team-c's workflows: %s", got)
	}
	if got := strings.Join(r.NamesIn("team-a"), ","); got != "open,parent,team-a-only" {
		t.Fatalf("team-a's workflows: %s", got)
	}
	const head = "workflows:\n  - name: w\n"
	for _, tc := range []struct {
		desc, file string
		line       int
		want       string
	}{
		{"a bad name", head + "    namespaces: [Team_A]\n    steps:\n      - {action: a, agent: x}\n", 3, "namespaces:"},
		{"an empty list", head + "    namespaces: []\n    steps:\n      - {action: a, agent: x}\n", 3, "list of 1 to"},
		{"a name twice", head + "    namespaces: [a, a]\n    steps:\n      - {action: a, agent: x}\n", 3, "listed twice"},
		{"a schedule of another namespace", head + "    namespaces: [team-a]\n    steps:\n      - {action: a, agent: x}\n" +
			"schedules:\n  - {name: s, cron: '@hourly', workflow: w, namespace: team-b}\n", 7, "does not run in namespace team-b"},
		{"a schedule of the default namespace", head + "    namespaces: [team-a]\n    steps:\n      - {action: a, agent: x}\n" +
			"schedules:\n  - {name: s, cron: '@hourly', workflow: w}\n", 7, "does not run in namespace default"},
		{"an inbound route of another namespace", head + "    namespaces: [team-a]\n    steps:\n      - {action: a, agent: x}\n" +
			"    inbound:\n      - {name: r, namespace: team-b, secret_env: S, start: {key: payload.id, payload: payload}}\n", 7, "where workflow \"w\" does not run"},
		{"a child of fewer namespaces than its parent", head + "    namespaces: [team-a, team-b]\n    steps:\n      - {id: c, workflow: child}\n" +
			"  - name: child\n    namespaces: [team-a]\n    steps:\n      - {action: a, agent: x}\n", 5, "add team-b to \"child\"'s namespaces"},
		{"a child of some namespaces, a parent of every one", head + "    steps:\n      - {id: c, workflow: child}\n" +
			"  - name: child\n    namespaces: [team-a]\n    steps:\n      - {action: a, agent: x}\n", 4, "runs in every namespace"},
	} {
		refused(t, tc.desc, tc.file, tc.line, tc.want)
	}
}
