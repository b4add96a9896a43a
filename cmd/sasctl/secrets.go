package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sas/internal/broker"
	"sas/internal/console"
	"sas/internal/statestore"
)

// defaultSecretsDir is where the compose file mounts the secrets volume.
const defaultSecretsDir = "/run/secrets/sas"

// secretNames lists the passwords secrets init makes, each a file of its
// own: the owners' (postgres, rabbitmq), a database login per service
// role, a broker user per service and for applications, Grafana's admin
// and the console's admin.
func secretNames() []string {
	names := []string{"postgres", "rabbitmq"}
	for _, svc := range []string{"submitter", "scheduler", "supervisor", "operator", "console", "api"} {
		names = append(names, "db-"+svc)
	}
	for _, p := range broker.Permissions("") {
		names = append(names, "amqp-"+p.Service)
	}
	return append(names, "grafana-admin", "console-admin")
}

// derivedNames are the files secrets init writes from the passwords: the
// console's users file, and RabbitMQ's configuration and definitions
// (its users, with salted hashes of their passwords, and their rights).
func derivedNames() []string {
	return []string{"console-users", "rabbitmq.conf", "rabbitmq-definitions.json"}
}

// ownerFlag collects --owner FILE=UID[:GID].
type ownerFlag map[string][2]int

func (o ownerFlag) String() string { return "" }

func (o ownerFlag) Set(v string) error {
	file, ids, ok := strings.Cut(v, "=")
	if !ok || file == "" {
		return fmt.Errorf("%q: want FILE=UID[:GID]", v)
	}
	if file != "*" && !slices.Contains(append(secretNames(), derivedNames()...), file) {
		return fmt.Errorf("%q: no such file (want one of %s, or *)", file, strings.Join(append(secretNames(), derivedNames()...), ", "))
	}
	u, g, hasGroup := strings.Cut(ids, ":")
	uid, err := strconv.Atoi(u)
	if err != nil || uid < 0 {
		return fmt.Errorf("%q: the user id is not a number", v)
	}
	gid := uid
	if hasGroup {
		if gid, err = strconv.Atoi(g); err != nil || gid < 0 {
			return fmt.Errorf("%q: the group id is not a number", v)
		}
	}
	o[file] = [2]int{uid, gid}
	return nil
}

// secretsInit makes every secret of a deployment that is not there yet,
// in a directory (the compose file's secrets volume), and writes the
// files derived from them. It never prints a secret and never replaces
// one: run again, it keeps what it made, and makes only what is missing.
func (a *app) secretsInit(_ context.Context, args []string) error {
	fs := a.flags()
	dir := fs.String("dir", defaultSecretsDir, "the directory to write the secrets to")
	owners := ownerFlag{}
	fs.Var(owners, "owner", "FILE=UID[:GID]: who owns FILE (* for every file not named); files are readable by owner and group only")
	userPrefix := fs.String("user-prefix", "sas-", "broker user names are this prefix and the service's name")
	adminUser := fs.String("admin-user", "sas", "the broker's administrator (the rabbitmq password)")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(*dir, 0o755); err != nil {
		return err
	}
	pw := map[string]string{}
	var created []string
	for _, name := range secretNames() {
		v, err := readSecret(*dir, name)
		switch {
		case err == nil:
			pw[name] = v
			continue
		case !errors.Is(err, os.ErrNotExist):
			return err
		}
		v, err = newSecret()
		if err != nil {
			return err
		}
		if err := writeSecret(*dir, name, []byte(v+"\n")); err != nil {
			return err
		}
		pw[name] = v
		created = append(created, name)
	}
	// The console's users file: its admin, an operator. Made again only
	// when its password is new or the file is gone (bcrypt is slow, and
	// a rewrite would log every console user out).
	if _, err := os.Stat(filepath.Join(*dir, "console-users")); errors.Is(err, os.ErrNotExist) || slices.Contains(created, "console-admin") {
		hash, err := console.HashPassword(pw["console-admin"], console.DefaultCost)
		if err != nil {
			return err
		}
		if err := writeSecret(*dir, "console-users", []byte(console.UserLine("admin", console.Operator, hash, []string{statestore.AllNamespaces})+"\n")); err != nil {
			return err
		}
	}
	perms, _, err := a.brokerPermissions()
	if err != nil {
		return err
	}
	defs, err := rabbitDefinitions(pw, perms, *userPrefix, *adminUser)
	if err != nil {
		return err
	}
	if err := writeSecret(*dir, "rabbitmq-definitions.json", defs); err != nil {
		return err
	}
	// The default user, made on a node's first boot, is the
	// administrator too: never guest.
	conf := "# Written by sasctl secrets init: RabbitMQ loads its users and their rights at boot.\n" +
		"load_definitions = " + filepath.Join(*dir, "rabbitmq-definitions.json") + "\n" +
		"default_user = " + *adminUser + "\ndefault_pass = " + pw["rabbitmq"] + "\n"
	if err := writeSecret(*dir, "rabbitmq.conf", []byte(conf)); err != nil {
		return err
	}
	for _, name := range append(secretNames(), derivedNames()...) {
		id, ok := owners[name]
		if !ok {
			if id, ok = owners["*"]; !ok {
				continue
			}
		}
		if err := os.Chown(filepath.Join(*dir, name), id[0], id[1]); err != nil {
			return fmt.Errorf("--owner %s: %w (setting owners needs root)", name, err)
		}
	}
	kept := len(secretNames()) - len(created)
	if len(created) > 0 {
		fmt.Fprintf(a.stdout, "secrets in %s: made %s; kept %d\n", *dir, strings.Join(created, ", "), kept)
	} else {
		fmt.Fprintf(a.stdout, "secrets in %s: all %d kept\n", *dir, kept)
	}
	return nil
}

