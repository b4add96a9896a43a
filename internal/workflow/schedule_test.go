package workflow_test

import (
	"strings"
	"testing"
	"time"

	"sas/internal/workflow"
)

// ticks lists the schedule's ticks after from, up to to.
func ticks(s workflow.Schedule, from, to time.Time) []time.Time {
	var out []time.Time
	for t := s.Next(from); !t.After(to); t = s.Next(t) {
		out = append(out, t)
	}
	return out
}

// TestTicksOverDaylightSaving: on a fixed clock, a daily tick at 02:30 in
// Europe/Berlin fires once on the night the clocks skip 02:00-03:00 (in
// the hour after the gap) and once on the night 02:00-03:00
// comes twice; an hourly tick fires once in the repeated hour too.
func TestTicksOverDaylightSaving(t *testing.T) {
	t.Parallel()
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	daily, err := workflow.ParseTicks("30 2 * * *", "Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	// Spring: 2026-03-29, 02:00 CET becomes 03:00 CEST.
	got := ticks(daily, time.Date(2026, 3, 28, 12, 0, 0, 0, berlin), time.Date(2026, 3, 30, 12, 0, 0, 0, berlin))
	if len(got) != 2 || got[0].In(berlin).Day() != 29 || got[0].In(berlin).Hour() != 3 || !got[1].Equal(time.Date(2026, 3, 30, 2, 30, 0, 0, berlin)) {
		t.Fatalf("spring ticks %v, want one in the hour after the gap on the 29th (02:30 does not exist) and 02:30 on the 30th", got)
	}
	// Autumn: 2026-10-25, 03:00 CEST becomes 02:00 CET: 02:30 comes twice.
	got = ticks(daily, time.Date(2026, 10, 24, 12, 0, 0, 0, berlin), time.Date(2026, 10, 26, 12, 0, 0, 0, berlin))
	if len(got) != 2 || got[0].In(berlin).Hour() != 2 || got[0].In(berlin).Day() != 25 || got[1].In(berlin).Day() != 26 {
		t.Fatalf("autumn ticks %v, want 02:30 once on the 25th and once on the 26th", got)
	}
	hourly, _ := workflow.ParseTicks("15 * * * *", "Europe/Berlin")
	got = ticks(hourly, time.Date(2026, 10, 25, 0, 0, 0, 0, berlin), time.Date(2026, 10, 25, 5, 0, 0, 0, berlin))
	seen := map[int]int{}
	for _, tk := range got {
		seen[tk.In(berlin).Hour()]++
	}
	if seen[2] != 1 || len(got) != 5 {
		t.Fatalf("hourly ticks over the repeated hour %v: 02:15 %d times, %d ticks, want once and 5 (00 01 02 03 04)", got, seen[2], len(got))
	}
}

// TestEveryTicksAreTheSameForEveryone: @every ticks are the multiples of
// the period since the epoch, whenever one starts counting.
func TestEveryTicksAreTheSameForEveryone(t *testing.T) {
	t.Parallel()
	s, err := workflow.ParseTicks("@every 10m", "")
	if err != nil {
		t.Fatal(err)
	}
	a := s.Next(time.Date(2026, 5, 1, 10, 3, 7, 0, time.UTC))
	b := s.Next(time.Date(2026, 5, 1, 10, 9, 59, 0, time.UTC))
	if !a.Equal(time.Date(2026, 5, 1, 10, 10, 0, 0, time.UTC)) || !a.Equal(b) || !s.Next(a).Equal(a.Add(10*time.Minute)) {
		t.Fatalf("ticks %v %v", a, b)
	}
	for expr, want := range map[string]string{
		"@every 100ms":   "whole seconds",
		"@every 1500ms":  "whole seconds",
		"0 0 30 2 *":     "matches no date",
		"61 * * * *":     "write 5 fields",
		"TZ=UTC * * * *": "give the time zone in timezone",
	} {
		if _, err := workflow.ParseTicks(expr, ""); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", expr, err, want)
		}
	}
	if _, err := workflow.ParseTicks("* * * * *", "Mars/Olympus"); err == nil || !strings.Contains(err.Error(), "IANA") {
		t.Errorf("an unknown zone: %v", err)
	}
}

// TestSchedulesInTheFile: schedules are read with their defaults, and
// each mistake is refused at its line.
func TestSchedulesInTheFile(t *testing.T) {
	t.Parallel()
	const head = "workflows:\n  - name: statements\n    payload_schema: {type: object, required: [kind]}\n    steps:\n      - {action: a, agent: x}\n"
	r, err := workflow.Parse("f.yaml", []byte(head+`schedules:
  - name: monthly
    cron: "0 6 1 * *"
    timezone: Europe/Berlin
    workflow: statements
    payload: {kind: monthly}
    overlap: allow
    catch_up: all
  - {name: often, cron: "@every 10m", workflow: statements, payload: {kind: x}, namespace: team-a}
`))
	if err != nil {
		t.Fatal(err)
	}
	ss := r.Schedules()
	if len(ss) != 2 || ss[0].Name != "monthly" || ss[0].Overlap != "allow" || ss[0].CatchUp != "all" || string(ss[0].Payload) != `{"kind":"monthly"}` ||
		ss[1].Timezone != "UTC" || ss[1].Overlap != "skip" || ss[1].CatchUp != "last" || ss[0].Version() == ss[1].Version() ||
		ss[0].Namespace != "" || ss[1].Namespace != "team-a" {
		t.Fatalf("schedules %+v", ss)
	}
	for _, tc := range []struct{ desc, text, want string }{
		{"unknown workflow", "schedules:\n  - {name: s, cron: '* * * * *', workflow: nope}\n", `workflow "nope" is not in the file`},
		{"bad cron", "schedules:\n  - {name: s, cron: 'every day', workflow: statements, payload: {kind: x}}\n", "write 5 fields"},
		{"bad zone", "schedules:\n  - {name: s, cron: '* * * * *', timezone: Nowhere, workflow: statements, payload: {kind: x}}\n", "IANA"},
		{"payload against the schema", "schedules:\n  - {name: s, cron: '* * * * *', workflow: statements}\n", "does not suit workflow statements"},
		{"bad overlap", "schedules:\n  - {name: s, cron: '* * * * *', workflow: statements, payload: {kind: x}, overlap: queue}\n", "not skip or allow"},
		{"bad namespace", "schedules:\n  - {name: s, cron: '* * * * *', workflow: statements, payload: {kind: x}, namespace: Team_A}\n", `schedule's namespace "Team_A" is not a name`},
		{"bad catch_up", "schedules:\n  - {name: s, cron: '* * * * *', workflow: statements, payload: {kind: x}, catch_up: some}\n", "not none, last or all"},
		{"twice", "schedules:\n  - {name: s, cron: '* * * * *', workflow: statements, payload: {kind: x}}\n  - {name: s, cron: '* * * * *', workflow: statements, payload: {kind: x}}\n", "defined twice"},
	} {
		_, err := workflow.Parse("f.yaml", []byte(head+tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.desc, err, tc.want)
		}
	}
}
