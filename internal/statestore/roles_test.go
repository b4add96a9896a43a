package statestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"sas/internal/statestore"
)

// storeAs returns a store whose connections act as role (SET ROLE), as a
// service logging in as a member of it would.
func storeAs(t *testing.T, b bundle, role string) *statestore.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+pgx.Identifier{role}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return statestore.New(pool)
}

// asRole runs stmt as role in a transaction it rolls back.
func asRole(t *testing.T, b bundle, role, stmt string) (pgconn.CommandTag, error) {
	t.Helper()
	ctx := ctxFor(t)
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, stmt)
}

func denied(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// TestRolesHaveOnlyWhatTheyNeed: each service's role can do its own work
// and is refused the rest.
func TestRolesHaveOnlyWhatTheyNeed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	submitter := storeAs(t, b, "sas_submitter")
	scheduler := storeAs(t, b, "sas_scheduler")
	supervisor := storeAs(t, b, "sas_supervisor")
	operator := storeAs(t, b, "sas_operator")

	// The submitter writes orders, and cannot move a step.
	o := order(2, 10*time.Millisecond, 1)
	if got, err := submitter.InsertOrder(ctx, o); err != nil || got != statestore.Inserted {
		t.Fatalf("submitter insert: %v %v", got, err)
	}
	if _, err := submitter.ClaimPending(ctx, "s", 1, ""); !denied(err) {
		t.Fatalf("submitter claim: %v, want permission denied", err)
	}
	// The scheduler claims and applies replies, writes orders (the
	// children of sub-process steps, migration 0029), and cannot take the
	// supervisor's lease.
	claimed, err := scheduler.ClaimPending(ctx, "s", 1, "")
	if err != nil || len(claimed) != 1 {
		t.Fatalf("scheduler claim: %v %v", claimed, err)
	}
	if got, err := scheduler.InsertOrder(ctx, order(1, time.Minute, 1)); err != nil || got != statestore.Inserted {
		t.Fatalf("scheduler insert (a child): %v %v", got, err)
	}
	if _, err := scheduler.AcquireLease(ctx, "supervisor", "s", time.Second); !denied(err) {
		t.Fatalf("scheduler lease: %v, want permission denied", err)
	}
	// It holds its own kinds' listener lease (migration 0021).
	listenerLease := statestore.SchedulerListenerLease([]string{"payment", "inventory"})
	if l, err := scheduler.AcquireListenerLease(ctx, listenerLease, "s", time.Second); err != nil || !l.Held {
		t.Fatalf("scheduler listener lease: %+v %v", l, err)
	}
	if err := scheduler.ReleaseListenerLease(ctx, listenerLease, "s"); err != nil {
		t.Fatalf("scheduler listener lease release: %v", err)
	}
	// Relaying deletes the published status events (the submitter's) and
	// marks the statuses nobody heard (migration 0036), which the
	// submitter reads when it writes an order; the API clears the marks.
	if n, err := scheduler.RelayOutboxHeard(ctx, 10, time.Minute, func(_ context.Context, msgs []statestore.OutboxMessage) (int, []string, error) {
		return len(msgs), []string{"received"}, nil
	}); err != nil || n == 0 {
		t.Fatalf("scheduler relay: %d %v", n, err)
	}
	if got, err := submitter.InsertOrder(ctx, order(1, time.Minute, 1)); err != nil || got != statestore.Inserted {
		t.Fatalf("submitter insert while received is unheard: %v %v", got, err)
	}
	if err := storeAs(t, b, "sas_api").HearStatusEvents(ctx); err != nil {
		t.Fatalf("api hears status events: %v", err)
	}
	if err := supervisor.HearStatusEvents(ctx); !denied(err) {
		t.Fatalf("supervisor clearing the marks: %v, want permission denied", err)
	}
	// A step's callback goes through its one door (step_callback), which
	// the entrances' roles call and which reads the tokens' key for them:
	// the API and operators call it, but cannot read the key; the
	// submitter and the supervisor cannot call it.
	for _, role := range []string{"sas_api", "sas_operator", "sas_scheduler"} {
		out, err := storeAs(t, b, role).Callback(ctx, statestore.Callback{Token: "st1.made-up", Name: "complete", Actor: "t"})
		if err != nil || out.Outcome != statestore.CallbackInvalidToken {
			t.Fatalf("%s calling back: %+v %v", role, out, err)
		}
	}
	for _, role := range []string{"sas_submitter", "sas_supervisor", "sas_console"} {
		if _, err := storeAs(t, b, role).Callback(ctx, statestore.Callback{Token: "st1.made-up", Name: "complete", Actor: "t"}); !denied(err) {
			t.Fatalf("%s calling back: %v, want permission denied", role, err)
		}
	}
	for _, role := range []string{"sas_api", "sas_operator", "sas_console", "sas_submitter", "sas_supervisor"} {
		if _, err := asRole(t, b, role, `SELECT key FROM step_token_key`); !denied(err) {
			t.Fatalf("%s reading the step tokens' key: %v, want permission denied", role, err)
		}
		if _, err := asRole(t, b, role, `SELECT step_token_mac('x')`); !denied(err) {
			t.Fatalf("%s making a token's MAC: %v, want permission denied", role, err)
		}
	}
	// Webhook deliveries: the supervisors send them, operators list and
	// replay them, the console and the API read them; the schedulers
	// cannot take them.
	if _, err := supervisor.ClaimWebhooks(ctx, 5, time.Minute); err != nil {
		t.Fatalf("supervisor claiming webhooks: %v", err)
	}
	if err := operator.ReplayWebhook(ctx, 1<<40); !errors.Is(err, statestore.ErrNotFound) {
		t.Fatalf("operator replaying a webhook: %v, want not found", err)
	}
	for _, role := range []string{"sas_console", "sas_api", "sas_operator"} {
		if _, err := storeAs(t, b, role).ListWebhooks(ctx, statestore.WebhookFilter{Limit: 1}); err != nil {
			t.Fatalf("%s listing webhooks: %v", role, err)
		}
	}
	if _, err := scheduler.ClaimWebhooks(ctx, 5, time.Minute); !denied(err) {
		t.Fatalf("scheduler claiming webhooks: %v, want permission denied", err)
	}
	// A writer of a timer reads when the supervisor's timer loop looks
	// next; only the supervisor says when (migration 0037).
	later := time.Now().Add(time.Hour)
	delayedOrder := order(1, time.Minute, 1)
	delayedOrder.StartAt = &later
	if got, err := submitter.InsertOrder(ctx, delayedOrder); err != nil || got != statestore.Inserted {
		t.Fatalf("submitter insert of an order that starts later: %v %v", got, err)
	}
	if _, _, watched, err := supervisor.WatchTimers(ctx, time.Minute); err != nil || !watched {
		t.Fatalf("supervisor watching timers: %v %v", watched, err)
	}
	if _, _, _, err := scheduler.WatchTimers(ctx, time.Minute); !denied(err) {
		t.Fatalf("scheduler watching timers: %v, want permission denied", err)
	}
	// The supervisor sweeps under its lease, and cannot publish the outbox
	// or hold a scheduler's lease.
	if _, err := supervisor.AcquireLease(ctx, "supervisor", "sup", time.Minute); err != nil {
		t.Fatalf("supervisor lease: %v", err)
	}
	if _, err := supervisor.AcquireListenerLease(ctx, listenerLease, "sup", time.Minute); !denied(err) {
		t.Fatalf("supervisor holding a listener lease: %v, want permission denied", err)
	}
	waitExpired(t, b)
	if swept, err := supervisor.SweepExpired(ctx, statestore.SweepParams{Actor: "sup", Limit: 10, Lease: "supervisor"}); err != nil || len(swept) != 1 {
		t.Fatalf("supervisor sweep: %v %v", swept, err)
	}
	if _, err := supervisor.RelayOutbox(ctx, 10, func(context.Context, []statestore.OutboxMessage) (int, error) { return 1, nil }); !denied(err) {
		t.Fatalf("supervisor relay: %v, want permission denied", err)
	}
	// The operator reads and acts on orders, and cannot write new ones.
	if _, err := operator.GetOrder(ctx, o.OrderID); err != nil {
		t.Fatalf("operator show: %v", err)
	}
	if _, err := operator.Resubmit(ctx, o.OrderID, 0, "operator:x"); err != nil {
		t.Fatalf("operator resubmit: %v", err)
	}
	if _, err := operator.InsertOrder(ctx, order(1, time.Minute, 1)); !denied(err) {
		t.Fatalf("operator insert: %v, want permission denied", err)
	}
	// ... and only through the functions that record who it is: it
	// cannot write the tables, so it cannot write history in another's
	// name.
	for _, stmt := range []string{
		`UPDATE steps SET process_state = 'pending'`,
		`INSERT INTO transitions (order_id, to_state, actor) VALUES (gen_random_uuid(), 'x', 'operator:someone-else')`,
		`INSERT INTO outbox (message_type, order_id, body) VALUES ('status_event', gen_random_uuid(), '{}')`,
		`UPDATE alerts SET acked_by = 'someone-else'`,
	} {
		if _, err := asRole(t, b, "sas_operator", stmt); !denied(err) {
			t.Errorf("operator may %s: %v", stmt, err)
		}
	}
	if _, err := operator.ListAlerts(ctx, statestore.AlertFilter{}); err != nil {
		t.Fatalf("operator lists alerts: %v", err)
	}
	if _, err := operator.PurgeEnded(ctx, time.Hour, nil, 10); err != nil {
		t.Fatalf("operator purge: %v", err)
	}
	if _, err := supervisor.PurgeEnded(ctx, time.Hour, nil, 10); err != nil {
		t.Fatalf("supervisor purge: %v", err)
	}
	if _, err := scheduler.PurgeEnded(ctx, time.Hour, nil, 10); !denied(err) {
		t.Fatalf("scheduler purge: %v, want permission denied", err)
	}
	if _, err := scheduler.Resubmit(ctx, o.OrderID, 0, "x"); !denied(err) {
		t.Fatalf("scheduler resubmit: %v, want permission denied", err)
	}
	// Nobody but the owner deletes, or rewrites history.
	if _, err := submitter.CancelOrder(ctx, o.OrderID, "x"); !denied(err) {
		t.Fatalf("submitter cancel: %v, want permission denied", err)
	}
	for _, role := range []string{"sas_submitter", "sas_scheduler", "sas_supervisor", "sas_operator"} {
		for _, stmt := range []string{`DELETE FROM orders`, `UPDATE transitions SET actor = 'x'`, `DROP TABLE outbox`, `DELETE FROM alerts`} {
			_, err := asRole(t, b, role, stmt)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || (pgErr.Code != "42501" && pgErr.Code != "42P01") {
				t.Errorf("%s may %s: %v", role, stmt, err)
			}
		}
	}
}