// secretsShow prints one secret: how an operator reads the console's or
// Grafana's admin password.
func (a *app) secretsShow(_ context.Context, args []string) error {
	fs := a.flags()
	dir := fs.String("dir", defaultSecretsDir, "the directory the secrets are in")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	// api-token is not made here: the compose file's api-token job writes
	// it (sasctl api token create --out).
	names := append(secretNames(), "api-token")
	if len(rest) != 1 || !slices.Contains(names, rest[0]) {
		return a.usageError(fs, "name one secret: %s", strings.Join(names, ", "))
	}
	v, err := readSecret(*dir, rest[0])
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, v)
	return nil
}

// newSecret is 24 random bytes in standard base64 (32 characters, + and
// / among them, as openssl rand -base64 gives): every setting takes a
// password apart from any URL, so no character needs encoding.
func newSecret() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func readSecret(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	v := strings.TrimSuffix(string(b), "\n")
	if v == "" {
		return "", fmt.Errorf("%s is empty: remove it to have a new one made", filepath.Join(dir, name))
	}
	return v, nil
}

// writeSecret writes a file whole to a new name, then renames it: a
// reader sees the old file or the new one, never part of one.
func writeSecret(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "."+name+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o440); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// rabbitDefinitions is a RabbitMQ definitions document: the vhost "/",
// the administrator and one user per service of broker.Permissions with
// those rights, each password as RabbitMQ's salted SHA-256 hash.
func rabbitDefinitions(pw map[string]string, services []broker.Permission, userPrefix, admin string) ([]byte, error) {
	type user struct {
		Name             string `json:"name"`
		PasswordHash     string `json:"password_hash"`
		HashingAlgorithm string `json:"hashing_algorithm"`
		Tags             string `json:"tags"`
	}
	type permission struct {
		User      string `json:"user"`
		Vhost     string `json:"vhost"`
		Configure string `json:"configure"`
		Write     string `json:"write"`
		Read      string `json:"read"`
	}
	hash := func(password string) (string, error) {
		salt := make([]byte, 4)
		if _, err := rand.Read(salt); err != nil {
			return "", err
		}
		sum := sha256.Sum256(append(slices.Clone(salt), password...))
		return base64.StdEncoding.EncodeToString(append(salt, sum[:]...)), nil
	}
	h, err := hash(pw["rabbitmq"])
	if err != nil {
		return nil, err
	}
	users := []user{{admin, h, "rabbit_password_hashing_sha256", "administrator"}}
	perms := []permission{{admin, "/", ".*", ".*", ".*"}}
	for _, p := range services {
		h, err := hash(pw["amqp-"+p.Service])
		if err != nil {
			return nil, err
		}
		users = append(users, user{userPrefix + p.Service, h, "rabbit_password_hashing_sha256", ""})
		perms = append(perms, permission{userPrefix + p.Service, "/", p.Configure, p.Write, p.Read})
	}
	return json.MarshalIndent(map[string]any{
		"vhosts":      []map[string]string{{"name": "/"}},
		"users":       users,
		"permissions": perms,
	}, "", "  ")
}
