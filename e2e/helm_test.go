package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sas/internal/partition"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// The API definitions the rendered chart is validated against, from the
// Go module proxy (so that it works offline once fetched): Kubernetes'
// own OpenAPI document, and the CRDs of KEDA and the Prometheus operator.
const (
	kubernetesModule = "k8s.io/kubernetes@v1.34.2"
	kedaModule       = "github.com/kedacore/keda/v2@v2.17.2"
	promOpModule     = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	chartDir         = "../deploy/helm/sas"
	kubeVersion      = "1.30.0"
)

// TestHelmChart: the chart lints and renders with each value set of its
// ci/ directory, every rendered object is valid against the Kubernetes
// API (kubeconform, strict: no unknown field) and the CRDs it uses, and
// the objects say what the chart promises: probes, a locked-down pod,
// only a component's own passwords, the alert rules and dashboard of the
// compose deployment, KEDA scaling on the agent queues.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	helm := tool(t, "helm")
	kubeconform := tool(t, "kubeconform")
	schemas := kubeSchemas(t)

	valueSets, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(valueSets) < 3 {
		t.Fatalf("value sets: %v %v", valueSets, err)
	}
	rendered := map[string][]map[string]any{}
	for _, vs := range valueSets {
		name := strings.TrimSuffix(filepath.Base(vs), "-values.yaml")
		if out, err := exec.Command(helm, "lint", "--strict", chartDir, "-f", vs).CombinedOutput(); err != nil {
			t.Fatalf("helm lint %s: %v\n%s", name, err, out)
		}
		out, err := exec.Command(helm, "template", "sas", chartDir, "-f", vs, "--namespace", "orders", "--kube-version", kubeVersion).Output()
		if err != nil {
			t.Fatalf("helm template %s: %v", name, err)
		}
		file := filepath.Join(t.TempDir(), name+".yaml")
		if err := os.WriteFile(file, out, 0o600); err != nil {
			t.Fatal(err)
		}
		validate(t, kubeconform, schemas, file, true)
		rendered[name] = decodeAll(t, out)
	}
	// The validator is no formality: it refuses what the API would.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  replica: 2\n  selector: {matchLabels: {a: b}}\n  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	validate(t, kubeconform, schemas, bad, false)
	// Without somewhere to send calls the chart refuses to render.
	if out, err := exec.Command(helm, "template", "sas", chartDir, "--kube-version", kubeVersion).CombinedOutput(); err == nil || !strings.Contains(string(out), "remote.url") {
		t.Errorf("the chart rendered with nowhere for agents to call: %v\n%s", err, out)
	}

	full := rendered["full"]
	for _, set := range rendered {
		for _, o := range set {
			if o["kind"] == "Deployment" || o["kind"] == "Job" {
				checkPod(t, o)
			}
		}
	}
	kinds := map[string]int{}
	for _, o := range full {
		kinds[o["kind"].(string)]++
	}
	for kind, n := range map[string]int{"Deployment": 8, "Job": 1, "Secret": 1, "PodDisruptionBudget": 6, "NetworkPolicy": 8,
		"ServiceMonitor": 1, "PrometheusRule": 1, "ScaledObject": 3, "TriggerAuthentication": 1, "ConfigMap": 3} {
		if kinds[kind] != n {
			t.Errorf("the full set renders %d %s, want %d (all: %v)", kinds[kind], kind, n, kinds)
		}
	}

	// A list of partitions: each partition's processes under its prefix,
	// on its database, naming it; the console and the API once, with
	// every partition's database; a migration job a partition; the
	// layout every process reads.
	parts := rendered["partitions"]
	for _, p := range []string{"p1", "p2", "p3", "p4"} {
		for _, comp := range []string{"submitter", "scheduler", "supervisor", "agent-payment"} {
			env := envOf(container(t, find(t, parts, "Deployment", "-"+comp+"-"+p)))
			if env["SAS_PARTITION"] != p || env["SAS_QUEUE_PREFIX"] != "sas."+p+"." || !strings.Contains(env["SAS_DATABASE_URL"], "@pg-"+p+":5432/") && comp != "agent-payment" ||
				env["SAS_PARTITIONS_FILE"] == "" {
				t.Errorf("%s of partition %s: %v", comp, p, env)
			}
		}
		find(t, parts, "Job", "-migrate-"+p)
		for _, comp := range []string{"-api", "-console"} {
			env := envOf(container(t, find(t, parts, "Deployment", comp)))
			if !strings.Contains(env["SAS_"+strings.ToUpper(p)+"_DATABASE_URL"], "@pg-"+p+":5432/") || env["SAS_PARTITION"] != "" {
				t.Errorf("%s reads partition %s's store from %q", comp, p, env["SAS_"+strings.ToUpper(p)+"_DATABASE_URL"])
			}
		}
	}
	for _, p := range []string{"p1", "p2", "p3"} {
		sched := fmt.Sprint(find(t, parts, "ScaledObject", "-scheduler-"+p)["spec"])
		agent := fmt.Sprint(find(t, parts, "ScaledObject", "-agent-payment-"+p)["spec"])
		if !strings.Contains(sched, `partition="`+p+`"`) || !strings.Contains(sched, "-scheduler-"+p) || !strings.Contains(agent, "sas."+p+".agent.payment") {
			t.Errorf("partition %s's KEDA objects:\n%s\n%s", p, sched, agent)
		}
	}
	layout := find(t, parts, "ConfigMap", "-partitions")["data"].(map[string]any)["partitions.yaml"].(string)
	// p4, added later, owns no bucket; the others keep their thirds.
	if l, err := partition.Parse([]byte(layout)); err != nil || len(l.Partitions) != 4 || l.Partitions[1].DatabaseURLEnv != "SAS_P2_DATABASE_URL" ||
		!l.Partitions[3].Added || len(l.Owned(3)) != 0 || len(l.Owned(0)) != 86 {
		t.Errorf("the rendered layout: %v\n%s", err, layout)
	}
	if n := len(rendered["minimal"]); n == 0 || slices.ContainsFunc(rendered["minimal"], func(o map[string]any) bool { return strings.Contains(name(o), "partition") }) {
		t.Errorf("a deployment of one state store renders partitions objects")
	}

	// The alert rules and the dashboard are the compose deployment's.
	rules, err := os.ReadFile("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	if err := yaml.Unmarshal(rules, &want); err != nil {
		t.Fatal(err)
	}
	pr := find(t, full, "PrometheusRule", "")
	got, _ := json.Marshal(pr["spec"])
	wantJSON, _ := json.Marshal(want)
	if !jsonEqual(got, wantJSON) {
		t.Errorf("the PrometheusRule is not deploy/prometheus/alerts.yml")
	}
	dashboard, err := os.ReadFile("../deploy/grafana/dashboards/sas.json")
	if err != nil {
		t.Fatal(err)
	}
	cm := find(t, full, "ConfigMap", "sas-dashboard")
	if strings.TrimSpace(fmt.Sprint(cm["data"].(map[string]any)["sas.json"])) != strings.TrimSpace(string(dashboard)) {
		t.Errorf("the dashboard ConfigMap is not deploy/grafana/dashboards/sas.json")
	}
	// Alert rules name jobs sas-scheduler, …: so does the ServiceMonitor.
	if sm := find(t, full, "ServiceMonitor", ""); sm["spec"].(map[string]any)["jobLabel"] != "sas.dev/job" {
		t.Errorf("ServiceMonitor: %v", sm["spec"])
	}
	for _, o := range full {
		if o["kind"] == "Service" && strings.HasSuffix(name(o), "-metrics") {
			job := o["metadata"].(map[string]any)["labels"].(map[string]any)["sas.dev/job"]
			if !slices.Contains([]any{"sas-submitter", "sas-scheduler", "sas-agent", "sas-supervisor", "sas-console", "sas-api"}, job) {
				t.Errorf("service %s: job %v", name(o), job)
			}
		}
	}

	// KEDA: each agent deployment on its own queues, schedulers on
	// pending steps; replicas left to KEDA.
	queues := map[string][]string{}
	for _, o := range full {
		if o["kind"] != "ScaledObject" {
			continue
		}
		spec := o["spec"].(map[string]any)
		target := spec["scaleTargetRef"].(map[string]any)["name"].(string)
		for _, tr := range spec["triggers"].([]any) {
			m := tr.(map[string]any)["metadata"].(map[string]any)
			if q, ok := m["queueName"]; ok {
				queues[target] = append(queues[target], q.(string))
			} else if !strings.Contains(m["query"].(string), "sas_") {
				t.Errorf("scaler of %s: %v", target, m)
			}
		}
		if _, fixed := find(t, full, "Deployment", strings.TrimPrefix(target, "sas-"))["spec"].(map[string]any)["replicas"]; fixed {
			t.Errorf("deployment %s has replicas while KEDA scales it", target)
		}
	}
	if !slices.Equal(queues["sas-agent-payment"], []string{"sas.agent.payment"}) || !slices.Equal(queues["sas-agent-rest"], []string{"sas.agent.inventory", "sas.agent.shipping"}) {
		t.Errorf("agent scalers' queues: %v", queues)
	}
	if _, ok := find(t, full, "ScaledObject", "sas-scheduler")["spec"]; !ok {
		t.Error("no scaler for the schedulers")
	}

	// The Secret: every password, and a console users file whose admin
	// logs in with console-admin.
	sec := find(t, full, "Secret", "sas-secrets")["data"].(map[string]any)
	dec := func(k string) string {
		b, err := base64.StdEncoding.DecodeString(fmt.Sprint(sec[k]))
		if err != nil || len(b) == 0 {
			t.Fatalf("secret key %s: %v", k, err)
		}
		return string(b)
	}
	users := dec("console-users")
	admin, rest, ok := strings.Cut(users, ":")
	r, h, _ := strings.Cut(rest, ":")
	if admin != "admin" || !ok || r != "operator" || bcrypt.CompareHashAndPassword([]byte(strings.TrimSpace(h)), []byte(dec("console-admin"))) != nil {
		t.Errorf("console users %q do not let admin in with console-admin", users)
	}
	if dec("console-admin") != "a fixed / password: with # every @ character %" || len(dec("db-scheduler")) != 32 {
		t.Errorf("secret values: given one changed, or a generated one is not 32 characters")
	}

	// URLs from parts: a multi-host database, every broker node.
	sched := container(t, find(t, full, "Deployment", "scheduler"))
	// Single sign-on: the console and the API know the provider; only
	// the console reads the client's secret, from the Secret.
	for _, c := range []string{"console", "api"} {
		e := envOf(container(t, find(t, full, "Deployment", c)))
		if e["SAS_OIDC_ISSUER"] != "https://idp.example.com/realms/acme" || e["SAS_OIDC_ROLES"] == "" {
			t.Errorf("the %s's environment has no identity provider: %v", c, e)
		}
		if _, ok := e["SAS_OIDC_CLIENT_SECRET_FILE"]; ok != (c == "console") {
			t.Errorf("the %s reads the client's secret: %v", c, ok)
		}
	}
	env := envOf(sched)
	if env["SAS_DATABASE_URL"] != "postgres://sas_scheduler_login@pg-1.db.svc:5432,pg-2.db.svc:5432/sas?sslmode=verify-full&sslrootcert=/etc/ssl/certs/ca-certificates.crt&target_session_attrs=read-write" ||
		strings.Count(env["SAS_AMQP_URL"], "amqps://sas-scheduler@") != 3 || !strings.Contains(env["SAS_AMQP_URL"], "/orders%2Fprod") {
		t.Errorf("scheduler URLs: %q %q", env["SAS_DATABASE_URL"], env["SAS_AMQP_URL"])
	}
	if env["SAS_SCHEDULER_BATCH"] != "200" {
		t.Errorf("extra settings are not passed: %v", env)
	}
	// The existing secret is used as it is, and nothing is made.
	for _, o := range rendered["existing-secret"] {
		if o["kind"] == "Secret" || o["kind"] == "Job" {
			t.Errorf("existing-secret renders a %s", o["kind"])
		}
		if o["kind"] == "Deployment" {
			for _, v := range o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["volumes"].([]any) {
				if s, ok := v.(map[string]any)["secret"]; ok && s.(map[string]any)["secretName"] != "sas-passwords" {
					t.Errorf("deployment %s mounts %v", name(o), s)
				}
			}
		}
	}
}

