package contract_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayersStayApart keeps the services' packages from importing each
// other or the demo service: the scheduler knows agents only by their
// queues, an agent knows the remote service only by this contract.
func TestLayersStayApart(t *testing.T) {
	t.Parallel()
	for pkg, banned := range map[string][]string{
		"sas/internal/scheduler":  {"sas/internal/agent", "sas/internal/remote", "sas/internal/submitter", "sas/internal/supervisor"},
		"sas/internal/agent":      {"sas/internal/remote", "sas/internal/scheduler", "sas/internal/submitter", "sas/internal/supervisor"},
		"sas/internal/submitter":  {"sas/internal/agent", "sas/internal/remote", "sas/internal/scheduler", "sas/internal/supervisor"},
		"sas/internal/supervisor": {"sas/internal/agent", "sas/internal/remote", "sas/internal/scheduler", "sas/internal/submitter"},
		"sas/internal/contract":   {"sas/internal/remote", "sas/internal/agent"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 2 {
			t.Fatalf("go list -deps %s listed %v", pkg, deps)
		}
		for _, d := range deps {
			for _, b := range banned {
				if d == b {
					t.Errorf("%s depends on %s", pkg, b)
				}
			}
		}
	}
}
