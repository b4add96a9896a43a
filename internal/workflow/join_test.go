package workflow_test

import (
	"encoding/json"
	"testing"

	"sas/internal/workflow"
)

// TestJoinRules: what a join says of a step's needs, the one answer every
// reader (the check, sasctl, the console, the checker) uses.
func TestJoinRules(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		join            workflow.Join
		needs           int
		quorum          string
		required, spare int
		spec            string
	}{
		{join: workflow.Join{}, needs: 0, quorum: "", required: 0, spare: 0, spec: `{}`},
		{join: workflow.Join{}, needs: 3, quorum: "", required: 3, spare: 0, spec: `{}`},
		{join: workflow.Join{Any: 2}, needs: 3, quorum: "any 2", required: 2, spare: 1, spec: `{"needs_any":2}`},
		{join: workflow.Join{Any: 1}, needs: 4, quorum: "any 1", required: 1, spare: 3, spec: `{"needs_any":1}`},
		// Any no fewer than the needs (the check refuses it in a file)
		// waits for every one and spares none.
		{join: workflow.Join{Any: 5}, needs: 3, quorum: "any 5", required: 3, spare: 0, spec: `{"needs_any":5}`},
	} {
		if got := c.join.Quorum(); got != c.quorum {
			t.Errorf("%+v Quorum = %q, want %q", c.join, got, c.quorum)
		}
		if got := c.join.Required(c.needs); got != c.required {
			t.Errorf("%+v Required(%d) = %d, want %d", c.join, c.needs, got, c.required)
		}
		if got := c.join.Spare(c.needs); got != c.spare {
			t.Errorf("%+v Spare(%d) = %d, want %d", c.join, c.needs, got, c.spare)
		}
		// Its keys are a step spec's as they always were: rows written
		// before the rule had a type read the same.
		b, err := json.Marshal(workflow.StepSpec{Join: c.join})
		if err != nil || string(b) != c.spec {
			t.Errorf("%+v in a spec = %s (%v), want %s", c.join, b, err, c.spec)
		}
		var back workflow.StepSpec
		if err := json.Unmarshal([]byte(c.spec), &back); err != nil || back.Join != c.join {
			t.Errorf("spec %s read back as %+v (%v), want %+v", c.spec, back.Join, err, c.join)
		}
	}
}
