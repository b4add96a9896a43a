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

// TestServicesDoNotNeedTheLab keeps the lab (internal/harness: chaos,
// fault proxies, bench, test environments) out of every service and of
// what they share: what a production process runs is built without it.
func TestServicesDoNotNeedTheLab(t *testing.T) {
	t.Parallel()
	pkgs := []string{"sas/cmd/agent", "sas/cmd/api", "sas/cmd/console", "sas/cmd/scheduler", "sas/cmd/submitter", "sas/cmd/supervisor",
		"sas/internal/statestore", "sas/internal/broker", "sas/internal/messages", "sas/internal/workflow", "sas/internal/service", "sas/client"}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, pkgs...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < len(pkgs) {
		t.Fatalf("go list -deps listed %v", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "sas/internal/harness") {
			t.Errorf("a service depends on the lab package %s", d)
		}
	}
}
