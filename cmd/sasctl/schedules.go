package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// schedulesList lists the stored schedules.
func (a *app) schedulesList(ctx context.Context, args []string) error {
	fs := a.flags()
	asJSON := fs.Bool("json", false, "print everything as JSON")
	if _, err := a.parse(fs, args); err != nil {
		return err
	}
	// A schedule is kept by one partition's supervisor: every
	// partition's, named with it.
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	var rows []statestore.ScheduleRow
	var partitionOf []string
	for _, ps := range stores {
		its, err := ps.store.Schedules(ctx)
		if err != nil {
			if ps.name != "" {
				return fmt.Errorf("partition %s: %w", ps.name, err)
			}
			return err
		}
		rows = append(rows, its...)
		for range its {
			partitionOf = append(partitionOf, ps.name)
		}
	}
	partitioned := stores[0].name != ""
	if *asJSON {
		if !partitioned {
			return a.printJSON(rows)
		}
		type partitionSchedule struct {
			Partition string `json:"partition"`
			statestore.ScheduleRow
		}
		out := make([]partitionSchedule, len(rows))
		for i, r := range rows {
			out[i] = partitionSchedule{partitionOf[i], r}
		}
		return a.printJSON(out)
	}
	if len(rows) == 0 {
		fmt.Fprintln(a.stdout, "no schedules (the workflows file the supervisors read has none)")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	header := "SCHEDULE\tCRON\tTIMEZONE\tWORKFLOW\tOVERLAP\tCATCH_UP\tSTATE\tNEXT_TICK\tLAST_TICK\tLAST_ORDER"
	if partitioned {
		header += "\tPARTITION"
	}
	fmt.Fprintln(tw, header)
	for i, r := range rows {
		state := "active"
		switch {
		case !r.InFile:
			state = "not in the file"
		case r.Paused:
			state = "paused by " + r.PausedBy
		}
		last, order := "–", "–"
		if r.LastTick != nil {
			last = stamp(*r.LastTick)
		}
		if r.LastOrder != "" {
			order = r.LastOrder + " (" + r.LastOrderStatus + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", r.Name, r.Cron, r.Timezone, r.Workflow, r.Overlap, r.CatchUp, state,
			stamp(r.NextTick), last, order)
		if partitioned {
			fmt.Fprintf(tw, "\t%s", partitionOf[i])
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// schedulesPause pauses or resumes a schedule.
func (a *app) schedulesPause(ctx context.Context, args []string, pause bool) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	return a.onSchedule(ctx, fs, args, func(store *statestore.Store, name string) error {
		row, err := findStored(ctx, store, name)
		if err != nil {
			return err
		}
		return a.pauseSchedule(ctx, store, row, pause, claimedName(*as))
	})
}

// scheduleName says what a schedule command takes.
const scheduleName = "give the schedule's name (sasctl schedules list)"

// onNamed parses a command's flags and its one argument, the name of
// what it acts on (missing says what to give), and runs do with the
// state store.
func (a *app) onNamed(ctx context.Context, fs *flag.FlagSet, args []string, missing string, do func(*statestore.Store, string) error) error {
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "%s", missing)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	return do(store, rest[0])
}

// onNamedEverywhere is onNamed in every partition's store of a
// partitioned deployment (what concerns the whole deployment: a
// workflow, an agent kind), each line of a partition's after its name.
func (a *app) onNamedEverywhere(ctx context.Context, fs *flag.FlagSet, args []string, missing string, do func(*statestore.Store, string) error) error {
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "%s", missing)
	}
	stores, closeStores, err := a.everyStore(ctx)
	if err != nil {
		return err
	}
	defer closeStores()
	var errs []error
	for _, ps := range stores {
		if ps.name != "" {
			fmt.Fprintf(a.stdout, "partition %s: ", ps.name)
		}
		if err := do(ps.store, rest[0]); err != nil {
			if ps.name == "" {
				return err
			}
			fmt.Fprintln(a.stdout, err)
			errs = append(errs, fmt.Errorf("partition %s: %w", ps.name, err))
		}
	}
	return errors.Join(errs...)
}

// onSchedule is onNamed in the store keeping schedule name: in a
// partitioned deployment, its partition's (partition.Layout.ScheduleOwner).
func (a *app) onSchedule(ctx context.Context, fs *flag.FlagSet, args []string, do func(*statestore.Store, string) error) error {
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "%s", scheduleName)
	}
	l, err := a.layout()
	if err != nil {
		return err
	}
	store, closeStore, err := a.store(ctx)
	if l != nil {
		if err == nil {
			closeStore()
		}
		store, closeStore, err = a.partitionStore(ctx, l.Partitions[l.ScheduleOwner(rest[0])])
	}
	if err != nil {
		return err
	}
	defer closeStore()
	return do(store, rest[0])
}

func (a *app) pauseSchedule(ctx context.Context, store *statestore.Store, row statestore.ScheduleRow, pause bool, claimed string) error {
	next := row.NextTick
	if !pause {
		sc, err := workflow.ParseTicks(row.Cron, row.Timezone)
		if err != nil {
			return fmt.Errorf("schedule %s: %w", row.Name, err)
		}
		now, err := store.Now(ctx)
		if err != nil {
			return err
		}
		next = sc.Next(now)
	}
	if err := store.PauseSchedule(ctx, row.Name, pause, next, claimed); err != nil {
		return err
	}
	if pause {
		fmt.Fprintf(a.stdout, "schedule %s: paused; its ticks start nothing until it is resumed\n", row.Name)
	} else {
		fmt.Fprintf(a.stdout, "schedule %s: resumed; it ticks next at %s\n", row.Name, stamp(next))
	}
	return nil
}

// schedulesTrigger asks for an order of the schedule now and waits to
// say which.
func (a *app) schedulesTrigger(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name to record beside your database login (default: $USER)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for the leading supervisor to start the order")
	return a.onSchedule(ctx, fs, args, func(store *statestore.Store, name string) error {
		return a.triggerSchedule(ctx, store, name, claimedName(*as), *wait)
	})
}

func (a *app) triggerSchedule(ctx context.Context, store *statestore.Store, name, claimed string, wait time.Duration) error {
	at, err := store.TriggerSchedule(ctx, name, claimed)
	if err != nil {
		return err
	}
	id := messages.DerivedID("schedule:" + name + ":trigger:" + at.UTC().Format(time.RFC3339Nano))
	deadline := time.Now().Add(wait)
	for {
		_, err := store.GetOrder(ctx, id)
		switch {
		case err == nil:
			fmt.Fprintf(a.stdout, "schedule %s: order %s started\n", name, id)
			return nil
		case !errors.Is(err, statestore.ErrNotFound):
			return err
		case time.Now().After(deadline):
			return fmt.Errorf("schedule %s: triggered, but no supervisor started order %s within %v: is one leading? (it starts it when it does)", name, id, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func findStored(ctx context.Context, store *statestore.Store, name string) (statestore.ScheduleRow, error) {
	rows, err := store.Schedules(ctx)
	if err != nil {
		return statestore.ScheduleRow{}, err
	}
	for _, r := range rows {
		if r.Name == name {
			return r, nil
		}
	}
	return statestore.ScheduleRow{}, fmt.Errorf("schedule %s: %w (sasctl schedules list)", name, statestore.ErrNoSchedule)
}
