package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/client"
	"sas/internal/harness/testenv"
)

// TestDeploymentSecretsMadeOnceAndUsedFromFiles runs what the compose
// file's init service runs (sasctl secrets init), then a RabbitMQ node
// booted with the configuration it wrote (its users and rights loaded
// from the definitions, as the compose file's broker is), database logins
// made from the password files, and every service reading its passwords
// from files (SAS_*_PASSWORD_FILE), as the compose file runs them.
// Orders submitted by an application through the client, logged in as
// the application's broker user, complete; that user may do nothing
// else.
func TestDeploymentSecretsMadeOnceAndUsedFromFiles(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	// The broker runs as its own user and reads the definitions: a
	// directory it can reach (t.TempDir is the test user's alone).
	dir, err := os.MkdirTemp("", "sas-secrets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	secrets := filepath.Join(dir, "secrets")
	initArgs := []string{"secrets", "init", "--dir", secrets}
	rabbitUID := -1
	if u, err := user.Lookup("rabbitmq"); err == nil && os.Geteuid() == 0 {
		rabbitUID, _ = strconv.Atoi(u.Uid)
		initArgs = append(initArgs, "--owner", "rabbitmq-definitions.json="+u.Uid+":0", "--owner", "rabbitmq.conf="+u.Uid+":0")
	}
	out, errOut, code := sasctl(t, s.env, initArgs...)
	if code != 0 || !strings.Contains(out, "made postgres, rabbitmq,") {
		t.Fatalf("secrets init: exit %d: %s %s", code, out, errOut)
	}
	names := []string{"postgres", "rabbitmq", "db-submitter", "db-scheduler", "db-supervisor", "db-operator", "db-console", "db-api",
		"amqp-submitter", "amqp-scheduler", "amqp-agent", "amqp-sasctl", "amqp-api", "amqp-app", "grafana-admin", "console-admin"}
	read := func() map[string]string {
		m := map[string]string{}
		for _, n := range append(names, "console-users", "rabbitmq.conf", "rabbitmq-definitions.json") {
			b, err := os.ReadFile(filepath.Join(secrets, n))
			if err != nil {
				t.Fatal(err)
			}
			m[n] = string(b)
		}
		return m
	}
	first := read()
	seen := map[string]bool{}
	for _, n := range names {
		pw := strings.TrimSuffix(first[n], "\n")
		if len(pw) != 32 || seen[pw] || strings.Contains(out+errOut, pw) {
			t.Errorf("secret %s: %d characters, repeated %v, or printed", n, len(pw), seen[pw])
		}
		seen[pw] = true
		fi, err := os.Stat(filepath.Join(secrets, n))
		if err != nil || fi.Mode().Perm() != 0o440 {
			t.Errorf("secret %s: mode %v (%v), want 0440", n, fi.Mode().Perm(), err)
		}
	}
	if rabbitUID >= 0 {
		fi, _ := os.Stat(filepath.Join(secrets, "rabbitmq-definitions.json"))
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != rabbitUID {
			t.Errorf("the definitions are owned by %d, want the broker's user %d", st.Uid, rabbitUID)
		}
	}
	if !strings.HasPrefix(first["console-users"], "admin:operator:$2") {
		t.Errorf("console users: %q", first["console-users"])
	}
	// Run again (every start of the compose file does): nothing changes
	// but what is missing.
	if err := os.Remove(filepath.Join(secrets, "amqp-app")); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sasctl(t, s.env, initArgs...)
	if code != 0 || !strings.Contains(out, "made amqp-app; kept 15") {
		t.Fatalf("secrets init again: exit %d: %s %s", code, out, errOut)
	}
	again := read()
	for _, n := range append(names, "console-users") {
		if (again[n] == first[n]) == (n == "amqp-app") {
			t.Errorf("secret %s after a second run: changed %v", n, again[n] != first[n])
		}
	}
	pw := func(n string) string { return strings.TrimSuffix(again[n], "\n") }

	// The broker, booted with the written configuration.
	node := startRabbitNodes(t, "sassecret", "5720", 1, filepath.Join(secrets, "rabbitmq.conf"), "")
	nodeURL := func(user string) string {
		return "amqp://" + user + "@" + strings.TrimPrefix(node.urls, "amqp://guest:guest@")
	}
	// The administrator logs in with its password, and with no other.
	if conn, err := amqp.Dial(strings.Replace(nodeURL("sas"), "sas@", "sas:"+url.QueryEscape(pw("rabbitmq"))+"@", 1)); err != nil {
		t.Fatalf("the administrator cannot log in: %v", err)
	} else {
		conn.Close()
	}
	if conn, err := amqp.Dial(strings.Replace(nodeURL("sas"), "sas@", "sas:wrong@", 1)); err == nil {
		conn.Close()
		t.Fatal("the administrator logged in with a wrong password")
	}

	// Database logins, their passwords read from the files.
	suffix := "_t" + testenv.RandomSuffix(8)
	roles := []string{"submitter", "scheduler", "supervisor", "operator"}
	t.Cleanup(func() {
		for _, r := range roles {
			_, _ = s.pool.Exec(context.Background(), `DROP ROLE IF EXISTS sas_`+r+suffix)
		}
	})
	dbEnv := append([]string{}, s.env...)
	for _, r := range roles {
		dbEnv = append(dbEnv, "SAS_DB_PASSWORD_"+strings.ToUpper(r)+"_FILE="+filepath.Join(secrets, "db-"+r))
	}
	if out, errOut, code := sasctl(t, dbEnv, "db", "users", "--login-suffix", suffix); code != 0 || strings.Count(out, "login ") != len(roles) {
		t.Fatalf("db users from files: exit %d: %s %s", code, out, errOut)
	}
	// The test database trusts loopback logins: check what it stored
	// against each file instead.
	for _, r := range roles {
		var verifier string
		if err := s.pool.QueryRow(context.Background(), `SELECT rolpassword FROM pg_authid WHERE rolname = $1`, "sas_"+r+suffix).Scan(&verifier); err != nil {
			t.Fatal(err)
		}
		if !scramMatches(t, verifier, pw("db-"+r)) {
			t.Errorf("the login of %s does not have the password of its file", r)
		}
	}

	// The services as the compose file runs them: a login of their own,
	// every password from a file.
	broker := func(svc string) []string {
		return []string{"SAS_AMQP_URL=" + nodeURL("sas-"+svc), "SAS_AMQP_PASSWORD_FILE=" + filepath.Join(secrets, "amqp-"+svc)}
	}
	database := func(role string) []string {
		u, err := url.Parse(s.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User("sas_" + role + suffix)
		return []string{"SAS_DATABASE_URL=" + u.String(), "SAS_DATABASE_PASSWORD_FILE=" + filepath.Join(secrets, "db-"+role)}
	}
	st := s
	st.env = append(append(append([]string{}, s.env...), broker("sasctl")...), database("operator")...)
	p := newPipeline(t, pipelineOpts{on: &st, supervisors: 1,
		submitterEnv:  append(broker("submitter"), database("submitter")...),
		schedulerEnv:  append(broker("scheduler"), database("scheduler")...),
		agentEnv:      broker("agent"),
		supervisorEnv: database("supervisor")})

	// The application: the client, as the app user.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	appURL := strings.Replace(nodeURL("sas-app"), "sas-app@", "sas-app:"+url.QueryEscape(pw("amqp-app"))+"@", 1)
	c, err := client.Connect(ctx, client.Config{URL: appURL, QueuePrefix: s.topo.Prefix})
	if err != nil {
		t.Fatalf("the application cannot connect: %v", err)
	}
	defer c.Close()
	var ids []string
	for i := range 20 {
		id, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: map[string]any{
			"customer": fmt.Sprintf("customer %d", i), "items": []map[string]any{{"sku": "SKU-1", "qty": 1}}, "amount": 100 + i, "currency": "EUR"}})
		if err != nil {
			t.Fatalf("submit as the application: %v", err)
		}
		ids = append(ids, id)
	}
	for _, id := range ids {
		st, err := c.Await(ctx, id)
		if err != nil || st.Status != "completed" {
			t.Fatalf("order %s: %+v %v", id, st, err)
		}
	}
	// sasctl, as the operator's login with its password from a file.
	if out, errOut, code := sasctl(t, p.env, "orders", "list", "--limit", "50"); code != 0 || strings.Count(out, "completed") < len(ids) {
		t.Fatalf("orders list as the operator: exit %d: %s %s", code, out, errOut)
	}

	// The application may do nothing else.
	refusedAs := func(what string, do func(*amqp.Channel) error) {
		t.Helper()
		expectRefused(t, appURL, "the application ("+what+")", do)
	}
	publishTo := func(exchange, key string) func(*amqp.Channel) error {
		return func(ch *amqp.Channel) error {
			if err := ch.Confirm(false); err != nil {
				return err
			}
			dc, err := ch.PublishWithDeferredConfirm(exchange, key, false, false, amqp.Publishing{Body: []byte("{}")})
			if err != nil {
				return err
			}
			_, err = dc.WaitContext(ctx)
			return err
		}
	}
	refusedAs("a forged reply through the default exchange", publishTo("", s.topo.Queue("replies")))
	refusedAs("a step request through the default exchange", publishTo("", s.topo.Queue("agent.payment")))
	refusedAs("the dead-letter exchange", publishTo(s.topo.DeadLetterExchange(), s.topo.DeadLetterQueue("submit")))
	refusedAs("reading the orders", func(ch *amqp.Channel) error {
		_, err := ch.Consume(s.topo.Queue("submit"), "", false, false, false, false, nil)
		return err
	})
	refusedAs("declaring a queue not its own", func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(s.topo.Prefix+"mine", false, true, false, false, nil)
		return err
	})
}

