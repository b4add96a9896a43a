package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
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
	out, err := runInDir(t.Context(), dir, env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runInDir runs name with args in dir of the repository, with env added;
// its error carries the command's output.
func runInDir(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	abs, err := filepath.Abs(filepath.Join("..", dir))
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = abs
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s %v in %s: %w\n%s", name, args, dir, err, out)
	}
	return string(out), nil
}

// typeScriptDir is the TypeScript client's folder in the repository.
const typeScriptDir = "clients/typescript"

// buildTypeScript installs the TypeScript client's tools when any is
// missing and builds it, once for the whole test binary: the tests that
// use it run in parallel, and two builds (or a build beside an install)
// in one folder trip over each other's files.
var buildTypeScript = sync.OnceValue(func() error {
	for _, tool := range []string{"openapi-typescript", "tsc"} {
		if _, err := os.Stat(filepath.Join("..", typeScriptDir, "node_modules", ".bin", tool)); err != nil {
			if _, err := runInDir(context.Background(), typeScriptDir, nil, "npm", "ci", "--no-audit", "--no-fund"); err != nil {
				return err
			}
			break
		}
	}
	_, err := runInDir(context.Background(), typeScriptDir, nil, "npm", "run", "build")
	return err
})

// typeScriptClient builds the TypeScript client (once) and returns its
// folder, failing the test if it cannot be built.
func typeScriptClient(t *testing.T) string {
	t.Helper()
	if err := buildTypeScript(); err != nil {
		t.Fatal(err)
	}
	return typeScriptDir
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
	dir := typeScriptClient(t)
	service, apiURL, token := clientStack(t)
	out := runIn(t, dir, []string{"SAS_API_URL=" + apiURL, "SAS_API_TOKEN=" + token, "SAS_TEST_SERVICE_ADDR=" + service},
		"node", "--test", "dist/test/")
	t.Logf("%s", out)
}
