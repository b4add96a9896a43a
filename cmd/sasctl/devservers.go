package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// devServers are a PostgreSQL cluster and a RabbitMQ node of sasctl dev's
// own, started as the current user in a folder of their own when the
// ones the settings name (on this machine) do not answer: a user who is
// not root, or whose servers are installed but stopped, runs the whole
// system all the same. Stop stops them and removes the folder.
type devServers struct {
	dir   string
	procs []*exec.Cmd // each in a process group of its own, stopped last first
	// DatabaseURL and AMQPURL reach them ("": that one was up already).
	DatabaseURL, AMQPURL string
	log                  io.Writer
}

// serverBins finds the servers' programs: PostgreSQL's folder of initdb
// and postgres, rabbitmq-server and epmd ("": not installed).
type serverBins func() (pgBin, rabbit, epmd string)

// installedBins finds them on this machine.
func installedBins() (pgBin, rabbit, epmd string) {
	rabbit, epmd = rabbitBin()
	return postgresBin(), rabbit, epmd
}

// devServersUp starts what is not up of the database and the broker a
// dev run uses, when the settings name this machine, with the programs
// bins finds; it says what it did on log. A nil result: both were up.
func devServersUp(ctx context.Context, dbURL, amqpURL string, bins serverBins, log io.Writer) (_ *devServers, err error) {
	dbAddr, err := urlAddr(dbURL, "5432")
	if err != nil {
		return nil, fmt.Errorf("SAS_DATABASE_URL: %w", err)
	}
	mqAddr, err := urlAddr(amqpURL, "5672")
	if err != nil {
		return nil, fmt.Errorf("SAS_AMQP_URL: %w", err)
	}
	needPG, needMQ := !answers(dbAddr), !answers(mqAddr)
	if !needPG && !needMQ {
		return nil, nil
	}
	for _, x := range []struct {
		need       bool
		addr, what string
	}{{needPG, dbAddr, "PostgreSQL at " + dbAddr + " (SAS_DATABASE_URL)"}, {needMQ, mqAddr, "RabbitMQ at " + mqAddr + " (SAS_AMQP_URL)"}} {
		if x.need && !loopback(x.addr) {
			return nil, fmt.Errorf("%s does not answer; sasctl dev starts its own servers only in place of ones on this machine", x.what)
		}
	}
	pgBin, rabbit, epmd := bins()
	var missing []string
	if needPG && pgBin == "" {
		missing = append(missing, "PostgreSQL (initdb and postgres: the Debian package postgresql)")
	}
	if needMQ {
		if rabbit == "" || epmd == "" {
			missing = append(missing, "RabbitMQ (rabbitmq-server and Erlang's epmd: the Debian package rabbitmq-server)")
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no server answers where SAS_DATABASE_URL or SAS_AMQP_URL point (%s, %s), and sasctl dev cannot start its own: install %s (or point those settings at running servers; as root, make demo installs and starts them)",
			dbAddr, mqAddr, strings.Join(missing, " and "))
	}
	dir, err := os.MkdirTemp("", "sas-dev-servers-")
	if err != nil {
		return nil, err
	}
	s := &devServers{dir: dir, log: log}
	defer func() {
		if err != nil {
			s.Stop(false)
		}
	}()
	if needPG {
		if err := s.startPostgres(ctx, pgBin); err != nil {
			return nil, fmt.Errorf("start a PostgreSQL of its own (its log: %s): %w", filepath.Join(dir, "postgres.log"), err)
		}
	}
	if needMQ {
		if err := s.startRabbit(ctx, rabbit, epmd); err != nil {
			return nil, fmt.Errorf("start a RabbitMQ node of its own (its log: %s): %w", filepath.Join(dir, "rabbitmq.log"), err)
		}
	}
	return s, nil
}

// Env are the settings that reach the servers started.
func (s *devServers) Env() []string {
	var env []string
	if s.DatabaseURL != "" {
		env = append(env, "SAS_DATABASE_URL="+s.DatabaseURL)
	}
	if s.AMQPURL != "" {
		env = append(env, "SAS_AMQP_URL="+s.AMQPURL)
	}
	return env
}

