package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/kelseyhightower/envconfig"

	"sas/internal/archive"
	"sas/internal/messages"
	"sas/internal/orderfilter"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// store opens the state store for a command: it fails at once with one
// line naming the setting to fix when the database cannot be reached
// within service.DatabaseWait, refuses the login, or has no sas schema.
func (a *app) store(ctx context.Context) (*statestore.Store, func(), error) {
	pool, err := a.pool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	store := statestore.New(pool)
	checkCtx, cancel := context.WithTimeout(ctx, service.DatabaseWait)
	defer cancel()
	if err := store.CheckSchema(checkCtx); err != nil {
		pool.Close()
		if statestore.IsMissingSchema(err) {
			return nil, nil, fmt.Errorf("the database has no sas tables in its search_path (SAS_DATABASE_URL): run `sasctl migrate` first (%w)", err)
		}
		return nil, nil, err
	}
	return store, pool.Close, nil
}

// pool opens a pool of n connections and checks the database answers.
// Its statements wait at most SAS_DB_LOCK_TIMEOUT for a row lock.
func (a *app) pool(ctx context.Context, n int32) (*pgxpool.Pool, error) {
	return a.poolWith(ctx, a.cfg.Database(n))
}

// poolWith is pool with options of the caller's.
func (a *app) poolWith(ctx context.Context, o statestore.Options) (*pgxpool.Pool, error) {
	return service.ToolPool(ctx, o)
}

// orderID takes the one positional argument, an order id.
func (a *app) orderID(fs *flag.FlagSet, rest []string) (string, error) {
	if len(rest) != 1 {
		return "", a.usageError(fs, "give one order id")
	}
	id, ok := messages.CanonicalID(rest[0])
	if !ok {
		return "", fmt.Errorf("%q is not an order id (a UUID)", rest[0])
	}
	return id, nil
}

// positive checks a count flag.
func (a *app) positive(fs *flag.FlagSet, name string, n int) error {
	if n <= 0 {
		return a.usageError(fs, "--%s must be at least 1, not %d", name, n)
	}
	return nil
}

