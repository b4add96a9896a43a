package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"sas/internal/statestore"
)

// ordersPause pauses or resumes one order.
func (a *app) ordersPause(ctx context.Context, args []string, pause bool) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	reason := fs.String("reason", "", "why, for whoever reads the pause (at most 500 characters)")
	return a.onOrder(ctx, fs, args, func(store *statestore.Store, id string) error {
		if !pause {
			outcome, err := store.ResumeOrder(ctx, id, claimedName(*as))
			if err != nil {
				return err
			}
			if outcome == statestore.NotPaused {
				return fmt.Errorf("order %s is not paused", id)
			}
			fmt.Fprintf(a.stdout, "order %s: resumed; its pending steps are claimed now, and its timers that fell due meanwhile fire\n", id)
			return nil
		}
		outcome, err := store.PauseOrder(ctx, id, *reason, claimedName(*as))
		if err != nil {
			return err
		}
		if outcome == statestore.AlreadyPaused {
			fmt.Fprintf(a.stdout, "order %s: already paused\n", id)
			return nil
		}
		fmt.Fprintf(a.stdout, "order %s: paused; steps in flight end normally, nothing new is claimed until sasctl orders resume %s\n", id, id)
		return nil
	})
}

// workflowsPause pauses or resumes a workflow.
func (a *app) workflowsPause(ctx context.Context, args []string, pause bool) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	reason := fs.String("reason", "", "why, for whoever reads the pause (at most 500 characters)")
	return a.onNamedEverywhere(ctx, fs, args, "give the workflow's name (sasctl workflows list)", func(store *statestore.Store, name string) error {
		if !pause {
			n, err := store.ResumeWorkflow(ctx, name, claimedName(*as))
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "workflow %s: resumed with %d orders paused with it (an order paused on its own stays paused)\n", name, n)
			return nil
		}
		n, err := store.PauseWorkflow(ctx, name, *reason, claimedName(*as))
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "workflow %s: paused with %d running orders; orders submitted now wait, received and paused, until sasctl workflows resume %s\n",
			name, n, name)
		return nil
	})
}

// limitsPause pauses or resumes an agent kind.
func (a *app) limitsPause(ctx context.Context, args []string, pause bool) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	reason := fs.String("reason", "", "why, for whoever reads the pause (at most 500 characters)")
	return a.onNamedEverywhere(ctx, fs, args, "give the agent kind (sasctl limits list)", func(store *statestore.Store, kind string) error {
		return a.pauseKind(ctx, store, kind, pause, *reason, claimedName(*as))
	})
}

func (a *app) pauseKind(ctx context.Context, store *statestore.Store, kind string, pause bool, reason, claimed string) error {
	if !pause {
		outcome, err := store.ResumeKind(ctx, kind, claimed)
		if err != nil {
			return err
		}
		if outcome == statestore.NotPaused {
			return fmt.Errorf("agent %s is not paused", kind)
		}
		fmt.Fprintf(a.stdout, "agent %s: resumed; its steps are claimed again\n", kind)
		return nil
	}
	outcome, err := store.PauseKind(ctx, kind, reason, claimed)
	if err != nil {
		return err
	}
	if outcome == statestore.AlreadyPaused {
		fmt.Fprintf(a.stdout, "agent %s: already paused\n", kind)
		return nil
	}
	fmt.Fprintf(a.stdout, "agent %s: paused; no step of it is claimed, in any order, until sasctl limits resume %s\n", kind, kind)
	return nil
}

// pausesList lists what is paused.
func (a *app) pausesList(ctx context.Context, args []string) error {
	fs := a.flags()
	limit := fs.Int("limit", 100, "orders listed at most")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	ps, err := store.Pauses(ctx, *limit)
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(ps)
	}
	if len(ps) == 0 {
		fmt.Fprintln(a.stdout, "nothing is paused")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tWHAT\tPAUSED AT\tBY\tREASON")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Scope, p.Target, clock(p.Since), p.By, dash(p.Reason))
	}
	return tw.Flush()
}
