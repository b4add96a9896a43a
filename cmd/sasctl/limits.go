package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"text/tabwriter"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// limitsList lists the agent kinds' limits and their use.
func (a *app) limitsList(ctx context.Context, args []string) error {
	fs := a.flags()
	asJSON := fs.Bool("json", false, "print everything as JSON")
	nsFlag := fs.String("namespace", "", "only this namespace's own limits on kinds")
	if _, err := a.parse(fs, args); err != nil {
		return err
	}
	if _, err := a.namespaceOf(fs, *nsFlag); err != nil {
		return err
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	scoped, err := store.ListNamespaceLimits(ctx, *nsFlag)
	if err != nil {
		return err
	}
	if *nsFlag != "" {
		if *asJSON {
			return a.printJSON(scoped)
		}
		return a.printNamespaceLimits(scoped, *nsFlag)
	}
	rows, err := store.ListLimits(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(withNamespaces(rows, scoped))
	}
	if len(rows) == 0 && len(scoped) == 0 {
		fmt.Fprintln(a.stdout, "no agent kind has limits (a workflows file's limits: section, or sasctl limits set)")
		return nil
	}
	if len(rows) == 0 {
		return a.printNamespaceLimits(scoped, "")
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tLIMITS\tFROM\tIN_FLIGHT\tWAITING\tOLDEST_WAIT\tOVER_BUDGET\tLOWERED")
	for _, r := range rows {
		from := "file"
		if r.SetBy != "" {
			from = r.SetBy + " at " + stamp(*r.SetAt)
		}
		lowered := "–"
		if r.LoweredUntil != nil {
			lowered = "by a 429 until " + stamp(*r.LoweredUntil)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.1fs\t%d\t%s\n", r.Agent, r.Effective, from, r.InFlight, r.Waiting, r.OldestWait, r.Overdue, lowered)
	}
	if err := tw.Flush(); err != nil || len(scoped) == 0 {
		return err
	}
	fmt.Fprintln(a.stdout)
	return a.printNamespaceLimits(scoped, "")
}

// kindJSON is a kind's limits as limits list --json prints them: with
// the namespaces' own on it.
type kindJSON struct {
	statestore.KindLimits
	Namespaces []statestore.NamespaceLimits `json:"namespaces,omitempty"`
}

// withNamespaces puts each namespace's limits beside its kind's (a kind
// with a namespace's alone gets an entry of its own).
func withNamespaces(rows []statestore.KindLimits, scoped []statestore.NamespaceLimits) []kindJSON {
	out := make([]kindJSON, 0, len(rows))
	at := map[string]int{}
	for _, r := range rows {
		at[r.Agent] = len(out)
		out = append(out, kindJSON{KindLimits: r})
	}
	for _, n := range scoped {
		i, ok := at[n.Agent]
		if !ok {
			i, at[n.Agent] = len(out), len(out)
			out = append(out, kindJSON{KindLimits: statestore.KindLimits{Agent: n.Agent}})
		}
		out[i].Namespaces = append(out[i].Namespaces, n)
	}
	return out
}

// printNamespaceLimits prints the namespaces' own limits on kinds.
func (a *app) printNamespaceLimits(rows []statestore.NamespaceLimits, ns string) error {
	if len(rows) == 0 {
		fmt.Fprintf(a.stdout, "namespace %s has no limits of its own (sasctl limits set KIND --namespace %s …); the kinds' limits hold its steps\n", ns, ns)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAMESPACE\tLIMITS\tFROM\tIN_FLIGHT\tWAITING\tOLDEST_WAIT")
	for _, r := range rows {
		from := "file"
		if r.SetBy != "" {
			from = r.SetBy + " at " + stamp(*r.SetAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%.1fs\n", r.Agent, r.Namespace, r.Limits, from, r.InFlight, r.Waiting, r.OldestWait)
	}
	return tw.Flush()
}

// limitsSet changes an agent kind's limits at run time.
func (a *app) limitsSet(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	var c statestore.LimitChange
	var pause bool
	fs.Func("rate", "claims a second, e.g. 20/s, 600/m (none: no rate; 0: paused, as limits pause)", func(v string) error {
		if v == "0" || v == "0/s" || v == "0/m" || v == "0/h" {
			pause = true
			return nil
		}
		return rateFlag(&c.Rate, &c.ClearRate)(v)
	})
	fs.Func("min-rate", "the floor a service's 429 lowers the rate to, e.g. 5/s (none: a tenth of the rate)", rateFlag(&c.MinRate, &c.ClearMinRate))
	fs.Func("burst", "claims at once above the rate (none: a tenth of the rate)", countFlag(&c.Burst, &c.ClearBurst))
	fs.Func("max-in-flight", "steps processing at once (none: no bound)", countFlag(&c.MaxInFlight, &c.ClearMaxInFlight))
	nsFlag := fs.String("namespace", "", "set this namespace's own limits on the kind, within the kind's (--rate, --burst, --max-in-flight)")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if _, err := a.namespaceOf(fs, *nsFlag); err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the agent kind, e.g. sasctl limits set inventory --rate 20/s")
	}
	if pause && c.String() != "" {
		return a.usageError(fs, "a rate of 0 pauses the kind; give it alone (sasctl limits pause KIND)")
	}
	if c.String() == "" && !pause {
		return a.usageError(fs, "say what to change: --rate, --burst, --max-in-flight or --min-rate")
	}
	if pause && *nsFlag != "" {
		return a.usageError(fs, "a namespace's rate is a positive number; pause its orders (sasctl orders pause) or the kind (sasctl limits pause KIND)")
	}
	// In a partitioned deployment, each partition's share of the change
	// in its own store: together they hold the limits given.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	share := c.Share(len(stores))
	for _, ps := range stores {
		where := ""
		if ps.name != "" {
			where = "partition " + ps.name + ": "
		}
		if pause {
			fmt.Fprint(a.stdout, where)
			if err := a.pauseKind(ctx, ps.store, rest[0], true, "rate set to 0", claimedName(*as)); err != nil {
				return err
			}
			continue
		}
		if *nsFlag != "" {
			n, err := ps.store.SetNamespaceLimits(ctx, *nsFlag, rest[0], share, claimedName(*as))
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "%sagent %s in namespace %s: %s (set by %s; every scheduler's next claim obeys it, within the kind's limits; "+
				"sasctl limits reset %s --namespace %s removes it)\n", where, n.Agent, n.Namespace, n.Limits, n.SetBy, n.Agent, n.Namespace)
			continue
		}
		k, err := ps.store.SetLimits(ctx, rest[0], share, claimedName(*as))
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "%sagent %s: %s (set by %s; every scheduler's next claim obeys it; sasctl limits reset %s goes back to the file's)\n",
			where, k.Agent, k.Effective, k.SetBy, k.Agent)
	}
	return nil
}

// limitsReset puts an agent kind back under the workflows file's limits.
func (a *app) limitsReset(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	nsFlag := fs.String("namespace", "", "remove this namespace's own limits on the kind (the kind's then hold its steps alone)")
	return a.onNamedEverywhere(ctx, fs, args, "give the agent kind (sasctl limits list)", func(store *statestore.Store, kind string) error {
		if _, err := a.namespaceOf(fs, *nsFlag); err != nil {
			return err
		}
		if *nsFlag != "" {
			err := store.ResetNamespaceLimits(ctx, *nsFlag, kind, claimedName(*as))
			if errors.Is(err, statestore.ErrNoLimits) {
				return fmt.Errorf("agent %s has no limits an operator set in namespace %s (sasctl limits list --namespace %s)", kind, *nsFlag, *nsFlag)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "agent %s in namespace %s: back to the workflows file's limits of the namespace, if it gives any, else the kind's alone\n", kind, *nsFlag)
			return nil
		}
		k, err := store.ResetLimits(ctx, kind, claimedName(*as))
		if errors.Is(err, statestore.ErrNoLimits) {
			return fmt.Errorf("agent %s has no limits stored (sasctl limits list)", kind)
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "agent %s: back to the workflows file's limits: %s\n", k.Agent, k.Effective)
		return nil
	})
}

// rateFlag reads a rate (workflow.ParseRate), or none.
func rateFlag(dst **float64, clear *bool) func(string) error {
	return func(v string) error {
		if v == "none" {
			*clear = true
			return nil
		}
		r, err := workflow.ParseRate(v)
		*dst = &r
		return err
	}
}

// countFlag reads a whole number of at least 1, or none.
func countFlag(dst **int, clear *bool) func(string) error {
	return func(v string) error {
		if v == "none" {
			*clear = true
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > workflow.MaxInFlightLimit {
			return fmt.Errorf("%q: a whole number from 1 to %d, or none", v, workflow.MaxInFlightLimit)
		}
		*dst = &n
		return nil
	}
}
