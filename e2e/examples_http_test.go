package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// readmeBlock is the fenced block of README.md (of lang) whose text
// starts with first.
func readmeBlock(t *testing.T, lang, first string) string {
	t.Helper()
	doc, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```"+lang+"\n"+first)
	if !ok {
		t.Fatalf("README.md has no %s block starting %q", lang, first)
	}
	block, _, _ := strings.Cut(rest, "```")
	return first + block
}

// TestHTTPExamplesRun: the README's curl example and the Python example
// (standard library only) submit, approve and await an order of the
// demo's order_approval workflow through the API service, with an
// operator's token as make demo prints one (made as the compose file's
// api-token job makes it), against real binaries; both see it complete.
func TestHTTPExamplesRun(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"curl", "python3", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Unavailable(t, tool, err)
		}
	}
	workflows, err := os.ReadFile("../deploy/workflows.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g := runFile(t, "workflows.yaml", string(workflows), pipelineOpts{schedulers: 1, agents: 1})
	api := startAPI(t, g.stack, "", "SAS_WORKFLOWS_FILE="+g.file)
	// The token as a deployment's one-shot job makes it: into a file,
	// kept when the job runs again.
	tokenFile := filepath.Join(t.TempDir(), "api-token")
	for i, name := range []string{"examples", "examples-again"} {
		_, errOut, code := sasctl(t, g.env, "api", "token", "create", "--name", name, "--role", "operator", "--out", tokenFile)
		if code != 0 || i == 1 && !strings.Contains(errOut, "holds a token already: kept") {
			t.Fatalf("api token create --out (run %d): exit %d: %s", i+1, code, errOut)
		}
	}
	info, err := os.Stat(tokenFile)
	if err != nil || info.Mode().Perm() != 0o640 {
		t.Fatalf("the token file: %v %v, want mode 0640", info, err)
	}
	if out, _, _ := sasctl(t, g.env, "api", "token", "list"); !strings.Contains(out, "examples") || strings.Contains(out, "examples-again") {
		t.Fatalf("tokens after two runs:\n%s", out)
	}
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(b))
	run := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "SAS_API_URL="+api.url, "SAS_API_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		return string(out)
	}

	out := run("bash", "-euo", "pipefail", "-c", readmeBlock(t, "sh", "# Submit, approve and await an order over HTTP.\n"))
	for _, want := range []string{`"outcome":"inserted"`, " 202\n", `"status":"completed"`, `"workflow":"order_approval"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("the README's curl example printed no %q:\n%s", want, out)
		}
	}
	if n := g.count(t, `SELECT count(*) FROM orders o JOIN steps s USING (order_id) WHERE o.workflow = 'order_approval' AND o.status = 'completed'
		AND s.spec ? 'wait' AND s.result->>'by' = 'ann'`); n != 1 {
		t.Fatalf("%d orders approved by ann completed, want 1", n)
	}

	out = run("python3", "../examples/python/approve.py")
	for _, want := range []string{": 202 inserted", "submitted again: 200 duplicate", "approved: 202", "a bad approval is refused: 422 invalid_payload",
		"ended completed", ": 1\n"} {
		if !strings.Contains(out, want) {
			t.Fatalf("the Python example printed no %q:\n%s", want, out)
		}
	}
}