// checkPod checks what every pod of the chart must be: non-root, a
// read-only root filesystem, no capability, probes on /healthz and
// /readyz (services), passwords as files only, its own only.
func checkPod(t *testing.T, o map[string]any) {
	t.Helper()
	spec := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	psc := spec["securityContext"].(map[string]any)
	if psc["runAsNonRoot"] != true || spec["automountServiceAccountToken"] != false {
		t.Errorf("%s: pod security %v", name(o), psc)
	}
	var cs []any
	cs = append(cs, spec["containers"].([]any)...)
	if ic, ok := spec["initContainers"].([]any); ok {
		cs = append(cs, ic...)
	}
	for _, c := range cs {
		c := c.(map[string]any)
		sc := c["securityContext"].(map[string]any)
		if sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false ||
			!slices.Equal(sc["capabilities"].(map[string]any)["drop"].([]any), []any{"ALL"}) {
			t.Errorf("%s/%s: container security %v", name(o), c["name"], sc)
		}
		if _, ok := c["resources"].(map[string]any)["requests"]; !ok {
			t.Errorf("%s/%s: no resource requests", name(o), c["name"])
		}
		for k := range envOf(c) {
			if strings.Contains(k, "PASSWORD") && !strings.HasSuffix(k, "_FILE") {
				t.Errorf("%s/%s: a password in %s", name(o), c["name"], k)
			}
		}
		if o["kind"] == "Deployment" {
			live, _ := c["livenessProbe"].(map[string]any)
			ready, _ := c["readinessProbe"].(map[string]any)
			if fmt.Sprint(live["httpGet"]) == "" || live["httpGet"].(map[string]any)["path"] != "/healthz" || ready["httpGet"].(map[string]any)["path"] != "/readyz" {
				t.Errorf("%s/%s: probes %v %v", name(o), c["name"], live, ready)
			}
		}
	}
	// Only its own passwords: the keys mounted are the ones its settings name.
	vols, _ := spec["volumes"].([]any)
	for _, v := range vols {
		s, ok := v.(map[string]any)["secret"].(map[string]any)
		if !ok {
			continue
		}
		var named []string
		for _, c := range cs {
			for k, val := range envOf(c.(map[string]any)) {
				if strings.HasSuffix(k, "_FILE") && strings.HasPrefix(val, "/run/secrets/sas/") {
					named = append(named, strings.TrimPrefix(val, "/run/secrets/sas/"))
				}
			}
		}
		for _, it := range s["items"].([]any) {
			if key := it.(map[string]any)["key"].(string); !slices.Contains(named, key) {
				t.Errorf("%s mounts %s, which none of its settings reads", name(o), key)
			}
		}
	}
}

