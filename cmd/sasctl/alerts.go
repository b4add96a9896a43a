package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// Alerts are read from the state store, where they stay until an
// operator acknowledges them (and after): reading them takes nobody's
// copy.

func (a *app) alertsList(ctx context.Context, args []string) error {
	fs := a.flags()
	open := fs.Bool("open", false, "only alerts nobody has acknowledged")
	since := fs.Duration("since", 0, "only alerts raised within this long, e.g. 24h")
	order := fs.String("order", "", "only this order's alerts")
	limit := fs.Int("limit", 50, "at most this many alerts")
	asJSON := fs.Bool("json", false, "print JSON")
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
	if *order != "" {
		id, ok := messages.CanonicalID(*order)
		if !ok {
			return fmt.Errorf("--order %q is not an order id (a UUID)", *order)
		}
		*order = id
	}
	// Every partition's newest (one store's, unpartitioned), merged
	// newest first: no partition is read past the limit.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	var alerts []statestore.Alert
	for _, ps := range stores {
		its, err := ps.store.ListAlerts(ctx, statestore.AlertFilter{OpenOnly: *open, Since: *since, OrderID: *order, Limit: *limit, Namespaces: namespaces})
		if err != nil {
			if ps.name != "" {
				return fmt.Errorf("partition %s: %w", ps.name, err)
			}
			return err
		}
		for _, al := range its {
			al.Partition = ps.name
			alerts = append(alerts, al)
		}
	}
	slices.SortStableFunc(alerts, func(x, y statestore.Alert) int { return y.RaisedAt.Compare(x.RaisedAt) })
	alerts = alerts[:min(len(alerts), *limit)]
	if *asJSON {
		return a.printJSON(alerts)
	}
	partitioned := stores[0].name != ""
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	header := "ID\tRAISED\tORDER_ID\tSTEP\tFAILURES\tACKNOWLEDGED"
	if partitioned {
		header += "\tPARTITION"
	}
	fmt.Fprintln(tw, header)
	for _, al := range alerts {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s", al.ID, clock(al.RaisedAt), al.OrderID, stepOf(al.Step), al.FailureCount, acked(al))
		if partitioned {
			fmt.Fprintf(tw, "\t%s", al.Partition)
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// Reasons are long: one line each under the table, by id.
	for _, al := range alerts {
		fmt.Fprintf(a.stdout, "%s\n", wrap(fmt.Sprintf("%d: %s", al.ID, al.Reason), showWidth, "    "))
	}
	return nil
}

func stepOf(step *int) string {
	if step == nil {
		return "-"
	}
	return strconv.Itoa(*step)
}

func acked(al statestore.Alert) string {
	if al.AckedAt == nil && al.ResolvedAt != nil {
		return "resolved " + clock(*al.ResolvedAt) + ": " + al.Resolution
	}
	if al.AckedAt == nil {
		return "open"
	}
	s := "by " + al.AckedBy
	if al.AckedAs != "" && al.AckedAs != al.AckedBy {
		s += " (as " + strconv.Quote(al.AckedAs) + ")"
	}
	return s + " " + clock(*al.AckedAt)
}

func (a *app) alertsAck(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return a.usageError(fs, "give the id of the alert(s) to acknowledge")
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	var ids []int64
	for _, r := range rest {
		id, err := strconv.ParseInt(r, 10, 64)
		if err != nil || id <= 0 {
			return a.usageError(fs, "%q is not an alert id (a number, see sasctl alerts list)", r)
		}
		ids = append(ids, id)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	for _, id := range ids {
		al, already, err := store.AckAlert(ctx, id, claimedName(*as), namespaces)
		if err != nil {
			return err
		}
		if already {
			fmt.Fprintf(a.stdout, "alert %d was already acknowledged %s\n", id, acked(al))
			continue
		}
		fmt.Fprintf(a.stdout, "alert %d (order %s) acknowledged %s\n", id, al.OrderID, acked(al))
	}
	return nil
}

// alertsTail prints alerts as they are committed, polling the state store.
func (a *app) alertsTail(ctx context.Context, args []string) error {
	fs := a.flags()
	count := fs.Int("count", 0, "stop after this many alerts (0: follow until interrupted)")
	timeout := fs.Duration("timeout", 0, "stop after this long (0: no limit)")
	since := fs.Duration("since", 0, "first print the alerts raised within this long")
	poll := fs.Duration("poll", time.Second, "how often to look for new alerts")
	namespace := namespaceFlag(fs)
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	if *count < 0 || *timeout < 0 || *since < 0 || *poll <= 0 {
		return a.usageError(fs, "--count, --timeout and --since must not be negative, --poll must be positive")
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	var after int64
	if *since > 0 {
		past, err := store.ListAlerts(ctx, statestore.AlertFilter{Since: *since, Limit: 1000, Namespaces: namespaces})
		if err != nil {
			return err
		}
		if len(past) > 0 {
			after = past[len(past)-1].ID - 1
		} else if after, err = store.LastAlertID(ctx); err != nil {
			return err
		}
	} else if after, err = store.LastAlertID(ctx); err != nil {
		return err
	}
	fmt.Fprintln(a.stderr, "following operator alerts (Ctrl-C to stop)")
	seen := 0
	ticker := time.NewTicker(*poll)
	defer ticker.Stop()
	for {
		alerts, err := store.ListAlerts(ctx, statestore.AlertFilter{AfterID: after, Oldest: true, Limit: 1000, Namespaces: namespaces})
		if err != nil && ctx.Err() == nil {
			return err
		}
		for _, al := range alerts {
			after = al.ID
			fmt.Fprintf(a.stdout, "%s  alert %d  order %s  step %s  failures %d  %s\n",
				stamp(al.RaisedAt), al.ID, al.OrderID, stepOf(al.Step), al.FailureCount, al.Reason)
			seen++
			if *count > 0 && seen >= *count {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			if *count > 0 {
				return fmt.Errorf("stopped after %d of %d alerts", seen, *count)
			}
			return nil
		case <-ticker.C:
		}
	}
}
