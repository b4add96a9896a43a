// Command sasctl is sas's operator and developer tool: it migrates the
// state store, submits orders, and lists, shows and resubmits orders.
// Configuration comes from the same SAS_ environment variables as the
// services; see the README.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kelseyhightower/envconfig"

	"sas/internal/broker"
	"sas/internal/harness/bench"
	"sas/internal/secrets"
	"sas/internal/service"
)

// errUsage marks a mistake in the command line (exit status 2); errHelp
// a help that was asked for and printed (exit status 0).
var (
	errUsage = errors.New("usage")
	errHelp  = errors.New("help printed")
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := secrets.LoadPasswordFiles(); err != nil {
		fmt.Fprintln(os.Stderr, "sasctl: configuration:", strings.ReplaceAll(secrets.Scrub(err.Error()), "\n", "; "))
		os.Exit(2)
	}
	red := secrets.FromEnviron(os.Environ())
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, red)
	switch {
	case err == nil, errors.Is(err, errHelp):
	case errors.Is(err, errUsage):
		os.Exit(2)
	default:
		// One line: some drivers' errors span several.
		msg := strings.NewReplacer("\n\t", "; ", "\n", "; ").Replace(red.String(err.Error()))
		fmt.Fprintln(os.Stderr, "sasctl:", msg)
		os.Exit(1)
	}
}

// app is what every command gets.
type app struct {
	cfg    service.Common
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	logger *slog.Logger
	// cmd is the command running ("orders list"), for its help.
	cmd string
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, red *secrets.Redactor) error {
	if len(args) == 0 {
		printUsage(stderr)
		return errUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			return run(ctx, append(args[1:], "-h"), stdin, stdout, stderr, red)
		}
		printUsage(stdout)
		return errHelp
	case "--version", "-version":
		fmt.Fprintln(stdout, version())
		return nil
	}
	// The command: one word, or a group (a group may hold groups: console
	// user add) and one of its commands.
	path, rest := args[0], args[1:]
	for isGroup(path) {
		if len(rest) == 0 {
			printGroup(stderr, path)
			return errUsage
		}
		if wantsHelp(rest[:1]) {
			printGroup(stdout, path)
			return errHelp
		}
		path, rest = path+" "+rest[0], rest[1:]
	}
	if _, ok := docFor(path); !ok {
		fmt.Fprintf(stderr, "sasctl: unknown command %q\n\n", path)
		if group, _, ok := strings.Cut(path, " "); ok && isGroup(group) {
			printGroup(stderr, group)
		} else {
			printUsage(stderr)
		}
		return errUsage
	}

	// A command asked for its help prints it before it reads anything
	// (its flag set says its flags): the configuration need not be right.
	var cfg service.Common
	if !wantsHelp(rest) {
		if err := envconfig.Process("sas", &cfg); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		if err := cfg.Check(); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
	}
	logger, err := service.NewLogger(stderr, cmp.Or(cfg.LogLevel, "info"), red)
	if err != nil {
		return err
	}
	a := &app{cfg: cfg, stdin: stdin, stdout: stdout, stderr: stderr, logger: logger, cmd: path}
	switch path {
	case "migrate":
		return a.migrate(ctx, rest)
	case "submit":
		return a.submit(ctx, rest)
	case "orders list":
		return a.ordersList(ctx, rest)
	case "orders show":
		return a.ordersShow(ctx, rest)
	case "orders resubmit":
		return a.ordersResubmit(ctx, rest)
	case "orders cancel":
		return a.ordersCancel(ctx, rest)
	case "orders signal":
		return a.ordersSignal(ctx, rest)
	case "orders migrate":
		return a.ordersMigrate(ctx, rest)
	case "orders pause":
		return a.ordersPause(ctx, rest, true)
	case "orders resume":
		return a.ordersPause(ctx, rest, false)
	case "workflows pause":
		return a.workflowsPause(ctx, rest, true)
	case "workflows resume":
		return a.workflowsPause(ctx, rest, false)
	case "limits pause":
		return a.limitsPause(ctx, rest, true)
	case "limits resume":
		return a.limitsPause(ctx, rest, false)
	case "pauses list":
		return a.pausesList(ctx, rest)
	case "steps complete", "steps fail", "steps heartbeat":
		return a.stepsCallback(ctx, strings.TrimPrefix(path, "steps "), rest)
	case "webhooks list":
		return a.webhooksList(ctx, rest)
	case "webhooks replay":
		return a.webhooksReplay(ctx, rest)
	case "orders purge":
		return a.ordersPurge(ctx, rest)
	case "alerts list":
		return a.alertsList(ctx, rest)
	case "alerts ack":
		return a.alertsAck(ctx, rest)
	case "api token create":
		return a.apiTokenCreate(ctx, rest)
	case "api token list":
		return a.apiTokenList(ctx, rest)
	case "namespaces add":
		return a.namespacesAdd(ctx, rest)
	case "namespaces list":
		return a.namespacesList(ctx, rest)
	case "namespaces quota":
		return a.namespacesQuota(ctx, rest)
	case "api token revoke":
		return a.apiTokenRevoke(ctx, rest)
	case "limits list":
		return a.limitsList(ctx, rest)
	case "limits set":
		return a.limitsSet(ctx, rest)
	case "limits reset":
		return a.limitsReset(ctx, rest)
	case "partitions show":
		return a.partitionsShow(ctx, rest)
	case "partitions setup":
		return a.partitionsSetup(ctx, rest)
	case "partitions of":
		return a.partitionsOf(ctx, rest)
	case "partitions add":
		return a.partitionsAdd(ctx, rest)
	case "partitions move":
		return a.partitionsMove(ctx, rest)
	case "partitions moves":
		return a.partitionsMoves(ctx, rest)
	case "partitions compose":
		return a.partitionsCompose(ctx, rest)
	case "schedules list":
		return a.schedulesList(ctx, rest)
	case "schedules pause":
		return a.schedulesPause(ctx, rest, true)
	case "schedules resume":
		return a.schedulesPause(ctx, rest, false)
	case "schedules trigger":
		return a.schedulesTrigger(ctx, rest)
	case "alerts tail":
		return a.alertsTail(ctx, rest)
	case "dlq list":
		return a.dlqList(ctx, rest)
	case "dlq show":
		return a.dlqShow(ctx, rest)
	case "dlq requeue":
		return a.dlqMove(ctx, rest, broker.Requeue)
	case "dlq discard":
		return a.dlqMove(ctx, rest, broker.Drop)
	case "agent check":
		return a.agentCheck(ctx, rest)
	case "workflows check":
		return a.workflowsCheck(ctx, rest)
	case "workflows list":
		return a.workflowsList(ctx, rest)
	case "workflows test":
		return a.workflowsTest(ctx, rest)
	case "dev":
		return a.dev(ctx, rest)
	case "bench":
		err := bench.Main(ctx, bench.NewTool(a.cfg, a.logger, a.stdout, a.stderr, a.flags, a.parseNoArgs), rest)
		if errors.Is(err, bench.ErrUsage) {
			return errUsage
		}
		return err
	case "probe":
		return a.probe(ctx, rest)
	case "broker users":
		return a.brokerUsers(ctx, rest)
	case "db users":
		return a.dbUsers(ctx, rest)
	case "console user add":
		return a.consoleUserAdd(ctx, rest)
	case "secrets init":
		return a.secretsInit(ctx, rest)
	case "secrets show":
		return a.secretsShow(ctx, rest)
	case "version":
		if err := a.parseNoArgs(a.flags(), rest); err != nil {
			return err
		}
		fmt.Fprintln(stdout, version())
		return nil
	}
	return fmt.Errorf("command %q has no implementation", path)
}