// knownWorkflow refuses a workflow name that is not defined.
func (a *app) ordersList(ctx context.Context, args []string) error {
	fs := a.flags()
	status := fs.String("status", "", "only orders with this status (received, processing, completed, compensating, failed, error)")
	wf := fs.String("workflow", "", "only orders of this workflow")
	since := fs.Duration("since", 0, "only orders created within this long, e.g. 1h")
	limit := fs.Int("limit", 50, "at most this many orders")
	asJSON := fs.Bool("json", false, "print JSON")
	var where stringList
	fs.Var(&where, "where", "only orders whose search attribute matches, NAME=VALUE (or !=, <, <=, >, >=); repeat for several")
	workflows := fs.String("workflows", "", "the workflows file that declares the search attributes (default: SAS_WORKFLOWS_FILE, else the built-in one)")
	namespace := namespaceFlag(fs)
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := a.positive(fs, "limit", *limit); err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	if *since < 0 {
		return a.usageError(fs, "--since must not be negative")
	}
	if *wf != "" {
		// Any name: orders may run workflows of another file than this
		// one's (the rule orderfilter applies, named for the flag).
		if err := messages.CheckName("--workflow", *wf); err != nil {
			return err
		}
	}
	// The filter is read as the API and the console read it, with the
	// same words for what is wrong (orderfilter).
	f := orderfilter.Filter{Status: *status, Workflow: *wf, Where: where, Namespaces: namespaces}
	reg, err := workflowsFile(*workflows)
	if err != nil {
		return err
	}
	if _, err := f.Query(reg); err != nil {
		return err
	}
	// Every partition's newest page (one store's alone, unpartitioned),
	// merged newest first: no partition is read past the limit.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	pages := make([][]statestore.Order, len(stores))
	partitionOf := map[string]string{}
	for i, ps := range stores {
		if len(where) == 0 && *namespace == "" {
			pages[i], err = ps.store.ListOrders(ctx, statestore.ListFilter{Status: *status, Workflow: *wf, Since: *since, Limit: *limit})
		} else {
			pages[i], err = a.ordersWhere(ctx, ps.store, reg, f, *since, *limit)
		}
		if err != nil {
			if ps.name != "" {
				return fmt.Errorf("partition %s: %w", ps.name, err)
			}
			return err
		}
		for _, o := range pages[i] {
			partitionOf[o.OrderID] = ps.name
		}
	}
	orders := newestFirst(pages, *limit)
	if *asJSON {
		return a.printJSON(orders)
	}
	partitioned := stores[0].name != ""
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	header := "ORDER_ID\tSTATUS\tWORKFLOW\tPRIO\tCREATED\tUPDATED"
	if partitioned {
		header += "\tPARTITION"
	}
	fmt.Fprintln(tw, header)
	for _, o := range orders {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s", o.OrderID, o.Status, o.Workflow, o.Priority,
			clock(o.CreatedAt), clock(o.UpdatedAt))
		if partitioned {
			fmt.Fprintf(tw, "\t%s", partitionOf[o.OrderID])
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// ordersWhere lists orders by search attributes: a page of the store's
// keyset list, newest first, as the API and the console read it.
func (a *app) ordersWhere(ctx context.Context, store *statestore.Store, reg *workflow.Registry, f orderfilter.Filter, since time.Duration, limit int) ([]statestore.Order, error) {
	q, err := f.Query(reg)
	if err != nil {
		return nil, err
	}
	if since > 0 {
		now, err := store.Now(ctx) // the database clock, as --since means without --where
		if err != nil {
			return nil, err
		}
		q.From = now.Add(-since)
	}
	q.Limit = min(limit, 500)
	rows, _, err := store.OrderPage(ctx, q)
	if err != nil {
		return nil, err
	}
	ns := ""
	if len(f.Namespaces) == 1 {
		ns = f.Namespaces[0]
	}
	out := make([]statestore.Order, len(rows))
	for i, r := range rows {
		out[i] = statestore.Order{OrderID: r.OrderID, Workflow: r.Workflow, WorkflowVersion: r.WorkflowVersion, Status: r.Status,
			Priority: r.Priority, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, Namespace: ns}
	}
	return out, nil
}

// stringList is a flag that may be given several times.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ", ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// onOrder is the frame of a command on one order: parse the flags (with
// --namespace) and the order id, open the store, and run do when the
// order is in the namespace asked for.
func (a *app) onOrder(ctx context.Context, fs *flag.FlagSet, args []string, do func(*statestore.Store, string) error) error {
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	id, err := a.orderID(fs, rest)
	if err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	store, closeStore, err := a.storeOf(ctx, id)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := orderIn(ctx, store, id, namespaces); err != nil {
		return err
	}
	return do(store, id)
}

func (a *app) ordersShow(ctx context.Context, args []string) error {
	fs := a.flags()
	asJSON := fs.Bool("json", false, "print everything as JSON")
	archived := fs.Bool("archived", false, "read the order's record from the archive (SAS_ARCHIVE): an order retention deleted")
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	id, err := a.orderID(fs, rest)
	if err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	if *archived {
		if namespaces != nil {
			return a.usageError(fs, "--archived reads the archive, which keeps no namespace: leave out --namespace")
		}
		return a.showArchived(ctx, id, *asJSON)
	}
	store, closeStore, err := a.storeOf(ctx, id)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := orderIn(ctx, store, id, namespaces); err != nil {
		return err
	}
	d, err := store.GetOrder(ctx, id)
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(d)
	}
	return a.printOrder(d)
}

// showArchived prints an order's record from the archive.
func (a *app) showArchived(ctx context.Context, id string, asJSON bool) error {
	var c archive.Config
	if err := envconfig.Process("sas", &c); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	arch, err := archive.Open(c)
	if err != nil {
		return err
	}
	if arch == nil {
		return fmt.Errorf("no archive: set SAS_ARCHIVE as the supervisor's (a directory or s3://bucket/prefix)")
	}
	doc, err := arch.Get(ctx, id)
	if errors.Is(err, archive.ErrNotArchived) {
		return fmt.Errorf("order %s is not in the archive (%s): it has not ended and passed SAS_RETENTION yet, or never existed", id, arch)
	}
	if err != nil {
		return err
	}
	if asJSON {
		_, err := a.stdout.Write(append(doc, '\n'))
		return err
	}
	var d statestore.ArchivedOrder
	if err := json.Unmarshal(doc, &d); err != nil {
		return fmt.Errorf("order %s's archived record cannot be read: %w", id, err)
	}
	fmt.Fprintf(a.stdout, "%-10s%s (%s)\n", "archived", stamp(d.ArchivedAt), arch)
	if err := a.printOrder(d.OrderDetail); err != nil {
		return err
	}
	if len(d.Alerts) > 0 {
		fmt.Fprint(a.stdout, "\nalerts\n")
		for _, al := range d.Alerts {
			fmt.Fprintf(a.stdout, "%s  %s\n", stamp(al.RaisedAt), wrap(al.Reason, showWidth, "  "))
		}
	}
	return nil
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// showWidth is the width orders show keeps within; longer text wraps.
const showWidth = 100

// printOrder prints an order with its steps and history in showWidth
// columns: each step and each history entry has a line of short fields,
// and its long ones (deadlines, errors, actor and reason) on lines of
// their own below it, wrapped.
func (a *app) printOrder(d statestore.OrderDetail) error {
	o := d.Order
	w := a.stdout
	field := func(name, value string) {
		fmt.Fprintf(w, "%-10s%s\n", name, wrap(value, showWidth, strings.Repeat(" ", 10)))
	}
	field("order", o.OrderID)
	if o.Namespace != "" && o.Namespace != statestore.DefaultNamespace {
		field("namespace", o.Namespace)
	}
	field("status", o.Status)
	version := o.WorkflowVersion
	if version == "" {
		version = "from before versions were kept"
	}
	field("workflow", fmt.Sprintf("%s version %s (priority %d)", o.Workflow, version, o.Priority))
	field("payload", string(o.Payload))
	if o.ReplyTo != "" {
		field("reply_to", o.ReplyTo)
	}
	field("created", stamp(o.CreatedAt))
	field("updated", stamp(o.UpdatedAt))
	if o.TraceID != "" {
		field("trace_id", o.TraceID)
	}
	if dl := d.Deadline; dl != nil {
		field("deadline", dl.Describe())
	}
	if p := d.Paused; p != nil {
		with := ""
		if p.Scope == "workflow" {
			with = " (with its workflow)"
		}
		field("paused", fmt.Sprintf("since %s by %s%s%s; nothing new of it is claimed until sasctl orders resume", stamp(p.Since), p.By, with,
			map[bool]string{true: "", false: ": " + p.Reason}[p.Reason == ""]))
	}
	if p := d.Parent; p != nil {
		field("parent", fmt.Sprintf("%s (workflow %s, %s): its step %d started this order", p.OrderID, p.Workflow, p.Status, p.Step))
	}
	for i, c := range d.Children {
		name := "children"
		if i > 0 {
			name = ""
		}
		field(name, fmt.Sprintf("%s (workflow %s, %s), started by step %d", c.OrderID, c.Workflow, c.Status, c.Step))
	}

	fmt.Fprint(w, "\nsteps\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	graph := slices.ContainsFunc(d.Steps, func(s statestore.Step) bool { return s.Needs != nil })
	if graph {
		fmt.Fprintln(tw, "STEP\tNAME\tKIND\tBY\tSTATE\tATTEMPT\tFAILURES\tRUNS AFTER")
	} else {
		fmt.Fprintln(tw, "STEP\tNAME\tKIND\tBY\tSTATE\tATTEMPT\tFAILURES")
	}
	shown := d.ShownStates()
	for _, s := range d.Steps {
		// A live step's failures are its current round's, against its
		// limit; an ended one's, every failure its history holds
		// (a resubmit starts a new round at 0).
		failures := fmt.Sprintf("%d/%d", s.FailureCount, s.MaxFailures)
		if !live(s) {
			failures = strconv.Itoa(failuresOf(s.Step, d.History))
		}
		name := s.Name
		if s.Index != nil {
			name = fmt.Sprintf("%s[%d]", s.Name, *s.Index)
		}
		if !graph {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", s.Step, clip(name, 24), s.Sort(), clip(cmp.Or(s.By(), "–"), 24), shown[s.Step],
				s.Attempt, failures)
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", s.Step, clip(name, 24), s.Sort(), clip(cmp.Or(s.By(), "–"), 24), shown[s.Step],
			s.Attempt, failures, runsAfter(s))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	const indent = "      "
	for _, s := range d.Steps {
		var notes []string
		if s.LockedBy != "" && s.ProcessState == statestore.StepProcessing {
			notes = append(notes, "locked by "+s.LockedBy)
		}
		if s.DueAt != nil {
			notes = append(notes, "due "+stamp(*s.DueAt))
		}
		if s.CompleteBy != nil {
			notes = append(notes, "complete by "+stamp(*s.CompleteBy))
		}
		if s.ProcessState == statestore.StepPending {
			notes = append(notes, "available at "+stamp(s.AvailableAt))
		}
		if s.LastError != "" {
			notes = append(notes, "last error: "+s.LastError)
		}
		if s.LastAnswer != "" {
			notes = append(notes, "the service's last answer: "+s.LastAnswer)
		}
		if len(s.Result) > 0 && string(s.Result) != "null" {
			notes = append(notes, "result: "+string(s.Result))
		}
		for i, n := range notes {
			prefix := indent
			if i == 0 {
				prefix = fmt.Sprintf("%-6s", fmt.Sprintf("%d:", s.Step))
			}
			fmt.Fprintf(w, "%s%s\n", prefix, wrap(n, showWidth, indent))
		}
	}

	fmt.Fprint(w, "\nhistory\n")
	for _, h := range d.History {
		step := "order"
		if h.Step != nil {
			step = "step " + strconv.Itoa(*h.Step)
		}
		line := fmt.Sprintf("%s  %-8s %s -> %s", stamp(h.At), step, dash(h.From), h.To)
		if h.Attempt > 0 {
			line += fmt.Sprintf("  attempt %d", h.Attempt)
		}
		fmt.Fprintln(w, clip(line, showWidth))
		by := "by " + h.Actor
		if h.DBUser != "" {
			by += " (database login " + h.DBUser
			if h.ClaimedBy != "" {
				by += ", who gave the name " + strconv.Quote(h.ClaimedBy)
			}
			by += ")"
		}
		if h.Reason != "" {
			by += ": " + h.Reason
		}
		fmt.Fprintf(w, "%s%s\n", indent, wrap(by, showWidth, indent))
	}
	return nil
}

// claimedName is who the operator says they are: --as, else $USER.
func claimedName(as string) string {
	if as != "" {
		return as
	}
	for _, k := range []string{"SUDO_USER", "USER", "LOGNAME"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return ""
}

func (a *app) ordersResubmit(ctx context.Context, args []string) error {
	fs := a.flags()
	step := fs.Int("step", 0, "the step to resubmit (default: the step in error)")
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	return a.onOrder(ctx, fs, args, func(store *statestore.Store, id string) error {
		if *step < 0 {
			return a.usageError(fs, "--step must be a step number")
		}
		reset, err := store.Resubmit(ctx, id, *step, claimedName(*as))
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "order %s: step(s) %v back to work\n", id, reset)
		return nil
	})
}

func (a *app) ordersCancel(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	return a.onOrder(ctx, fs, args, func(store *statestore.Store, id string) error {
		status, err := store.CancelOrder(ctx, id, claimedName(*as))
		if err != nil {
			return err
		}
		if status == statestore.OrderFailed {
			fmt.Fprintf(a.stdout, "order %s: cancelled; nothing had been done, so it is failed\n", id)
		} else {
			fmt.Fprintf(a.stdout, "order %s: cancelled; undoing what was done (%s), it ends failed\n", id, status)
		}
		return nil
	})
}

func (a *app) ordersPurge(ctx context.Context, args []string) error {
	fs := a.flags()
	olderThan := fs.Duration("older-than", 0, "delete orders that ended more than this long ago, e.g. 720h (required)")
	status := fs.String("status", "", "only orders with this status: completed or failed (default: both)")
	batch := fs.Int("batch", 500, "orders deleted per transaction")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *olderThan <= 0 {
		return a.usageError(fs, "--older-than is required and must be positive")
	}
	if err := a.positive(fs, "batch", *batch); err != nil {
		return err
	}
	var statuses []string
	switch *status {
	case "":
	case statestore.OrderCompleted, statestore.OrderFailed:
		statuses = []string{*status}
	default:
		return fmt.Errorf("--status %q: only orders that ended, completed or failed, are purged (an order in error waits for an operator)", *status)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if !*yes {
		n, err := store.CountEnded(ctx, *olderThan, statuses)
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintf(a.stdout, "no order ended more than %v ago: nothing to delete\n", *olderThan)
			return nil
		}
		fmt.Fprintf(a.stderr, "delete %d orders that ended more than %v ago, with their steps, history and alerts, for good? [y/N] ", n, *olderThan)
		answer, _ := bufio.NewReader(a.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			return fmt.Errorf("nothing deleted")
		}
	}
	// With an archive, as retention does: each order is archived first,
	// and deleted once the archive confirmed it.
	var ac archive.Config
	if err := envconfig.Process("sas", &ac); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	arch, err := archive.Open(ac)
	if err != nil {
		return err
	}
	var total statestore.Purged
	for {
		var p statestore.Purged
		var err error
		n := 0
		if arch != nil {
			p, n, err = archive.Retain(ctx, store, arch, *olderThan, statuses, *batch)
		} else {
			p, err = store.PurgeEnded(ctx, *olderThan, statuses, *batch)
			n = int(p.Orders)
		}
		total.Add(p)
		if err != nil {
			return fmt.Errorf("%w (deleted so far: %d orders)", err, total.Orders)
		}
		if n < *batch {
			break
		}
	}
	fmt.Fprintf(a.stdout, "deleted %d orders that ended more than %v ago, with %d steps, %d history entries and %d alerts\n",
		total.Orders, *olderThan, total.Steps, total.Transitions, total.Alerts)
	return nil
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// clock is a shorter stamp, for tables.
func clock(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// clip shortens s to n runes, marking the cut.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// live: a step still at work (pending or processing).
func live(s statestore.Step) bool {
	return s.ProcessState == statestore.StepPending || s.ProcessState == statestore.StepProcessing
}

// failuresOf counts a step's failures in an order's history: each expiry
// the supervisor reset and each failure for good, across resubmits.
func failuresOf(step int, history []statestore.Transition) int {
	n := 0
	for _, t := range history {
		if t.Step != nil && *t.Step == step && t.From == statestore.StepProcessing &&
			(t.To == statestore.StepPending || t.To == statestore.StepError) {
			n++
		}
	}
	return n
}

// migrateAndOpen applies the migrations and returns a store on a small
// pool the caller closes.
func (a *app) migrateAndOpen(ctx context.Context) (*statestore.Store, func(), error) {
	return service.MigrateAndOpen(ctx, a.cfg)
}

// runsAfter says, for a step of a graph, what it waits for: the steps it
// needs (a join needs more than one; an N-of-M join any N of them), or,
// for an instance of a for_each step, that step.
func runsAfter(s statestore.Step) string {
	if s.Parent > 0 {
		return fmt.Sprintf("instance %d of step %d", *s.Index, s.Parent)
	}
	if len(s.Needs) == 0 {
		return "-"
	}
	parts := make([]string, len(s.Needs))
	for i, n := range s.Needs {
		parts[i] = strconv.Itoa(n)
	}
	what := "step "
	switch {
	case s.Quorum() != "":
		what = s.Quorum() + " of steps "
	case len(s.Needs) > 1:
		what = "join of steps "
	}
	return what + strings.Join(parts, ", ")
}
