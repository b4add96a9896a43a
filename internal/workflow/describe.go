package workflow

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind names what a step is in a person's words: an action (an agent
// calls a service), a wait (for a signal), a timer (a delay alone) or a
// sub-process (a child order).
func (st Step) Kind() string {
	switch {
	case st.Agent != "":
		return "action"
	case st.Wait != nil:
		return "wait"
	case st.Workflow != "":
		return "sub-process"
	}
	return "timer"
}

// Does says what the step does: which agent it calls, which signal it
// waits for and how long, how long its timer lasts, which workflow it
// runs; then for which items and under which condition.
func (st Step) Does() string {
	var s string
	switch st.Kind() {
	case "action":
		s = "calls " + st.Agent + " (" + DurationText(st.Timeout) + " an attempt)"
		if st.Delay > 0 {
			s = "after " + DurationText(st.Delay) + ", " + s
		}
	case "wait":
		then := "then fails"
		if st.Wait.OnTimeout == "skip" {
			then = "then is skipped"
		}
		s = fmt.Sprintf("waits for signal %s, at most %s, %s", st.Wait.Signal, DurationText(st.Wait.Timeout), then)
		if st.Delay > 0 {
			s = "after " + DurationText(st.Delay) + ", " + s
		}
	case "sub-process":
		s = "runs workflow " + st.Workflow
	default:
		s = "waits " + DurationText(st.Delay)
	}
	if st.ForEach != "" {
		s += "; for each of " + st.ForEach
	}
	if st.When != "" {
		s += "; when " + st.When
	}
	return s
}

// After says which steps this one waits for: "" at the start of a graph
// or in a list, "a, b", or "any 2 of a, b, c" for an N-of-M join.
func (st Step) After() string {
	if len(st.Needs) == 0 {
		return ""
	}
	if q := st.Quorum(); q != "" {
		return q + " of " + strings.Join(st.Needs, ", ")
	}
	return strings.Join(st.Needs, ", ")
}

// DurationText writes d as a person does: 2h, 10m, 90s, 1.5s, 200ms.
func DurationText(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d < time.Second:
		return d.String()
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
}

// After says which steps the workflow's step i waits for: in a graph its
// needs (Step.After), in a list the step before it ("" for the first).
func (w Workflow) After(i int) string {
	switch {
	case i < 0 || i >= len(w.Steps):
		return ""
	case w.Graph:
		return w.Steps[i].After()
	case i == 0:
		return ""
	}
	return w.Steps[i-1].Ref()
}
