package console

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"sas/internal/statestore"
)

// The overview's charts: the last hour of each busy workflow, a point a
// minute, drawn on the server as SVG polylines (no script).
const (
	chartMinutes   = 60
	chartWorkflows = 6 // the busiest, by orders ended and steps pending
	chartW, chartH = 300.0, 60.0
)

type chartLine struct {
	Name, Class string
	Points      string // SVG polyline points
	Last        string // the last minute's value, as a label
	// Peak is the hour's largest value, as a label: beside a quiet last
	// minute it says what the hour held.
	Peak string
	// DotX, DotY mark the latest point (a line of one point draws
	// nothing); HasDot is false for a line without points.
	DotX, DotY string
	HasDot     bool
}

type chart struct {
	Title string
	Top   string // the value of the chart's top edge
	Lines []chartLine
}

type workflowCharts struct {
	Workflow          string
	Completed, Failed int // over the hour
	Charts            []chart
}

// buildCharts turns the overview's minutes into the charts of the
// busiest workflows, oldest minute left, the minute of now right.
func buildCharts(rows []statestore.OverviewMinute, now time.Time) []workflowCharts {
	end := now.Truncate(time.Minute)
	start := end.Add(-(chartMinutes - 1) * time.Minute)
	type series struct {
		completed, failed, pending []float64
		p50, p95                   []float64 // -1: no completed order that minute
		busy                       int
	}
	by := map[string]*series{}
	for _, r := range rows {
		i := int(r.Minute.Sub(start) / time.Minute)
		if i < 0 || i >= chartMinutes {
			continue
		}
		s := by[r.Workflow]
		if s == nil {
			s = &series{completed: make([]float64, chartMinutes), failed: make([]float64, chartMinutes), pending: make([]float64, chartMinutes),
				p50: filled(-1), p95: filled(-1)}
			by[r.Workflow] = s
		}
		s.completed[i], s.failed[i], s.pending[i] = float64(r.Completed), float64(r.Failed), float64(r.Pending)
		if r.P50 != nil && r.P95 != nil {
			s.p50[i], s.p95[i] = r.P50.Seconds(), r.P95.Seconds()
		}
		s.busy += r.Completed + r.Failed + r.Pending
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		if by[names[i]].busy != by[names[j]].busy {
			return by[names[i]].busy > by[names[j]].busy
		}
		return names[i] < names[j]
	})
	var out []workflowCharts
	for _, n := range names[:min(len(names), chartWorkflows)] {
		s := by[n]
		wc := workflowCharts{Workflow: n, Completed: int(sum(s.completed)), Failed: int(sum(s.failed))}
		count := func(v float64) string { return strconv.Itoa(int(v)) }
		secs := func(v float64) string {
			if v < 0 {
				return "–"
			}
			return dur(time.Duration(v * float64(time.Second)))
		}
		wc.Charts = []chart{
			newChart("orders a minute", count, []string{"completed", "failed"}, []string{"ok", "bad"}, s.completed, s.failed),
			newChart("submit → end", secs, []string{"p50", "p95"}, []string{"p50", "p95"}, s.p50, s.p95),
			newChart("steps pending", count, []string{"pending"}, []string{"pending"}, s.pending),
		}
		out = append(out, wc)
	}
	return out
}

func filled(v float64) []float64 {
	s := make([]float64, chartMinutes)
	for i := range s {
		s[i] = v
	}
	return s
}

func sum(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}

// newChart scales the series to one top (the largest value, at least 1)
// and writes each as polyline points; a negative value is no value (the
// line skips the minute).
func newChart(title string, label func(float64) string, names, classes []string, series ...[]float64) chart {
	top := 0.0
	for _, s := range series {
		for _, v := range s {
			top = max(top, v)
		}
	}
	if top <= 0 {
		top = 1
	}
	c := chart{Title: title, Top: label(top)}
	for k, s := range series {
		var b strings.Builder
		peak := -1.0
		for _, v := range s {
			peak = max(peak, v)
		}
		line := chartLine{Name: names[k], Class: classes[k], Last: label(s[len(s)-1]), Peak: label(max(peak, 0))}
		for i, v := range s {
			if v < 0 {
				continue
			}
			x := float64(i) * chartW / (chartMinutes - 1)
			y := chartH - v/top*chartH
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
			line.DotX, line.DotY, line.HasDot = fmt.Sprintf("%.1f", x), fmt.Sprintf("%.1f", y), true
		}
		line.Points = strings.TrimSpace(b.String())
		c.Lines = append(c.Lines, line)
	}
	return c
}