// TestRolesRunDeadlinesPausesArchivalAndKeys: each service's role can do
// its part of deadlines, pauses, archival, signals by key and moves, and
// an entrance that must not pause cannot.
func TestRolesRunDeadlinesPausesArchivalAndKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := ctxFor(t)
	submitter := storeAs(t, b, "sas_submitter")
	scheduler := storeAs(t, b, "sas_scheduler")
	supervisor := storeAs(t, b, "sas_supervisor")
	operator := storeAs(t, b, "sas_operator")

	o := order(1, time.Minute, 1)
	o.Deadline = time.Hour
	o.Attributes = []statestore.Attribute{{Name: "applicant", Text: ptr("42")}}
	if got, err := submitter.InsertOrder(ctx, o); err != nil || got != statestore.Inserted {
		t.Fatalf("submitter insert with a deadline: %v %v", got, err)
	}
	if ids, err := scheduler.OrdersByKey(ctx, "test", map[string]any{"applicant": "42"}, 2); err != nil || len(ids) != 1 {
		t.Fatalf("scheduler finding an order by key: %v %v", ids, err)
	}
	if _, err := submitter.PauseOrder(ctx, o.OrderID, "", "x"); !denied(err) {
		t.Fatalf("submitter pausing: %v, want permission denied", err)
	}
	if got, err := operator.PauseOrder(ctx, o.OrderID, "incident", "ann"); err != nil || got != statestore.Paused {
		t.Fatalf("operator pausing: %q %v", got, err)
	}
	if _, err := supervisor.SettlePauses(ctx, "sup"); err != nil {
		t.Fatalf("supervisor settling pauses: %v", err)
	}
	if got, err := operator.ResumeOrder(ctx, o.OrderID, "ann"); err != nil || got != statestore.Resumed {
		t.Fatalf("operator resuming: %q %v", got, err)
	}
	if _, err := supervisor.AcquireLease(ctx, statestore.SupervisorLease, "sup", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE order_deadlines SET due_at = clock_timestamp() WHERE order_id = $1`, o.OrderID); err != nil {
		t.Fatal(err)
	}
	if fired, err := supervisor.FireDeadlines(ctx, "sup", statestore.SupervisorLease, 10); err != nil || len(fired) != 1 || !fired[0].Applied {
		t.Fatalf("supervisor firing a deadline: %+v %v", fired, err)
	}
	if _, err := supervisor.ArchiveDocument(ctx, o.OrderID); err != nil {
		t.Fatalf("supervisor reading an order's record to archive: %v", err)
	}
	if _, err := supervisor.PurgeOrders(ctx, []string{o.OrderID}, 0, nil); err != nil {
		t.Fatalf("supervisor deleting archived orders: %v", err)
	}
}
