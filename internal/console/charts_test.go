package console

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sas/internal/statestore"
)

// TestChartsDrawTheLastHour: each minute is a point, oldest left and now
// right, scaled to the largest value; a minute without completed orders
// has no latency point; the busiest workflows come first, at most
// chartWorkflows of them; minutes outside the hour are left out.
func TestChartsDrawTheLastHour(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 30, 20, 0, time.UTC)
	minute := func(ago int) time.Time { return now.Truncate(time.Minute).Add(-time.Duration(ago) * time.Minute) }
	p := func(d time.Duration) *time.Duration { return &d }
	rows := []statestore.OverviewMinute{
		{Minute: minute(59), Workflow: "shop", Completed: 10, Failed: 1, P50: p(time.Second), P95: p(2 * time.Second)},
		{Minute: minute(0), Workflow: "shop", Completed: 20, Pending: 4, P50: p(500 * time.Millisecond), P95: p(4 * time.Second)},
		{Minute: minute(60), Workflow: "shop", Completed: 1000}, // out of the hour
		{Minute: minute(3), Workflow: "quiet", Completed: 1},
	}
	for i := range 8 {
		rows = append(rows, statestore.OverviewMinute{Minute: minute(1), Workflow: fmt.Sprintf("w%d", i), Completed: 2})
	}
	got := buildCharts(rows, now)
	if len(got) != chartWorkflows || got[0].Workflow != "shop" || got[0].Completed != 30 || got[0].Failed != 1 {
		t.Fatalf("workflows %+v", got)
	}
	for _, wc := range got {
		if wc.Workflow == "quiet" {
			t.Fatalf("the quietest workflow is drawn: %+v", got)
		}
	}
	orders, latency, pending := got[0].Charts[0], got[0].Charts[1], got[0].Charts[2]
	if orders.Top != "20" || len(orders.Lines) != 2 {
		t.Fatalf("orders chart %+v", orders)
	}
	completed := strings.Fields(orders.Lines[0].Points)
	if len(completed) != chartMinutes || completed[0] != "0.0,30.0" || completed[59] != "300.0,0.0" || completed[30] != "152.5,60.0" {
		t.Fatalf("completed points %v", completed)
	}
	if p50 := strings.Fields(latency.Lines[0].Points); len(p50) != 2 || p50[0] != "0.0,45.0" || p50[1] != "300.0,52.5" {
		t.Fatalf("p50 points %v (top %s)", p50, latency.Top)
	}
	if l := latency.Lines[0]; !l.HasDot || l.DotX != "300.0" || l.DotY != "52.5" {
		t.Fatalf("the p50 line's latest point %+v", l)
	}
	if latency.Top != "4s" || latency.Lines[1].Last != "4s" {
		t.Fatalf("latency chart %+v", latency)
	}
	if pending.Lines[0].Last != "4" || pending.Top != "4" {
		t.Fatalf("pending chart %+v", pending)
	}
	if got := buildCharts(nil, now); len(got) != 0 {
		t.Fatalf("no rows drew %+v", got)
	}
}

// TestChartLegendsSayTheHoursPeak: beside a quiet last minute, a legend
// says what the hour held: a spike of 3,000 completed orders reads as the
// peak, not only the last minute's 0.
func TestChartLegendsSayTheHoursPeak(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 30, 20, 0, time.UTC)
	spike := now.Truncate(time.Minute).Add(-20 * time.Minute)
	got := buildCharts([]statestore.OverviewMinute{{Minute: spike, Workflow: "shop", Completed: 3000}}, now)
	if len(got) != 1 {
		t.Fatalf("workflows %+v", got)
	}
	completed := got[0].Charts[0].Lines[0]
	if completed.Last != "0" || completed.Peak != "3000" {
		t.Fatalf("the completed line's legend: last %q, peak %q", completed.Last, completed.Peak)
	}
}

// TestTimesSayTheirZone: every time the console writes says it is UTC,
// and a schedule's next tick reads in the schedule's own zone too.
func TestTimesSayTheirZone(t *testing.T) {
	at := time.Date(2026, 11, 24, 7, 0, 0, 0, time.UTC)
	if got := stamp(at); got != "2026-11-24 07:00:00.000 UTC" {
		t.Fatalf("stamp %q", got)
	}
	if got := inZone(at, "Europe/Paris"); got != "2026-11-24 08:00 CET" {
		t.Fatalf("in Paris %q", got)
	}
	if got := inZone(at, "Nowhere/Else"); got != "" {
		t.Fatalf("in an unknown zone %q", got)
	}
}
