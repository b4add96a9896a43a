package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// webhooksList lists webhook deliveries, newest first: what each order's
// end told which endpoint, and what came of it.
func (a *app) webhooksList(ctx context.Context, args []string) error {
	fs := a.flags()
	dead := fs.Bool("dead", false, "only the dead ones (tried SAS_SUPERVISOR_WEBHOOK_ATTEMPTS times): sasctl webhooks replay ID tries one again")
	state := fs.String("state", "", "only deliveries in this state: pending, sent or dead")
	order := fs.String("order", "", "only this order's deliveries")
	limit := fs.Int("limit", 50, "at most this many")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if err := a.positive(fs, "limit", *limit); err != nil {
		return err
	}
	if *dead {
		*state = statestore.WebhookDead
	}
	switch *state {
	case "", statestore.WebhookPending, statestore.WebhookSent, statestore.WebhookDead:
	default:
		return a.usageError(fs, "--state %q: write pending, sent or dead", clip(*state, 20))
	}
	if *order != "" {
		id, ok := messages.CanonicalID(*order)
		if !ok {
			return fmt.Errorf("--order %q is not an order id (a UUID)", clip(*order, 60))
		}
		*order = id
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	ds, err := store.ListWebhooks(ctx, statestore.WebhookFilter{State: *state, OrderID: *order, Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(ds)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tORDER_ID\tEVENT\tURL\tSTATE\tTRIES\tLAST_ERROR")
	for _, d := range ds {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", d.ID, clock(d.CreatedAt), d.OrderID, d.Event, clip(d.URL, 60), d.State, d.Attempts,
			clip(d.LastError, 100))
	}
	return tw.Flush()
}

// webhooksReplay makes a dead delivery due again.
func (a *app) webhooksReplay(ctx context.Context, args []string) error {
	fs := a.flags()
	as := fs.String("as", "", "the name recorded as who replayed it (default: $USER)")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the delivery's id (sasctl webhooks list --dead)")
	}
	id, err := strconv.ParseInt(rest[0], 10, 64)
	if err != nil || id < 1 {
		return fmt.Errorf("%q is not a delivery id (a positive number)", clip(rest[0], 30))
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := store.ReplayWebhook(ctx, id); err != nil {
		return err
	}
	if err := store.RecordOperatorAction(ctx, "webhook replay", strconv.FormatInt(id, 10), "", claimedName(*as)); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "webhook delivery %d is due again: the supervisors try it within SAS_SUPERVISOR_WEBHOOK_POLL (sasctl webhooks list)\n", id)
	return nil
}