// validate runs kubeconform over file with the schemas in dir; valid says
// whether it must pass.
func validate(t *testing.T, kubeconform, dir, file string, valid bool) {
	t.Helper()
	out, err := exec.Command(kubeconform, "-summary", "-output", "text",
		"-schema-location", filepath.Join(dir, "{{ .ResourceKind }}_{{ .Group }}_{{ .ResourceAPIVersion }}.json"), file).CombinedOutput()
	switch {
	case valid && err != nil:
		t.Errorf("kubeconform %s: %v\n%s", filepath.Base(file), err, out)
	case !valid && (err == nil || !strings.Contains(string(out), "replica")):
		t.Errorf("kubeconform passed an invalid Deployment: %v\n%s", err, out)
	case valid && !strings.Contains(string(out), "Invalid: 0, Errors: 0, Skipped: 0"):
		t.Errorf("kubeconform %s: not every object was checked\n%s", filepath.Base(file), out)
	}
}

// kubeSchemas writes a strict JSON schema per kind (kind_group_version.json;
// the core group is named by its version), from Kubernetes' OpenAPI
// document and the CRDs of KEDA and the Prometheus operator.
func kubeSchemas(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	var swagger struct {
		Definitions map[string]map[string]any
	}
	raw, err := os.ReadFile(filepath.Join(moduleDir(t, kubernetesModule), "api", "openapi-spec", "swagger.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &swagger); err != nil {
		t.Fatal(err)
	}
	for defName, def := range swagger.Definitions {
		gvks, _ := def["x-kubernetes-group-version-kind"].([]any)
		for _, g := range gvks {
			gvk := g.(map[string]any)
			group, version, kind := gvk["group"].(string), gvk["version"].(string), gvk["kind"].(string)
			if group == "" {
				group = version
			}
			defs := map[string]any{}
			reach(swagger.Definitions, defName, defs)
			writeSchema(t, dir, kind, group, version, map[string]any{"$ref": "#/definitions/" + defName, "definitions": defs})
		}
	}
	for _, m := range []struct{ module, dir string }{
		{kedaModule, "config/crd/bases"},
		{promOpModule, "example/prometheus-operator-crd"},
	} {
		files, _ := filepath.Glob(filepath.Join(moduleDir(t, m.module), m.dir, "*.yaml"))
		if len(files) == 0 {
			t.Fatalf("no CRDs in %s/%s", m.module, m.dir)
		}
		for _, f := range files {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var crd struct {
				Spec struct {
					Group    string
					Names    struct{ Kind string }
					Versions []struct {
						Name   string
						Schema struct {
							OpenAPIV3Schema map[string]any `yaml:"openAPIV3Schema"`
						}
					}
				}
			}
			if err := yaml.Unmarshal(raw, &crd); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, v := range crd.Spec.Versions {
				writeSchema(t, dir, crd.Spec.Names.Kind, crd.Spec.Group, v.Name, strict(v.Schema.OpenAPIV3Schema))
			}
		}
	}
	return dir
}

// reach copies into out the definition name and every one it refers to,
// made strict.
func reach(all map[string]map[string]any, name string, out map[string]any) {
	if _, done := out[name]; done {
		return
	}
	def := strict(all[name]).(map[string]any)
	out[name] = def
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				reach(all, strings.TrimPrefix(ref, "#/definitions/"), out)
			}
			for _, c := range x {
				walk(c)
			}
		case []any:
			for _, c := range x {
				walk(c)
			}
		}
	}
	walk(def)
}

