package workflow_test

import (
	"testing"
	"time"

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

func TestNewRegistryRejectsBadDefinitions(t *testing.T) {
	t.Parallel()
	ok := workflow.Step{Name: "a", Agent: "x", Timeout: time.Second, MaxFailures: 1}
	for _, tc := range []struct {
		desc string
		wfs  []workflow.Workflow
	}{
		{"no steps", []workflow.Workflow{{Name: "w"}}},
		{"no name", []workflow.Workflow{{Steps: []workflow.Step{ok}}}},
		{"twice", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{ok}}, {Name: "w", Steps: []workflow.Step{ok}}}},
		{"zero timeout", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{{Name: "a", Agent: "x", MaxFailures: 1}}}}},
		{"zero threshold", []workflow.Workflow{{Name: "w", Steps: []workflow.Step{{Name: "a", Agent: "x", Timeout: time.Second}}}}},
	} {
		if _, err := workflow.NewRegistry(tc.wfs...); err == nil {
			t.Errorf("%s: accepted", tc.desc)
		}
	}
}