// scramMatches reports whether a PostgreSQL SCRAM-SHA-256 verifier
// (SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey) is of password.
func scramMatches(t *testing.T, verifier, password string) bool {
	t.Helper()
	var iter int
	var salt64, keys string
	head, rest, ok := strings.Cut(verifier, "$")
	if !ok || head != "SCRAM-SHA-256" {
		t.Fatalf("not a SCRAM verifier: %q", verifier)
	}
	params, keys, _ := strings.Cut(rest, "$")
	it, salt64, _ := strings.Cut(params, ":")
	iter, err := strconv.Atoi(it)
	if err != nil {
		t.Fatalf("verifier %q: %v", verifier, err)
	}
	stored64, _, _ := strings.Cut(keys, ":")
	salt, err1 := base64.StdEncoding.DecodeString(salt64)
	stored, err2 := base64.StdEncoding.DecodeString(stored64)
	if err1 != nil || err2 != nil {
		t.Fatalf("verifier %q: %v %v", verifier, err1, err2)
	}
	salted, err := pbkdf2.Key(sha256.New, password, salt, iter, sha256.Size)
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha256.New, salted)
	mac.Write([]byte("Client Key"))
	sum := sha256.Sum256(mac.Sum(nil))
	return hmac.Equal(sum[:], stored) && fmt.Sprint(iter) == it
}
