package e2e

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// TestHelmChartPodsRunAsRendered runs what the chart renders, on this
// machine, as Kubernetes would: the migration job's two containers, then
// every Deployment's container as a process, with exactly the rendered
// command and environment and only the Secret keys its pod mounts,
// written as files where the pod would see them (hosts pointed at the
// local PostgreSQL and RabbitMQ through the chart's own values). The
// broker users are made as NOTES.txt says, with the Secret's passwords.
// Every service becomes ready, orders complete, and the console lets
// admin in with the Secret's console-admin.
func TestHelmChartPodsRunAsRendered(t *testing.T) {
	t.Parallel()
	helm := tool(t, "helm")
	rabbitmqctl := tool(t, "rabbitmqctl")
	if !strings.Contains(testenv.AMQPURL(), "127.0.0.1:5672") {
		t.Skip("SAS_TEST_AMQP_URL is not the local broker")
	}
	s := newStack(t)
	db, err := url.Parse(s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	remote := startOn(t, "remote", append(append([]string{}, s.env...), "SAS_REMOTE_FAULTS={}"), "SAS_REMOTE_ADDR")
	userPrefix := "h-" + testenv.RandomSuffix(8) + "-"
	loginSuffix := "_h" + testenv.RandomSuffix(8)
	rcv := newOTLPReceiver(t)
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(fmt.Sprintf(`queuePrefix: %q
logLevel: debug
tracing: {endpoint: %q}
database: {hosts: %q, name: %q, params: %q, ownerUser: postgres, loginSuffix: %q}
broker: {hosts: ["127.0.0.1:5672"], userPrefix: %q}
remote: {url: "http://%s"}
agents:
  - {name: payment, kinds: [payment], replicas: 1}
  - {name: rest, kinds: [inventory, shipping], replicas: 1}
`, s.topo.Prefix, rcv.url, db.Host, strings.TrimPrefix(db.Path, "/"), db.RawQuery, loginSuffix, userPrefix, remote.ops)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(helm, "template", "sas", chartDir, "-f", values, "--kube-version", kubeVersion).Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	objs := decodeAll(t, out)
	secret := map[string]string{}
	for k, v := range find(t, objs, "Secret", "sas-secrets")["data"].(map[string]any) {
		b, err := base64.StdEncoding.DecodeString(v.(string))
		if err != nil {
			t.Fatal(err)
		}
		secret[k] = string(b)
	}
	t.Cleanup(func() {
		for _, r := range []string{"submitter", "scheduler", "supervisor", "operator", "console"} {
			_, _ = s.pool.Exec(t.Context(), `DROP ROLE IF EXISTS sas_`+r+loginSuffix)
		}
	})

	// The broker users, as NOTES.txt says, with the Secret's passwords.
	script, errOut, code := sasctl(t, s.env, "broker", "users", "--user-prefix", userPrefix)
	if code != 0 {
		t.Fatalf("sasctl broker users: %s", errOut)
	}
	cmd := exec.Command("bash", "-e", "-c", script)
	cmd.Env = append([]string{}, os.Environ()...)
	for _, svc := range []string{"submitter", "scheduler", "agent", "sasctl", "app", "api"} {
		cmd.Env = append(cmd.Env, "SAS_AMQP_PASSWORD_"+strings.ToUpper(svc)+"="+secret["amqp-"+svc])
	}
	t.Cleanup(func() {
		for _, svc := range []string{"submitter", "scheduler", "agent", "sasctl", "app", "api"} {
			_ = exec.Command(rabbitmqctl, "delete_user", userPrefix+svc).Run()
		}
	})
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("making the broker users: %v\n%s", err, out)
	}

	// The migration job: its init container, then its container.
	job := find(t, objs, "Job", "sas-migrate")
	podSpec := job["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	files := mountSecret(t, podSpec, secret)
	for _, list := range []string{"initContainers", "containers"} {
		c := podSpec[list].([]any)[0].(map[string]any)
		var args []string
		for _, a := range c["args"].([]any) {
			args = append(args, a.(string))
		}
		if out, errOut, code := sasctl(t, podEnv(c, files, "migrate"), args...); code != 0 {
			t.Fatalf("job container %s (sasctl %v): exit %d: %s %s", c["name"], args, code, out, errOut)
		}
	}

	// Every Deployment, as its pod would run it.
	var console, api *proc
	started := 0
	for _, o := range objs {
		if o["kind"] != "Deployment" {
			continue
		}
		spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		c := spec["containers"].([]any)[0].(map[string]any)
		binary := path.Base(c["command"].([]any)[0].(string))
		env := podEnv(c, mountSecret(t, spec, secret), name(o))
		switch binary {
		case "console":
			env = append(env, "SAS_CONSOLE_ADDR="+freeAddr(t))
		case "api":
			env = append(env, "SAS_API_ADDR="+freeAddr(t))
		}
		p := start(t, binary, env)
		switch binary {
		case "console":
			console = p
		case "api":
			api = p
		}
		started++
	}
	if started != 7 || console == nil || api == nil {
		t.Fatalf("started %d deployments (console %v, api %v), want 7 with the console and the API", started, console != nil, api != nil)
	}

	// Orders through.
	ids := sasctlOK(t, s.env, "submit", "--count", "20", "--workflow", "order", "--print-ids")
	testenv.Eventually(t, 2*time.Minute, "20 orders completed", func() bool {
		return s.count(t, `SELECT count(*) FROM orders WHERE status = 'completed' AND order_id = ANY($1::uuid[])`, strings.Fields(ids)) == 20
	})
	// Traced as the chart's tracing values say: every order's trace has
	// spans of the submitter, the schedulers and the agents.
	testenv.Eventually(t, time.Minute, "the orders' spans from the chart's services", func() bool {
		for _, id := range strings.Fields(ids) {
			tid := s.traceOf(t, id)
			services := map[string]bool{}
			for _, sp := range rcv.trace(tid) {
				services[sp.service] = true
			}
			if tid == "" || !services["sas-submitter"] || !services["sas-scheduler"] || !services["sas-agent"] {
				return false
			}
		}
		return true
	})
	// The API, with its own database login and broker user: a token
	// made as NOTES.txt says reads the orders and awaits one.
	token, errOut, code := sasctl(t, s.env, "api", "token", "create", "--name", "helm", "--role", "viewer")
	if code != 0 {
		t.Fatalf("api token create: %s", errOut)
	}
	ap := apiProc{proc: api}
	for _, kv := range api.cmd.Env {
		if v, ok := strings.CutPrefix(kv, "SAS_API_ADDR="); ok {
			ap.url = "http://" + v
		}
	}
	first := strings.Fields(ids)[0]
	if code, h, b := ap.call(t, apiCall{method: "GET", path: "/api/v1/orders/" + first + "/await?timeout=10s", token: strings.TrimSpace(token)}); code != 200 ||
		h.Get("Sas-Ended") != "true" || !strings.Contains(string(b), `"status":"completed"`) {
		t.Fatalf("the chart's API: %d %s", code, b)
	}
	// The console: admin with the Secret's password.
	var consoleAddr string
	for _, kv := range console.cmd.Env {
		if v, ok := strings.CutPrefix(kv, "SAS_CONSOLE_ADDR="); ok {
			consoleAddr = v
		}
	}
	wc := newWebClient(t, "http://"+consoleAddr)
	if status := wc.login("admin", secret["console-admin"]); status != http.StatusSeeOther {
		t.Fatalf("admin's login with the Secret's console-admin: status %d", status)
	}
}

// mountSecret writes, into a directory of its own, the Secret keys a pod
// spec's secret volume lists (key to path), as Kubernetes mounts them,
// and returns the directory.
func mountSecret(t *testing.T, spec map[string]any, secret map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	vols, _ := spec["volumes"].([]any)
	for _, v := range vols {
		sv, ok := v.(map[string]any)["secret"].(map[string]any)
		if !ok {
			continue
		}
		for _, it := range sv["items"].([]any) {
			it := it.(map[string]any)
			value, ok := secret[it["key"].(string)]
			if !ok {
				t.Fatalf("the pod mounts key %s, which the Secret does not have", it["key"])
			}
			if err := os.WriteFile(filepath.Join(dir, it["path"].(string)), []byte(value), 0o440); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// podEnv is a container's rendered environment for a process: the secrets
// volume's path replaced by where mountSecret wrote it, the pod's name
// for a field reference.
func podEnv(c map[string]any, secrets, pod string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	list, _ := c["env"].([]any)
	for _, e := range list {
		e := e.(map[string]any)
		v, ok := e["value"].(string)
		if !ok {
			v = pod + "-0"
		}
		env = append(env, e["name"].(string)+"="+strings.Replace(v, "/run/secrets/sas", secrets, 1))
	}
	return env
}