// wantsHelp reports whether args ask for help (before any "--").
func wantsHelp(args []string) bool {
	for _, arg := range args {
		switch arg {
		case "--":
			return false
		case "-h", "-help", "--help", "help":
			return true
		}
	}
	return false
}

// flags returns the running command's flag set; a mistake in its flags
// prints the command's usage line on stderr.
func (a *app) flags() *flag.FlagSet {
	fs := flag.NewFlagSet("sasctl "+a.cmd, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		d, _ := docFor(a.cmd)
		fmt.Fprintf(a.stderr, "usage: sasctl %s %s\n(sasctl %s -h for help)\n", d.path, d.args, d.path)
	}
	return fs
}

// parse parses args with fs, flags before or after the positional
// arguments ("show ID --json" as well as "show --json ID"), and returns
// the positional ones. -h, -help or --help anywhere prints the command's
// full help on stdout (errHelp).
func (a *app) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	if wantsHelp(args) {
		d, _ := docFor(a.cmd)
		printHelp(a.stdout, d, fs)
		return nil, errHelp
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// parseNoArgs is parse for a command that takes flags only.
func (a *app) parseNoArgs(fs *flag.FlagSet, args []string) error {
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return a.usageError(fs, "unexpected argument %q", rest[0])
	}
	return nil
}

// usageError prints msg and the command's usage line on stderr and
// returns errUsage.
func (a *app) usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(a.stderr, "sasctl %s: %s\n", a.cmd, fmt.Sprintf(format, args...))
	fs.Usage()
	return errUsage
}
