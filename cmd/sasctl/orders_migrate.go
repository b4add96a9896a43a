package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

	"sas/internal/messages"
)

// ordersMigrate moves running orders of a workflow to the version of it
// the workflows file has: a dry run by default, each order's verdict.
func (a *app) ordersMigrate(ctx context.Context, args []string) error {
	fs := a.flags()
	to := fs.String("to", "", "the version to move to: the workflow's version in the workflows file (sasctl workflows list) (required)")
	wfName := fs.String("workflow", "", "the workflow whose running orders move (required)")
	workflows := fs.String("workflows", "", "the workflows file holding the version (default: SAS_WORKFLOWS_FILE, else the built-in one)")
	var ids, where stringList
	fs.Var(&ids, "id", "only this order (again for more; default: every running order of the workflow)")
	fs.Var(&where, "where", "only the running orders whose search attribute has this value, NAME=VALUE (again for more)")
	limit := fs.Int("limit", 10000, "orders looked at, at most")
	apply := fs.Bool("apply", false, "move the orders that can move (without it, a dry run: what would move and why not)")
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	asJSON := fs.Bool("json", false, "print each order's verdict as JSON")
	namespace := namespaceFlag(fs)
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	if *to == "" || *wfName == "" {
		return a.usageError(fs, "give --workflow and --to VERSION")
	}
	reg, err := workflowsFile(*workflows)
	if err != nil {
		return err
	}
	wf, ok := reg.Lookup(*wfName)
	if !ok {
		return fmt.Errorf("workflow %q is not in the workflows file (%v)", *wfName, reg.Names())
	}
	if wf.Version() != *to {
		return fmt.Errorf("the workflows file has version %s of %s, not %s: name the file that has it (--workflows)", wf.Version(), wf.Name, *to)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	named := len(ids) > 0 // --id: each must be in the namespace
	switch {
	case len(ids) > 0 && len(where) > 0:
		return a.usageError(fs, "give --id or --where, not both")
	case len(where) > 0:
		key := map[string]any{}
		for _, w := range where {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return a.usageError(fs, "--where %q: write NAME=VALUE", w)
			}
			key[k] = keyValue(v)
		}
		if err := messages.CheckWhere(key); err != nil {
			return err
		}
		if ids, err = store.OrdersByKeyIn(ctx, wf.Name, key, *limit, namespaces); err != nil {
			return err
		}
	case len(ids) == 0:
		if ids, err = store.RunningOrdersIn(ctx, wf.Name, wf.Version(), *limit, namespaces); err != nil {
			return err
		}
	}
	for i, raw := range ids {
		id, ok := messages.CanonicalID(raw)
		if !ok {
			return fmt.Errorf("%q is not an order id (a UUID)", raw)
		}
		if named {
			if err := orderIn(ctx, store, id, namespaces); err != nil {
				return err
			}
		}
		ids[i] = id
	}
	verdicts, err := store.MigrateOrders(ctx, ids, wf, *apply, claimedName(*as))
	if err != nil {
		return err
	}
	moved, left := 0, 0
	for _, v := range verdicts {
		if v.Moved {
			moved++
		} else if !v.CanMove {
			left++
		}
	}
	if *asJSON {
		return a.printJSON(verdicts)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ORDER\tFROM\tVERDICT")
	for _, v := range verdicts {
		verdict := "can move"
		switch {
		case v.Moved:
			verdict = "moved"
		case !v.CanMove:
			verdict = "stays: " + v.Why
		}
		if v.CanMove && (len(v.Added) > 0 || len(v.Dropped) > 0) {
			verdict += fmt.Sprintf(" (adds %v, drops %v)", v.Added, v.Dropped)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", v.OrderID, dash(v.From), verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if *apply {
		fmt.Fprintf(a.stdout, "%d orders moved to %s version %s; %d left as they were (above, why)\n", moved, wf.Name, wf.Version(), left)
	} else {
		fmt.Fprintf(a.stdout, "dry run: %d of %d orders can move to %s version %s; add --apply to move them\n", len(verdicts)-left, len(verdicts), wf.Name, wf.Version())
	}
	return nil
}
