package e2e

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// TestAProcessOfPythonServicesEndToEnd: a team's process over its own
// services written in Python with the standard library
// (e2e/testdata/services.py): one answers at once, the other answers 202
// Accepted and finishes later by calling the API back over HTTP with the
// step's token, the requests curl would send. The order is submitted and
// its end awaited with the Python client, awaited again with the
// TypeScript client (node), and told to a signed webhook whose receiver
// checks the signature.
func TestAProcessOfPythonServicesEndToEnd(t *testing.T) {
	t.Parallel()
	ts := typeScriptClient(t)

	const secret = "whsec-py-8c1f2e3d4b5a6978"
	rv := &webhookReceiver{secret: secret, tries: map[string]int{}, got: map[string]map[string]any{}}
	hook := newServer(t, rv)
	services, apiAddr := freeAddr(t), freeAddr(t)
	file := `
workflows:
  - name: export
    webhooks:
      - {url: "` + hook + `/sas", secret_env: EXPORT_HOOK_SECRET, events: [completed]}
    payload_schema: {type: object, required: [customer]}
    steps:
      - {action: check, agent: team, timeout: 20s}
      - {action: export, agent: team, timeout: 20s, max_duration: 2m}
`
	g := runFile(t, "export.yaml", file, pipelineOpts{schedulers: 1, agents: 1, supervisors: 1,
		agentEnv:      []string{"SAS_REMOTE_URL=http://" + services},
		submitterEnv:  []string{"SAS_STEP_TIMEOUT=0s"},
		supervisorEnv: []string{"EXPORT_HOOK_SECRET=" + secret, "SAS_SUPERVISOR_WEBHOOK_POLL=100ms", "SAS_SUPERVISOR_WEBHOOK_BACKOFF=100ms"}})
	api := startAPI(t, g.stack, apiAddr, "SAS_WORKFLOWS_FILE="+g.file)
	token := apiToken(t, g.stack, "team", "operator")

	py := exec.Command("python3", "testdata/services.py", services)
	py.Env = append(os.Environ(), "SAS_API_URL="+api.url, "PYTHONDONTWRITEBYTECODE=1")
	logFile, err := os.Create(filepath.Join(t.TempDir(), "services.log"))
	if err != nil {
		t.Fatal(err)
	}
	py.Stdout, py.Stderr = logFile, logFile
	if err := py.Start(); err != nil {
		t.Fatal(err)
	}
	// Stopped by SIGINT, or killed if it does not stop (a process started
	// in the background by a shell without job control ignores SIGINT).
	exited := make(chan struct{})
	go func() {
		_ = py.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = py.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = py.Process.Kill()
			<-exited
		}
		logFile.Close()
	})

	clientPath, err := filepath.Abs("../clients/python")
	if err != nil {
		t.Fatal(err)
	}
	pyEnv := []string{"PYTHONPATH=" + clientPath, "SAS_API_URL=" + api.url, "SAS_API_TOKEN=" + token, "PYTHONDONTWRITEBYTECODE=1"}
	out := runIn(t, "e2e", pyEnv, "python3", "-c", `
import os
from sas_client import Client
sas = Client(os.environ["SAS_API_URL"], token=os.environ["SAS_API_TOKEN"])
order = sas.submit("export", {"customer": "acme"})
event, ended = sas.await_end(order["order_id"], timeout="60s")
print(order["order_id"], event["status"], ended, event["results"]["export"]["file"].startswith("s3://exports/"))
`)
	fields := strings.Fields(out)
	if len(fields) != 4 || fields[1] != "completed" || fields[2] != "True" || fields[3] != "True" {
		t.Fatalf("through the Python client: %s\nthe services' log:\n%s", out, readFile(logFile.Name()))
	}
	id := fields[0]

	dist, err := filepath.Abs("../" + ts + "/dist/src/index.js")
	if err != nil {
		t.Fatal(err)
	}
	out = runIn(t, "e2e", []string{"SAS_API_URL=" + api.url, "SAS_API_TOKEN=" + token, "ORDER_ID=" + id}, "node", "--input-type=module", "-e", `
const { Client } = await import(`+"`file://${process.argv[1]}`"+`);
const sas = new Client(process.env.SAS_API_URL, process.env.SAS_API_TOKEN);
const { event, ended } = await sas.awaitEnd(process.env.ORDER_ID, "30s");
console.log(event.status, ended);
`, dist)
	if strings.TrimSpace(out) != "completed true" {
		t.Fatalf("through the TypeScript client: %s", out)
	}

	testenv.Eventually(t, time.Minute, "the signed webhook to be told", func() bool {
		got, _ := rv.taken()
		for _, env := range got {
			if env["order_id"] == id && env["type"] == "order.completed" {
				return true
			}
		}
		return false
	})
	rv.mu.Lock()
	bad := len(rv.bad)
	rv.mu.Unlock()
	if bad != 0 {
		t.Fatalf("%d deliveries with a bad signature", bad)
	}
}

// newServer serves h on a test server and returns its URL.
func newServer(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

func readFile(name string) string {
	b, _ := os.ReadFile(name)
	return string(b)
}
