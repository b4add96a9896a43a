package supervisor

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"

	"github.com/prometheus/client_golang/prometheus"
)

// TestPlanScheduleFollowsOverlapAndCatchUp: on a fixed clock, the ticks
// missed over five minutes of an every-minute schedule start orders as
// catch_up says (all of them, the newest, or none once the newest is a
// minute late), overlap: skip starts none while the last order runs and
// at most one otherwise, a trigger starts one whatever the overlap, each
// order's id is the one its tick derives, and the next tick is the first
// after now.
func TestPlanScheduleFollowsOverlapAndCatchUp(t *testing.T) {
	t.Parallel()
	file := func(overlap, catchUp string, cron ...string) *workflow.Registry {
		expr := "* * * * *"
		if len(cron) > 0 {
			expr = cron[0]
		}
		r, err := workflow.Parse("s.yaml", []byte(`
workflows:
  - name: tick
    steps:
      - {action: a, agent: x}
schedules:
  - {name: m, cron: "`+expr+`", workflow: tick, overlap: `+overlap+`, catch_up: `+catchUp+`}
`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	next := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	now := next.Add(4*time.Minute + 30*time.Second) // ticks 10:00 … 10:04 are due
	row := func(r *workflow.Registry, lastStatus string) statestore.ScheduleRow {
		sc := r.Schedules()[0]
		return statestore.ScheduleRow{Name: "m", Workflow: "tick", Version: sc.Version(), NextTick: next, LastOrderStatus: lastStatus}
	}
	id := func(tk time.Time) string {
		return messages.DerivedID("schedule:m:" + tk.UTC().Format(time.RFC3339Nano))
	}
	for _, tc := range []struct {
		overlap, catchUp, last string
		at                     time.Time
		want                   []time.Time
		cron                   string
	}{
		{"allow", "all", "", now, []time.Time{next, next.Add(time.Minute), next.Add(2 * time.Minute), next.Add(3 * time.Minute), next.Add(4 * time.Minute)}, ""},
		{"allow", "last", "", now, []time.Time{next.Add(4 * time.Minute)}, ""},
		{"allow", "none", "", now, []time.Time{next.Add(4 * time.Minute)}, ""},                      // the newest is 30 s late
		{"allow", "none", "", next.Add(90 * time.Minute), []time.Time{}, "0 * * * *"},               // hourly: 11:00 is 30 min late: none
		{"skip", "all", statestore.OrderProcessing, now, []time.Time{}, ""},                         // the last order runs
		{"skip", "all", statestore.OrderCompleted, now, []time.Time{next.Add(4 * time.Minute)}, ""}, // one, not five overlapping
	} {
		r := file(tc.overlap, tc.catchUp, cmp.Or(tc.cron, "* * * * *"))
		s := &sweeper{workflows: r, me: "test"}
		round := s.planSchedule(tc.at, row(r, tc.last))
		var got []string
		for _, st := range round.Starts {
			got = append(got, st.Order.OrderID)
		}
		var want []string
		for _, tk := range tc.want {
			want = append(want, id(tk))
		}
		if len(got) != len(want) || (len(want) > 0 && got[len(got)-1] != want[len(want)-1]) || (len(want) > 0 && got[0] != want[0]) {
			t.Errorf("overlap %s, catch_up %s, last order %q at %s: started %d orders %v, want %v", tc.overlap, tc.catchUp, tc.last,
				tc.at.Format(time.TimeOnly), len(got), got, want)
		}
		if !round.NextTick.After(tc.at) || round.NextTick.Sub(tc.at) > time.Hour {
			t.Errorf("overlap %s, catch_up %s: next tick %s after %s", tc.overlap, tc.catchUp, round.NextTick, tc.at)
		}
		if tc.cron == "" && round.Skipped+len(round.Starts) < 5 {
			t.Errorf("overlap %s, catch_up %s: %d started and %d skipped of at least 5 ticks", tc.overlap, tc.catchUp, len(round.Starts), round.Skipped)
		}
	}
	// A trigger starts one whatever the overlap, and asks for no tick.
	r := file("skip", "last")
	s := &sweeper{workflows: r, me: "test"}
	trig := now.Add(-time.Second)
	d := row(r, statestore.OrderProcessing)
	d.NextTick, d.TriggerAt = now.Add(30*time.Second), &trig
	round := s.planSchedule(now, d)
	if len(round.Starts) != 1 || !round.ClearTrigger || round.Starts[0].Order.OrderID != messages.DerivedID("schedule:m:trigger:"+trig.UTC().Format(time.RFC3339Nano)) ||
		!round.NextTick.Equal(d.NextTick) {
		t.Fatalf("a trigger: %+v", round)
	}
}

// TestASchedulesKeptInOnePartition: the supervisors of three partitions
// each keep only the schedules their partition owns, so that every
// schedule of the file is kept, and fires, in exactly one of them.
func TestASchedulesKeptInOnePartition(t *testing.T) {
	t.Parallel()
	yaml := "workflows:\n  - name: tick\n    steps:\n      - {action: a, agent: inventory}\nschedules:\n"
	var names []string
	for i := range 12 {
		name := fmt.Sprintf("every-%d", i)
		names = append(names, name)
		yaml += fmt.Sprintf("  - {name: %s, workflow: tick, cron: \"*/5 * * * *\"}\n", name)
	}
	r, err := workflow.Parse("s.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "partitions.yaml")
	layout := "exchange: sas.route\npartitions:\n"
	for i := 1; i <= 3; i++ {
		layout += fmt.Sprintf("  - {name: p%d, queue_prefix: sas.p%d., database_url_env: SAS_P%d_URL}\n", i, i, i)
	}
	if err := os.WriteFile(file, []byte(layout), 0o600); err != nil {
		t.Fatal(err)
	}
	kept := map[string]int{}
	for i := 1; i <= 3; i++ {
		_, pool := testenv.Database(t)
		var cfg Config
		cfg.PartitionsFile, cfg.Partition, cfg.QueuePrefix = file, fmt.Sprintf("p%d", i), fmt.Sprintf("sas.p%d.", i)
		s := &sweeper{store: statestore.New(pool), cfg: cfg, workflows: r, me: "test",
			logger: slog.New(slog.NewTextHandler(io.Discard, nil)), metrics: newMetrics(prometheus.NewRegistry())}
		if err := s.syncSchedules(t.Context()); err != nil {
			t.Fatal(err)
		}
		rows, err := s.store.Schedules(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range rows {
			if row.InFile {
				kept[row.Name]++
			}
		}
	}
	for _, name := range names {
		if kept[name] != 1 {
			t.Errorf("schedule %s is kept in %d partitions, want 1", name, kept[name])
		}
	}
}
