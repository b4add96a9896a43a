package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// clientsFile is the workflows file the clients' tests run against: an
// order that is done at once (shop), one that waits for an approval after
// a second (approval: a follower is there before the wait begins), and
// one whose service answers 202 Accepted and calls back (export).
const clientsFile = `
workflows:
  - name: shop
    payload_schema: {type: object, required: [customer], properties: {customer: {type: string}, amount: {type: number}}}
    search_attributes:
      - {name: customer, type: string, expr: payload.customer}
    steps:
      - {action: charge, agent: jobs, timeout: 20s}
  - name: approval
    steps:
      - {action: score, agent: jobs, timeout: 20s}
      - {action: cooling_off, delay: 1s, needs: [score]}
      - {id: approved, wait: {signal: approved, timeout: 5m, schema: {type: object, required: [by]}}, needs: [cooling_off]}
  - name: export
    steps:
      - {action: build_export, agent: jobs, timeout: 30s, max_duration: 5m}
`

// TestPythonClientAgainstARealStack: the Python client
// (clients/python, standard library only) submits, awaits, follows each
// step, signals, lists, and ends a 202 service's step by its token,
// against a real stack whose service is the Python test's own.
func TestPythonClientAgainstARealStack(t *testing.T) {
	t.Parallel()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed (Debian's python3): %v", err)
	}
	service := freeAddr(t)
	g := runFile(t, "clients.yaml", clientsFile, pipelineOpts{schedulers: 1, agents: 1, supervisors: 1,
		agentEnv: []string{"SAS_REMOTE_URL=http://" + service}, submitterEnv: []string{"SAS_STEP_TIMEOUT=0s"}})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	ops := apiToken(t, g.stack, "py", "operator")
	dir, err := filepath.Abs("../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), python, "-m", "unittest", "-v", "tests.test_client")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SAS_API_URL="+api.url, "SAS_API_TOKEN="+ops, "SAS_TEST_SERVICE_ADDR="+service,
		"PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Python client's tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