// strict returns a copy of an OpenAPI schema in which an object with
// properties takes no other (as kubeconform's strict schemas), and an
// int-or-string (and a quantity) takes either.
func strict(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, c := range x {
			out[k] = strict(c)
		}
		if x["format"] == "int-or-string" || x["x-kubernetes-int-or-string"] == true {
			delete(out, "type")
			delete(out, "format")
			out["anyOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}
		}
		if x["format"] == "quantity" || x["x-kubernetes-int-or-string"] == nil && x["description"] != nil &&
			strings.HasPrefix(fmt.Sprint(x["description"]), "Quantity is a fixed-point") {
			delete(out, "type")
			out["anyOf"] = []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}
		}
		if _, has := x["properties"]; has && x["additionalProperties"] == nil && x["x-kubernetes-preserve-unknown-fields"] != true {
			out["additionalProperties"] = false
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, c := range x {
			out[i] = strict(c)
		}
		return out
	}
	return v
}

func writeSchema(t *testing.T, dir, kind, group, version string, schema any) {
	t.Helper()
	b, err := json.Marshal(schema)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s_%s_%s.json", strings.ToLower(kind), group, version)), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// moduleDir fetches a module through the Go module proxy (or the module
// cache) and returns where its files are.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = os.TempDir() // outside this module: go.mod stays as it is
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v\n%s", module, err, out)
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", module, err, out)
	}
	return info.Dir
}

func decodeAll(t *testing.T, out []byte) []map[string]any {
	t.Helper()
	var objs []map[string]any
	d := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o map[string]any
		err := d.Decode(&o)
		if err == io.EOF {
			return objs
		}
		if err != nil {
			t.Fatalf("rendered YAML: %v", err)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
}

func name(o map[string]any) string { return fmt.Sprint(o["metadata"].(map[string]any)["name"]) }

// find returns the object of kind whose name ends with suffix.
func find(t *testing.T, objs []map[string]any, kind, suffix string) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o["kind"] == kind && strings.HasSuffix(name(o), suffix) {
			return o
		}
	}
	t.Fatalf("no %s named …%s", kind, suffix)
	return nil
}

func container(t *testing.T, o map[string]any) map[string]any {
	t.Helper()
	return o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
}

func envOf(c map[string]any) map[string]string {
	m := map[string]string{}
	list, _ := c["env"].([]any)
	for _, e := range list {
		e := e.(map[string]any)
		if v, ok := e["value"]; ok {
			m[e["name"].(string)] = fmt.Sprint(v)
		} else {
			m[e["name"].(string)] = ""
		}
	}
	return m
}
