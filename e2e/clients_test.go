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

// clientStack starts a stack of clientsFile whose remote service is at
// the address it returns (the clients' tests serve it), with the API, and
// returns the API's URL and an operator token.
func clientStack(t *testing.T) (service, apiURL, token string) {
	t.Helper()
	service = freeAddr(t)
	g := runFile(t, "clients.yaml", clientsFile, pipelineOpts{schedulers: 1, agents: 1, supervisors: 1,
		agentEnv: []string{"SAS_REMOTE_URL=http://" + service}, submitterEnv: []string{"SAS_STEP_TIMEOUT=0s"}})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	return service, api.url, apiToken(t, g.stack, "client", "operator")
}

// runIn runs name with args in dir of the repository, with env added,
// and fails the test with its output if it fails.
func runIn(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("..", dir))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Dir = abs
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v in %s: %v\n%s", name, args, dir, err, out)
	}
	return string(out)
}

// TestPythonClientAgainstARealStack: the Python client
// (clients/python, standard library only) submits, awaits, follows each
// step, signals, lists, and ends a 202 service's step by its token,
// against a real stack whose service is the Python test's own.
func TestPythonClientAgainstARealStack(t *testing.T) {
	t.Parallel()
	service, apiURL, token := clientStack(t)
	out := runIn(t, "clients/python", []string{"SAS_API_URL=" + apiURL, "SAS_API_TOKEN=" + token, "SAS_TEST_SERVICE_ADDR=" + service,
		"PYTHONDONTWRITEBYTECODE=1"}, "python3", "-m", "unittest", "-v", "tests.test_client")
	t.Logf("%s", out)
}

// TestTypeScriptClientAgainstARealStack: the TypeScript client
// (clients/typescript, its types generated from docs/api.openapi.yaml at
// build, so the compiler holds it to the API's description) does the
// same as the Python one, tested with node's test runner.
func TestTypeScriptClientAgainstARealStack(t *testing.T) {
	t.Parallel()
	dir := "clients/typescript"
	if _, err := os.Stat(filepath.Join("..", dir, "node_modules")); err != nil {
		runIn(t, dir, nil, "npm", "ci", "--no-audit", "--no-fund")
	}
	runIn(t, dir, nil, "npm", "run", "build")
	service, apiURL, token := clientStack(t)
	out := runIn(t, dir, []string{"SAS_API_URL=" + apiURL, "SAS_API_TOKEN=" + token, "SAS_TEST_SERVICE_ADDR=" + service},
		"node", "--test", "dist/test/")
	t.Logf("%s", out)
}
