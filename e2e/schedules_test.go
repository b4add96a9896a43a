package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
)

const schedulesFile = `
workflows:
  - name: tick
    payload_schema: {type: object, required: [kind]}
    steps:
      - {action: note_tick, agent: clock}
schedules:
  - name: every_second
    cron: "@every 1s"
    workflow: tick
    payload: {kind: second}
    overlap: allow
    catch_up: all
  - name: yearly
    cron: "0 0 1 1 *"
    timezone: Europe/Berlin
    workflow: tick
    payload: {kind: year}
`

// leaderOf is the supervisor that leads now.
func leaderOf(t *testing.T, p *pipeline) *proc {
	t.Helper()
	var leader *proc
	testenv.Eventually(t, 30*time.Second, "a supervisor to lead", func() bool {
		for _, s := range p.supervisors {
			if !s.exited() && s.metric(t, "sas_supervisor_leader") == 1 {
				leader = s
				return true
			}
		}
		return false
	})
	return leader
}

// TestScheduleStartsOneOrderPerTick: a schedule every second runs for
// 18 s (two minutes with SAS_SCHEDULE_TICKS=120) while the leading supervisor is killed with SIGKILL twice (a
// standby leads after the lease expires and catches the missed ticks
// up). Every tick from the first to the last has exactly one order, with
// the id derived from the tick, and there is no other; an operator's
// trigger starts one more, pause stops the ticks, and sasctl schedules
// list shows it all.
func TestScheduleStartsOneOrderPerTick(t *testing.T) {
	t.Parallel()
	g := runFile(t, "schedules.yaml", schedulesFile, pipelineOpts{supervisors: 2, agents: 1, schedulers: 1})
	p := g.pipeline
	orders := func() int { return p.count(t, `SELECT count(*) FROM orders WHERE workflow = 'tick'`) }
	// make test: 18 ticks in three parts (a part, 6 s, outlasts a
	// killed leader's lease of 1 s six times); SAS_SCHEDULE_TICKS=120 for
	// two minutes.
	part := scaleFromEnv(t, "SAS_SCHEDULE_TICKS", 18) / 3
	for range 2 {
		// Let it tick a part's worth, then kill the leader (whichever
		// leads then: on a loaded machine the lease may have changed hands).
		base := orders()
		testenv.Eventually(t, 2*time.Minute, "more ticks", func() bool { return orders() >= base+part })
		leaderOf(t, p).kill(t)
		p.startSupervisor(t, "SAS_WORKFLOWS_FILE="+g.file)
	}
	base := orders()
	testenv.Eventually(t, 2*time.Minute, "more ticks", func() bool { return orders() >= base+part })
	if out, errOut, code := sasctl(t, p.env, "schedules", "pause", "every_second", "--as", "ann"); code != 0 || !strings.Contains(out, "paused") {
		t.Fatalf("pause: exit %d\n%s%s", code, out, errOut)
	}
	// The ticks handled: from the first order's (each order's history
	// names its tick) to the schedule's last.
	var firstActor string
	var lastTick time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT (SELECT min(actor) FROM transitions WHERE to_state = 'received' AND step IS NULL
		AND actor LIKE 'schedule:every_second (tick %'), last_tick FROM schedules WHERE name = 'every_second'`).Scan(&firstActor, &lastTick); err != nil {
		t.Fatal(err)
	}
	firstTick, err := time.Parse(time.RFC3339, strings.TrimSuffix(strings.TrimPrefix(firstActor, "schedule:every_second (tick "), ")"))
	if err != nil {
		t.Fatalf("the first order's actor %q: %v", firstActor, err)
	}
	var want []string
	for tk := firstTick; !tk.After(lastTick); tk = tk.Add(time.Second) {
		want = append(want, messages.DerivedID("schedule:every_second:"+tk.UTC().Format(time.RFC3339Nano)))
	}
	have := p.count(t, `SELECT count(*) FROM orders WHERE order_id = ANY($1::uuid[])`, want)
	all := orders()
	t.Logf("%d ticks from %s to %s; %d orders of them, %d orders in all", len(want), firstTick.Format(time.TimeOnly), lastTick.Format(time.TimeOnly), have, all)
	if len(want) < 3*part || have != len(want) || all != len(want) {
		t.Fatalf("%d ticks, %d of them with their order, %d orders in all: want one order per tick and no other", len(want), have, all)
	}
	if n := p.count(t, `SELECT count(*) FROM transitions WHERE order_id = ANY($1::uuid[]) AND to_state = 'received' AND actor LIKE 'schedule:every_second%'`, want); n != len(want) {
		t.Fatalf("%d orders say the schedule started them", n)
	}
	p.waitTerminal(t, want, time.Minute)

	// Paused, it starts nothing more (for three of its seconds on the
	// database clock); a trigger still does, once.
	var pausedAt time.Time
	if err := p.pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "three seconds to pass", func() bool {
		var now time.Time
		return p.pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&now) == nil && now.Sub(pausedAt) >= 3*time.Second
	})
	if n := orders(); n != all {
		t.Fatalf("a paused schedule started %d orders", n-all)
	}
	out, errOut, code := sasctl(t, p.env, "schedules", "trigger", "yearly", "--as", "ann")
	if code != 0 || !strings.Contains(out, "started") {
		t.Fatalf("trigger: exit %d\n%s%s", code, out, errOut)
	}
	if n := p.count(t, `SELECT count(*) FROM orders WHERE workflow = 'tick' AND payload->>'kind' = 'year'`); n != 1 {
		t.Fatalf("%d orders of the triggered schedule", n)
	}
	out, _, code = sasctl(t, p.env, "schedules", "list")
	if code != 0 || !strings.Contains(out, "every_second") || !strings.Contains(out, "paused by operator:") || !strings.Contains(out, "as ann") ||
		!strings.Contains(out, "Europe/Berlin") {
		t.Fatalf("schedules list:\n%s", out)
	}
	// The console: an operator sees the schedules and starts one, behind
	// a confirmation.
	c := startConsole(t, p.stack)
	ctx := browser(t)
	login(t, ctx, c.url, "alice", "alice's password")
	do(t, ctx, "open the schedules", chromedp.Navigate(c.url+"/schedules"), chromedp.WaitVisible(chromedp.CSS("#schedule-yearly")))
	if got := text(t, ctx, "#schedule-every_second .state"); !strings.Contains(got, "paused") || !strings.Contains(got, "as ann") {
		t.Fatalf("the paused schedule's state reads %q", got)
	}
	do(t, ctx, "start yearly now", chromedp.Click(chromedp.CSS(`#schedule-yearly a[href$="/trigger"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm-button")),
		chromedp.Click(chromedp.CSS("#confirm-button")), chromedp.WaitVisible(chromedp.CSS("#notice")))
	testenv.Eventually(t, 30*time.Second, "the console's triggered order", func() bool {
		return p.count(t, `SELECT count(*) FROM orders WHERE workflow = 'tick' AND payload->>'kind' = 'year'`) == 2
	})
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE action IN ('schedule pause', 'schedule trigger')`); n != 3 {
		t.Fatalf("%d operator actions recorded, want 3", n)
	}
	if n := p.count(t, `SELECT count(*) FROM operator_actions WHERE action = 'schedule trigger' AND claimed_by = 'console:alice'`); n != 1 {
		t.Fatalf("the console's trigger is not recorded with its user (%d)", n)
	}
}