func (s *devServers) startPostgres(ctx context.Context, bin string) error {
	data := filepath.Join(s.dir, "postgres")
	// PostgreSQL refuses to run as root: as root, it runs as the
	// postgres user the package made.
	cred, err := postgresCredential()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(s.dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	fmt.Fprintf(s.log, "no PostgreSQL answers: starting one of its own on 127.0.0.1:%d (data in %s)\n", port, data)
	logFile, err := os.Create(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port), "-k", s.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "max_connections=200")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: cred}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.procs = append(s.procs, cmd)
	admin := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := waitFor(ctx, 60*time.Second, func() error {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE DATABASE sas`)
		return err
	}); err != nil {
		return err
	}
	s.DatabaseURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/sas?sslmode=disable", port)
	return nil
}

func (s *devServers) startRabbit(ctx context.Context, server, epmd string) error {
	base := filepath.Join(s.dir, "rabbitmq")
	for _, d := range []string{"mnesia", "log"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o700); err != nil {
			return err
		}
	}
	files := map[string]string{"enabled_plugins": "[rabbitmq_consistent_hash_exchange].\n", "node.conf": "loopback_users.guest = true\n"}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(base, name), []byte(text), 0o600); err != nil {
			return err
		}
	}
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		if slices.Contains(ports[:i], p) {
			return errors.New("no three free ports")
		}
		ports[i] = p
	}
	amqpPort, distPort, epmdPort := ports[0], ports[1], ports[2]
	fmt.Fprintf(s.log, "no RabbitMQ answers: starting a node of its own on 127.0.0.1:%d (data in %s)\n", amqpPort, base)
	env := append(os.Environ(), "HOME="+base, "ERL_EPMD_PORT="+strconv.Itoa(epmdPort),
		"RABBITMQ_NODENAME=sas-dev-"+strconv.Itoa(amqpPort)+"@localhost", "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort), "RABBITMQ_DIST_PORT="+strconv.Itoa(distPort),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(base, "mnesia"), "RABBITMQ_LOG_BASE="+filepath.Join(base, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(base, "node.pid"), "RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(base, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(base, "node"))
	// The node's own port mapper, on a port of its own: the machine's
	// (if any) is left alone, and this one is stopped with the node.
	pm := exec.Command(epmd, "-port", strconv.Itoa(epmdPort), "-address", "127.0.0.1")
	pm.Env = env
	pm.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := pm.Start(); err != nil {
		return fmt.Errorf("epmd: %w", err)
	}
	s.procs = append(s.procs, pm)
	logFile, err := os.Create(filepath.Join(s.dir, "rabbitmq.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(server)
	cmd.Env, cmd.Dir = env, base
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.procs = append(s.procs, cmd)
	mqURL := fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", amqpPort)
	if err := waitFor(ctx, 90*time.Second, func() error {
		conn, err := amqp.Dial(mqURL)
		if err != nil {
			return err
		}
		return conn.Close()
	}); err != nil {
		return err
	}
	s.AMQPURL = mqURL
	return nil
}

// Stop stops the servers (each process group, the node before its port
// mapper) and removes their folder, unless keep.
func (s *devServers) Stop(keep bool) {
	if s == nil {
		return
	}
	for _, cmd := range slices.Backward(s.procs) {
		// SIGINT: PostgreSQL's fast shutdown; the node stops on either.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		done := make(chan struct{})
		go func() {
			_ = cmd.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		// What the group left behind (the node's helpers).
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if keep {
		fmt.Fprintf(s.log, "the servers' data kept in %s\n", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

// urlAddr is the host:port a URL names (def: the scheme's port).
func urlAddr(raw, def string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("not a URL")
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "localhost"
	}
	if port == "" {
		port = def
	}
	return net.JoinHostPort(host, port), nil
}

func answers(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func loopback(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// postgresBin is the folder of initdb and postgres: on the PATH, else the
// newest Debian install's ("": none).
func postgresBin() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "postgres")); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

// rabbitBin finds rabbitmq-server (the package's own script, which any
// user may run, before the wrapper on the PATH that insists on root) and
// epmd.
func rabbitBin() (server, epmd string) {
	for _, p := range []string{"/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/local/lib/rabbitmq/bin/rabbitmq-server"} {
		if _, err := os.Stat(p); err == nil {
			server = p
			break
		}
	}
	if server == "" {
		server, _ = exec.LookPath("rabbitmq-server")
	}
	epmd, _ = exec.LookPath("epmd")
	if epmd == "" {
		if m, _ := filepath.Glob("/usr/lib/erlang/erts-*/bin/epmd"); len(m) > 0 {
			epmd = m[len(m)-1]
		}
	}
	return server, epmd
}

// postgresCredential is who runs PostgreSQL: nil (the current user)
// unless that is root, then the postgres user.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("PostgreSQL does not run as root, and there is no postgres user to run it as: run sasctl dev as another user")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// freePort returns a loopback port free now for a server of sasctl dev's
// own, from 10,000 to 19,999: below Linux's ephemeral range (32768 and
// up), from which every outgoing connection takes its local port, so that
// none takes it between this pick and the server's listen (the kernel's
// own pick, port 0, would come from that range).
func freePort() (int, error) {
	for range 1000 {
		port := 10000 + rand.IntN(10000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // another process's
		}
		l.Close()
		return port, nil
	}
	return 0, errors.New("no free port from 10000 to 19999 on 127.0.0.1")
}

// waitFor calls try until it succeeds or within passes, at most twice a
// second.
func waitFor(ctx context.Context, within time.Duration, try func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := try()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not up within %s: %w", within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
