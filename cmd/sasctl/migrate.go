package main

import (
	"context"
	"fmt"
	"time"

	"sas/internal/statestore"
	"sas/migrations"
)

func (a *app) migrate(ctx context.Context, args []string) error {
	fs := a.flags()
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	ms, err := statestore.LoadMigrations(migrations.FS)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	// A migration waits for the locks it needs as long as it takes: it
	// may have to wait for another migrate, or for long transactions.
	o := a.cfg.Database(2)
	o.LockTimeout = 0
	pool, err := a.poolWith(ctx, o)
	if err != nil {
		return err
	}
	defer pool.Close()
	ran, err := statestore.Migrate(ctx, pool, ms)
	for _, name := range ran {
		fmt.Fprintln(a.stdout, "applied", name)
	}
	if err != nil {
		return err
	}
	if len(ran) == 0 {
		fmt.Fprintf(a.stdout, "up to date (%d migrations)\n", len(ms))
	}
	return nil
}
