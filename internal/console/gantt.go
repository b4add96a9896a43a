package console

import (
	"cmp"
	"fmt"
	"time"

	"sas/internal/statestore"
)

// The order page's timeline: a row a step, a bar for each span it spent
// working or waiting (an attempt from its claim to its end, a wait for a
// signal or a child order, a timer), drawn on the server as SVG (no
// script), the order's life from left to right. The instances of a
// for_each step are one row: a bar from the first one's start to the last
// one's end, with their count.
const (
	ganttW, ganttRow, ganttLabel = 900.0, 18.0, 180.0
	ganttMaxRows                 = 80
)

type ganttBar struct {
	X, W  string
	Class string // attempt, wait, timer; ok, failed, running
	Title string
}

type ganttRowView struct {
	Y, TextY string
	Label    string
	Bars     []ganttBar
}

type gantt struct {
	Height, Width string
	Span          string // the order's life, as a label
	Rows          []ganttRowView
	More          int // rows left out past ganttMaxRows
}

type span struct {
	start, end time.Time
	kind       string // attempt, wait, timer
	outcome    string // ok, failed, running
	attempt    int
}

// spanKind is what a step does in a state: nothing drawn for a state it
// only passes.
func spanKind(state string) string {
	switch state {
	case statestore.StepProcessing:
		return "attempt"
	case statestore.StepAwaiting:
		return "wait"
	case statestore.StepDelayed:
		return "timer"
	}
	return ""
}

// buildGantt reads the spans of every step from the order's history; a
// span still open ends at now.
func buildGantt(d statestore.OrderDetail, now time.Time) *gantt {
	if len(d.History) == 0 {
		return nil
	}
	spans := map[int][]span{}
	open := map[int]*span{}
	for _, t := range d.History {
		if t.Step == nil || t.From == t.To { // a 202 holding an attempt open is no new span
			continue
		}
		n := *t.Step
		if s := open[n]; s != nil {
			s.end = t.At
			switch {
			case t.To == statestore.StepError || t.To == statestore.StepCancelled:
				s.outcome = "failed"
			case s.kind == "attempt" && (t.To == statestore.StepPending || t.To == statestore.StepWaiting):
				s.outcome = "failed" // ran out, or handed back: tried again
			default:
				s.outcome = "ok"
			}
			spans[n] = append(spans[n], *s)
			delete(open, n)
		}
		if k := spanKind(t.To); k != "" {
			open[n] = &span{start: t.At, kind: k, outcome: "running", attempt: t.Attempt}
		}
	}
	for n, s := range open {
		s.end = now
		spans[n] = append(spans[n], *s)
	}
	begin := d.Order.CreatedAt
	end := begin
	for _, ss := range spans {
		for _, s := range ss {
			end = later(end, s.end)
		}
	}
	total := end.Sub(begin)
	if total <= 0 {
		total = time.Millisecond
	}
	x := func(t time.Time) float64 {
		return ganttLabel + float64(t.Sub(begin))/float64(total)*(ganttW-ganttLabel)
	}
	bar := func(s span, title string) ganttBar {
		x0, x1 := x(s.start), x(s.end)
		return ganttBar{X: fmt.Sprintf("%.1f", x0), W: fmt.Sprintf("%.1f", max(x1-x0, 2)), Class: s.kind + " " + s.outcome, Title: title}
	}
	g := &gantt{Width: fmt.Sprintf("%.0f", ganttW), Span: dur(total)}
	instances := map[int][]span{}
	count := map[int]int{}
	for _, st := range d.Steps {
		if st.Parent > 0 && st.Kind == statestore.KindAction {
			instances[st.Parent] = append(instances[st.Parent], spans[st.Step]...)
			count[st.Parent]++
		}
	}
	for _, st := range d.Steps {
		if st.Parent > 0 {
			continue
		}
		name := cmp.Or(st.ID, st.Name)
		var bars []ganttBar
		for _, s := range spans[st.Step] {
			what := s.kind
			if s.kind == "attempt" {
				what = fmt.Sprintf("attempt %d", s.attempt)
			}
			bars = append(bars, bar(s, fmt.Sprintf("%s %s: %s, %s", name, what, dur(s.end.Sub(s.start)), s.outcome)))
		}
		label := fmt.Sprintf("%d. %s", st.Step, name)
		if ins := instances[st.Step]; len(ins) > 0 {
			all := span{start: ins[0].start, end: ins[0].end, kind: "attempt", outcome: "ok"}
			for _, s := range ins {
				if s.start.Before(all.start) {
					all.start = s.start
				}
				all.end = later(all.end, s.end)
				if s.outcome != "ok" {
					all.outcome = s.outcome
				}
			}
			label += fmt.Sprintf(" ×%d", count[st.Step])
			bars = append(bars, bar(all, fmt.Sprintf("%s: %d instances, %s from the first to the last", name, count[st.Step], dur(all.end.Sub(all.start)))))
		}
		if len(bars) == 0 {
			continue
		}
		if len(g.Rows) == ganttMaxRows {
			g.More++
			continue
		}
		y := float64(len(g.Rows)) * ganttRow
		g.Rows = append(g.Rows, ganttRowView{Y: fmt.Sprintf("%.0f", y+3), TextY: fmt.Sprintf("%.0f", y+13), Label: label, Bars: bars})
	}
	if len(g.Rows) == 0 {
		return nil
	}
	g.Height = fmt.Sprintf("%.0f", float64(len(g.Rows))*ganttRow+4)
	return g
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
