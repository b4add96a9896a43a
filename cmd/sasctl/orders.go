package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/messages"
	"sas/internal/statestore"
)

func (a *app) orders(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return errUsage
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	switch sub, rest := args[0], args[1:]; sub {
	case "list":
		return a.ordersList(ctx, rest)
	case "show":
		return a.ordersShow(ctx, rest)
	case "resubmit":
		return a.ordersResubmit(ctx, rest)
	case "cancel":
		return a.ordersCancel(ctx, rest)
	default:
		fmt.Fprintf(a.stderr, "sasctl orders: unknown command %q\n\n%s", sub, usage)
		return errUsage
	}
}

// store opens the state store for a command: it fails at once with one
// line naming the setting to fix when the database cannot be reached
// within databaseWait, refuses the login, or has no sas schema.
func (a *app) store(ctx context.Context) (*statestore.Store, func(), error) {
	pool, err := a.pool(ctx, 2)
	if err != nil {
		return nil, nil, err
	}
	store := statestore.New(pool)
	checkCtx, cancel := context.WithTimeout(ctx, databaseWait)
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
	pool, err := statestore.Open(o)
	if err != nil {
		return nil, fmt.Errorf("SAS_DATABASE_URL: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, databaseWait)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if statestore.IsAuthFailure(err) {
			return nil, fmt.Errorf("the database refused the login (check the user and password in SAS_DATABASE_URL, SAS_DATABASE_PASSWORD): %w", err)
		}
		return nil, fmt.Errorf("cannot reach the database within %v (SAS_DATABASE_URL): %w", databaseWait, err)
	}
	return pool, nil
}

// orderID takes the one positional argument, an order id.
func (a *app) orderID(name string, fsArgs []string) (string, error) {
	if len(fsArgs) != 1 {
		fmt.Fprintf(a.stderr, "sasctl orders %s: give one order id\n", name)
		return "", errUsage
	}
	id, ok := messages.CanonicalID(fsArgs[0])
	if !ok {
		return "", fmt.Errorf("%q is not an order id (a UUID)", fsArgs[0])
	}
	return id, nil
}

// parseWithID parses flags that may stand before or after the one order
// id ("show ID --json" as well as "show --json ID") and returns the id.
func (a *app) parseWithID(fs *flag.FlagSet, name string, args []string) (string, error) {
	if err := a.parse(fs, args); err != nil {
		return "", err
	}
	rest := fs.Args()
	if len(rest) > 1 {
		id := rest[0]
		if err := a.parse(fs, rest[1:]); err != nil {
			return "", err
		}
		rest = append([]string{id}, fs.Args()...)
	}
	return a.orderID(name, rest)
}

func (a *app) ordersList(ctx context.Context, args []string) error {
	fs := a.flags("orders list")
	status := fs.String("status", "", "only orders with this status (received, processing, completed, compensating, failed, error)")
	wf := fs.String("workflow", "", "only orders of this workflow")
	since := fs.Duration("since", 0, "only orders created within this long, e.g. 1h")
	limit := fs.Int("limit", 50, "at most this many orders")
	if err := a.parse(fs, args); err != nil {
		return err
	}
	switch *status {
	case "", statestore.OrderReceived, statestore.OrderProcessing, statestore.OrderCompleted,
		statestore.OrderCompensating, statestore.OrderFailed, statestore.OrderError:
	default:
		return fmt.Errorf("unknown status %q", *status)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	orders, err := store.ListOrders(ctx, statestore.ListFilter{Status: *status, Workflow: *wf, Since: *since, Limit: *limit})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER_ID\tSTATUS\tWORKFLOW\tPRIO\tCUSTOMER\tAMOUNT\tCREATED\tUPDATED")
	for _, o := range orders {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", o.OrderID, o.Status, o.Workflow, o.Priority, o.Customer,
			money(o.Amount, o.Currency), stamp(o.CreatedAt), stamp(o.UpdatedAt))
	}
	return tw.Flush()
}

// onOrder is the frame of a command on one order: parse the flags and the
// order id, open the store, run do, and say plainly when the order does
// not exist.
func (a *app) onOrder(ctx context.Context, fs *flag.FlagSet, name string, args []string, do func(*statestore.Store, string) error) error {
	id, err := a.parseWithID(fs, name, args)
	if err != nil {
		return err
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	err = do(store, id)
	if errors.Is(err, statestore.ErrNotFound) {
		return fmt.Errorf("order %s not found", id)
	}
	return err
}

func (a *app) ordersShow(ctx context.Context, args []string) error {
	fs := a.flags("orders show")
	asJSON := fs.Bool("json", false, "print JSON")
	return a.onOrder(ctx, fs, "show", args, func(store *statestore.Store, id string) error {
		d, err := store.GetOrder(ctx, id)
		if err != nil {
			return err
		}
		return a.printOrder(d, *asJSON)
	})
}

// printOrder prints an order with its steps and history, or its JSON.
func (a *app) printOrder(d statestore.OrderDetail, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(d)
	}
	o := d.Order
	fmt.Fprintf(a.stdout, "order     %s\nstatus    %s\nworkflow  %s\npriority  %d\ncustomer  %s\namount    %s\nitems     %s\n",
		o.OrderID, o.Status, o.Workflow, o.Priority, o.Customer, money(o.Amount, o.Currency), o.Items)
	if o.ReplyTo != "" {
		fmt.Fprintf(a.stdout, "reply_to  %s\n", o.ReplyTo)
	}
	fmt.Fprintf(a.stdout, "created   %s\nupdated   %s\n\nsteps\n", stamp(o.CreatedAt), stamp(o.UpdatedAt))
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tNAME\tKIND\tAGENT\tSTATE\tATTEMPT\tFAILURES\tLOCKED_BY\tCOMPLETE_BY\tAVAILABLE_AT\tLAST_ERROR")
	for _, s := range d.Steps {
		completeBy := "-"
		if s.CompleteBy != nil {
			completeBy = stamp(*s.CompleteBy)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d/%d\t%s\t%s\t%s\t%s\n", s.Step, s.Name, s.Kind, s.Agent, s.ProcessState,
			s.Attempt, s.FailureCount, s.MaxFailures, dash(s.LockedBy), completeBy, stamp(s.AvailableAt), dash(s.LastError))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, "\nhistory")
	tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tSTEP\tFROM\tTO\tATTEMPT\tACTOR\tREASON")
	for _, h := range d.History {
		step := "order"
		if h.Step != nil {
			step = strconv.Itoa(*h.Step)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", stamp(h.At), step, dash(h.From), h.To, h.Attempt, h.Actor, h.Reason)
	}
	return tw.Flush()
}

func (a *app) ordersResubmit(ctx context.Context, args []string) error {
	fs := a.flags("orders resubmit")
	step := fs.Int("step", 0, "the step to resubmit (default: the step in error)")
	return a.onOrder(ctx, fs, "resubmit", args, func(store *statestore.Store, id string) error {
		reset, err := store.Resubmit(ctx, id, *step, "operator:"+operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "order %s: step(s) %v back to pending\n", id, reset)
		return nil
	})
}

func (a *app) ordersCancel(ctx context.Context, args []string) error {
	fs := a.flags("orders cancel")
	return a.onOrder(ctx, fs, "cancel", args, func(store *statestore.Store, id string) error {
		status, err := store.CancelOrder(ctx, id, "operator:"+operator())
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

func operator() string {
	for _, k := range []string{"SUDO_USER", "USER", "LOGNAME"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "unknown"
}

func money(minor int64, currency string) string {
	return fmt.Sprintf("%d.%02d %s", minor/100, minor%100, currency)
}

func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
