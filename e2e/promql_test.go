package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sas/internal/harness/testenv"
)

// prometheus is a real Prometheus scraping sas processes, one job per
// service (sas-submitter, sas-scheduler, …, as the deployment names
// them), its targets read from files it watches so that a test can add
// and remove processes while it runs.
type prometheus struct {
	addr string
	dir  string
}

// startPrometheus runs a Prometheus scraping procs twice a second, with the
// alert rules loaded, and returns its address.
func startPrometheus(t *testing.T, procs []*proc) string {
	t.Helper()
	rules, _ := filepath.Abs("../deploy/prometheus/alerts.yml")
	return startPrometheusWith(t, procs, rules).addr
}

// startPrometheusWith is startPrometheus with a rules file of the test's.
func startPrometheusWith(t *testing.T, procs []*proc, rules string) *prometheus {
	t.Helper()
	bin := tool(t, "prometheus")
	pr := &prometheus{dir: t.TempDir()}
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: 500ms\n  scrape_timeout: 500ms\n  evaluation_interval: 500ms\nrule_files: [%q]\nscrape_configs:\n", rules)
	for _, job := range []string{"submitter", "scheduler", "agent", "supervisor", "remote"} {
		fmt.Fprintf(&b, "  - job_name: sas-%s\n    file_sd_configs: [{files: [%q], refresh_interval: 500ms}]\n", job, filepath.Join(pr.dir, job+".json"))
	}
	cfg := filepath.Join(pr.dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	pr.setTargets(t, procs)
	pr.addr = freeAddr(t)
	logFile, err := os.Create(filepath.Join(pr.dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--web.listen-address="+pr.addr, "--storage.tsdb.path="+filepath.Join(pr.dir, "data"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		logFile.Close()
	})
	testenv.Eventually(t, 60*time.Second, "prometheus to be ready", func() bool {
		resp, err := http.Get("http://" + pr.addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return pr
}

// setTargets makes procs, by the service each runs, what Prometheus
// scrapes.
func (pr *prometheus) setTargets(t *testing.T, procs []*proc) {
	t.Helper()
	byJob := map[string][]string{"submitter": {}, "scheduler": {}, "agent": {}, "supervisor": {}, "remote": {}}
	for _, p := range procs {
		byJob[p.name] = append(byJob[p.name], p.ops)
	}
	for job, targets := range byJob {
		body, _ := json.Marshal([]map[string]any{{"targets": targets}})
		tmp := filepath.Join(pr.dir, job+".json.tmp")
		if err := os.WriteFile(tmp, body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(pr.dir, job+".json")); err != nil {
			t.Fatal(err)
		}
	}
}

type promResult struct {
	Status string `json:"status"`
	Error  string `json:"error"`
	Data   struct {
		Result []json.RawMessage `json:"result"`
	} `json:"data"`
}

func promQuery(t *testing.T, addr, expr string) promResult {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r promResult
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("query %s: %v", expr, err)
	}
	return r
}

// dashboard is what the tests read of the Grafana dashboard.
type dashboard struct {
	Panels []struct {
		Title       string `json:"title"`
		Description string `json:"description"`
		Targets     []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name     string `json:"name"`
			AllValue string `json:"allValue"`
		} `json:"list"`
	} `json:"templating"`
}

// readDashboard reads deploy/grafana/dashboards/sas.json.
func readDashboard(t *testing.T) dashboard {
	t.Helper()
	var dash dashboard
	raw, err := os.ReadFile("../deploy/grafana/dashboards/sas.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	return dash
}

// TestDashboardAndAlertQueries runs every expression of the Grafana
// dashboard and of the alert rules against a real Prometheus scraping a
// running stack: none may fail, and the core panels must show data.
func TestDashboardAndAlertQueries(t *testing.T) {
	t.Parallel()
	p := newPipeline(t, pipelineOpts{supervisors: 1, faults: `{"*":{"error_rate":0.1,"latency_max_ms":3}}`})
	procs := append([]*proc{p.remote, p.submitter}, p.schedulers...)
	procs = append(append(procs, p.agents...), p.supervisors...)
	prom := startPrometheus(t, procs)

	dash := readDashboard(t)
	ruleExprs := ruleFields(t, "expr")
	if len(ruleExprs) == 0 || len(dash.Panels) == 0 {
		t.Fatal("no expressions found")
	}

	// Traffic for the panels: orders, retries, a step or two of latency.
	ids := p.submitOrders(t, 200)
	p.waitTerminal(t, ids, 2*time.Minute)

	for _, e := range ruleExprs {
		if r := promQuery(t, prom, e); r.Status != "success" {
			t.Errorf("alert rule expression %s: %s", e, r.Error)
		}
	}
	if len(dash.Templating.List) != 1 || dash.Templating.List[0].Name != "partition" || dash.Templating.List[0].AllValue != ".*" {
		t.Errorf("the dashboard's variables: %+v, want partition, All being .*", dash.Templating.List)
	}
	for _, panel := range dash.Panels {
		core := strings.HasPrefix(panel.Description, "Core:")
		for _, target := range panel.Targets {
			// As Grafana sends it with every partition chosen (All):
			// a deployment of one state store has no partition label,
			// which .* matches.
			target.Expr = strings.ReplaceAll(target.Expr, "$partition", ".*")
			if r := promQuery(t, prom, target.Expr); r.Status != "success" {
				t.Errorf("panel %q: %s: %s", panel.Title, target.Expr, r.Error)
				continue
			}
			if !core {
				continue
			}
			testenv.Eventually(t, 60*time.Second, fmt.Sprintf("panel %q (%s) to show data", panel.Title, target.Expr), func() bool {
				return len(promQuery(t, prom, target.Expr).Data.Result) > 0
			})
		}
	}
	// The rules are loaded and evaluate cleanly.
	resp, err := http.Get("http://" + prom + "/api/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var rules struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&rules); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rules.Data.Groups {
		for _, r := range g.Rules {
			n++
			if r.Health == "err" {
				t.Errorf("rule %s: %s", r.Name, r.LastError)
			}
		}
	}
	if n != len(ruleExprs) {
		t.Errorf("prometheus loaded %d rules, the file has %d", n, len(ruleExprs))
	}
}
