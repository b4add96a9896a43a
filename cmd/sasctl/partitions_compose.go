package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"sas/internal/partition"
)

// composeLayoutPath is where the partitioned compose file mounts the
// layout in every container.
const composeLayoutPath = "/etc/sas/partitions.yaml"

// composeLogins are the database logins of deploy/docker-compose.yml's
// services.
var composeLogins = map[string]string{
	"submitter": "sas_submitter_login", "scheduler": "sas_scheduler_login", "supervisor": "sas_supervisor_login",
	"console": "sas_console_login", "api": "sas_api_login", "sasctl": "sas_operator_login", "api-token": "sas_operator_login",
	"migrate": "sas", "db-users": "sas",
}

// composeURL is service's database URL on host.
func composeURL(service, host string) string {
	return fmt.Sprintf("postgres://%s@%s:5432/sas?sslmode=disable", composeLogins[service], host)
}

// partitionsCompose writes a Compose file that, laid over
// deploy/docker-compose.yml, runs the layout's partitions: the base
// file's services are the first partition's, and each other partition
// gets its own PostgreSQL and its own submitter, scheduler, agent and
// supervisor, made from the base file's; the console, the API and sasctl
// serve them all, and a one-shot service declares the routing on the
// broker.
func (a *app) partitionsCompose(_ context.Context, args []string) error {
	fs := a.flags()
	load := a.partitionsFlag(fs)
	base := fs.String("base", "deploy/docker-compose.yml", "the compose file to lay this one over")
	mount := fs.String("layout", "./partitions.yaml", "the layout file as the containers mount it, a path from the compose project's folder (the base file's)")
	out := fs.String("out", "", "write the file here (default: standard output)")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	l, err := load()
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(*base)
	if err != nil {
		return err
	}
	var baseDoc struct {
		Services map[string]map[string]any `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &baseDoc); err != nil {
		return fmt.Errorf("%s: %w", *base, err)
	}
	doc, err := composeFor(l, baseDoc.Services, *mount)
	if err != nil {
		return fmt.Errorf("%s: %w", *base, err)
	}
	if raw, err = yaml.Marshal(doc); err != nil {
		return err
	}
	head := "# Written by sasctl partitions compose: the partitions of its layout laid\n" +
		"# over " + filepath.Base(*base) + " (the first partition is its services). Run with both:\n" +
		"#   docker compose -f " + filepath.Base(*base) + " -f THIS-FILE up --build\n"
	raw = append([]byte(head), raw...)
	if *out == "" {
		_, err := a.stdout.Write(raw)
		return err
	}
	return os.WriteFile(*out, raw, 0o644)
}

// composeFor is the Compose document running layout l over the base
// file's services, the layout mounted from mount.
func composeFor(l partition.Layout, base map[string]map[string]any, mount string) (map[string]any, error) {
	for _, svc := range []string{"postgres", "migrate", "db-users", "submitter", "scheduler", "agent", "supervisor"} {
		if base[svc] == nil {
			return nil, fmt.Errorf("no service %s to make the partitions' from", svc)
		}
	}
	layoutVolume := mount + ":" + composeLayoutPath + ":ro"
	partitionEnv := func(p partition.Partition, service, host string) map[string]any {
		e := map[string]any{"SAS_PARTITIONS_FILE": composeLayoutPath, "SAS_PARTITION": p.Name, "SAS_QUEUE_PREFIX": p.QueuePrefix}
		if service != "agent" {
			e["SAS_DATABASE_URL"] = composeURL(service, host)
		}
		return e
	}
	// Every partition's URL, for a service reading them all.
	everyURL := func(service string) map[string]any {
		e := map[string]any{"SAS_PARTITIONS_FILE": composeLayoutPath}
		for i, p := range l.Partitions {
			e[p.DatabaseURLEnv] = composeURL(service, hostOf(i, p))
		}
		return e
	}
	services := map[string]any{
		// Broker users with rights under every partition's prefix.
		"secrets": map[string]any{"environment": map[string]any{"SAS_PARTITIONS_FILE": composeLayoutPath}, "volumes": []string{layoutVolume}},
	}
	first := l.Partitions[0]
	for _, svc := range []string{"submitter", "scheduler", "agent", "supervisor"} {
		services[svc] = map[string]any{"environment": partitionEnv(first, svc, "postgres"), "volumes": []string{layoutVolume}}
	}
	for _, svc := range []string{"console", "api", "sasctl"} {
		services[svc] = map[string]any{"environment": everyURL(svc), "volumes": []string{layoutVolume}}
	}
	completed := map[string]string{"condition": "service_completed_successfully"}
	healthy := map[string]string{"condition": "service_healthy"}
	setupDeps := map[string]any{"rabbitmq": healthy, "db-users": completed}
	volumes := map[string]any{}
	for i, p := range l.Partitions[1:] {
		host := hostOf(i+1, p)
		// A base service made partition p's: its database and the
		// services it waits for are p's.
		rename := map[string]string{"postgres": host, "migrate": "migrate-" + p.Name, "db-users": "db-users-" + p.Name}
		clone := func(svc string, env map[string]any) map[string]any {
			c := deepCopy(base[svc]).(map[string]any)
			delete(c, "container_name")
			if deps, ok := c["depends_on"].(map[string]any); ok {
				for k, v := range deps {
					if to, ok := rename[k]; ok {
						delete(deps, k)
						deps[to] = v
					}
				}
			}
			if env != nil {
				e, _ := c["environment"].(map[string]any)
				if e == nil {
					e = map[string]any{}
				}
				for k, v := range env {
					e[k] = v
				}
				c["environment"] = e
			}
			return c
		}
		db := "pgdata-" + p.Name
		volumes[db] = map[string]any{}
		pg := clone("postgres", nil)
		var vols []any
		for _, v := range asList(pg["volumes"]) {
			if s, ok := v.(string); ok && strings.HasPrefix(s, "pgdata:") {
				v = db + strings.TrimPrefix(s, "pgdata")
			}
			vols = append(vols, v)
		}
		pg["volumes"] = vols
		delete(pg, "ports")
		services[host] = pg
		services["migrate-"+p.Name] = clone("migrate", map[string]any{"SAS_DATABASE_URL": composeURL("migrate", host)})
		services["db-users-"+p.Name] = clone("db-users", map[string]any{"SAS_DATABASE_URL": composeURL("db-users", host)})
		setupDeps["db-users-"+p.Name] = completed
		for _, svc := range []string{"submitter", "scheduler", "agent", "supervisor"} {
			c := clone(svc, partitionEnv(p, svc, host))
			c["volumes"] = append(asList(c["volumes"]), layoutVolume)
			services[svc+"-"+p.Name] = c
		}
	}
	// One-shot: the routing exchange and its buckets on the broker.
	setupEnv := everyURL("sasctl")
	setupEnv["SAS_AMQP_URL"] = "amqp://sas-sasctl@rabbitmq:5672/"
	setupEnv["SAS_AMQP_PASSWORD_FILE"] = "/run/secrets/sas/amqp-sasctl"
	setupEnv["SAS_DATABASE_PASSWORD_FILE"] = "/run/secrets/sas/db-operator"
	services["partitions-setup"] = map[string]any{
		"image": "sas:local", "restart": "no", "entrypoint": []string{"/usr/local/bin/sasctl"}, "command": []string{"partitions", "setup"},
		"environment": setupEnv, "volumes": []any{"secrets:/run/secrets/sas:ro", layoutVolume}, "depends_on": setupDeps,
	}
	doc := map[string]any{"services": services}
	if len(volumes) > 0 {
		doc["volumes"] = volumes
	}
	return doc, nil
}

// asList is a YAML sequence's items (none for anything else).
func asList(v any) []any {
	l, _ := v.([]any)
	return slices.Clone(l)
}

// deepCopy copies a decoded YAML value.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopy(e)
		}
		return out
	}
	return v
}

// hostOf is partition i's PostgreSQL service: the base file's for the
// first, postgres-NAME for the others.
func hostOf(i int, p partition.Partition) string {
	if i == 0 {
		return "postgres"
	}
	return "postgres-" + p.Name
}
