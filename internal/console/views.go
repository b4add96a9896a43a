package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"sas/internal/statestore"
)

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"stamp":  stamp,
		"inZone": inZone,
		"dur":    dur,
		"pretty": pretty,
		"short":  func(id string) string { return id[:min(8, len(id))] },
		"since":  func(t, from time.Time) string { return "+" + dur(t.Sub(from)) },
		"deref":  func(p *int) int { return *p },
		"inc":    func(i int) int { return i + 1 },
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimPrefix(n, "templates/")
		if base == "layout.html" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", base, err)
		}
		pages[base] = t
	}
	return pages, nil
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000") + " UTC"
}

// inZone writes t in the time zone zone (an IANA name, as a schedule's
// timezone), to the minute, with the zone's abbreviation; "" when t is
// zero or the zone is not known here.
func inZone(t time.Time, zone string) string {
	loc, err := time.LoadLocation(zone)
	if t.IsZero() || err != nil {
		return ""
	}
	return t.In(loc).Format("2006-01-02 15:04 MST")
}

// dur writes a duration to the millisecond (to the microsecond below one).
func dur(d time.Duration) string {
	switch {
	case d < time.Millisecond && d > -time.Millisecond:
		return d.Round(time.Microsecond).String()
	case d < time.Minute && d > -time.Minute:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// pretty indents JSON for reading; html/template escapes it on the page.
func pretty(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// validID reports whether id is a UUID as orders are keyed.
func validID(id string) bool { return uuidRE.MatchString(id) }

// event is one entry of a step's timeline.
type event struct {
	At     time.Time
	Label  string
	Class  string // claimed, replied, expired, reset, failed, cancelled, compensated, operator
	Actor  string
	Reason string
}

// stepView is a step with its timeline.
type stepView struct {
	statestore.Step
	Timeline []event
	// Live: pending or processing, so its failure count and lock are the
	// current attempt's; Failures is how often it failed in all, resubmits
	// too, from its history.
	Live     bool
	Failures int
	// CanResubmit: an operator may put it back to work (see resubmittable).
	CanResubmit bool
	// CanRunAgain: an operator may run it again, with what depends on it
	// (see mayRunAgain).
	CanRunAgain bool
	// CanSignal: it awaits a signal an operator may send.
	CanSignal bool
	// Shown is the state it is shown in (shownState).
	Shown string
}

// timeline reads a step's history into events: each claim (the request
// sent to its agent), reply, expiry, reset, failure, cancel, and the
// operator's resubmits. held says what a failure leads to: the order
// held in error for an operator (policy hold, or a compensation), or
// else undone.
func timeline(st statestore.Step, history []statestore.Transition, held bool) []event {
	var out []event
	for _, t := range history {
		if t.Step == nil || *t.Step != st.Step {
			continue
		}
		e := event{At: t.At, Actor: t.Actor, Reason: t.Reason}
		operator := strings.HasPrefix(t.Actor, "operator:")
		switch {
		case operator:
			e.Label, e.Class = fmt.Sprintf("%s → %s by %s", dash(t.From), t.To, operatorName(t)), "operator"
		case t.To == statestore.StepProcessing && st.Agent != "":
			e.Label, e.Class = fmt.Sprintf("claimed, attempt %d sent to agent.%s", t.Attempt, st.Agent), "claimed"
		case t.To == statestore.StepProcessing:
			e.Label, e.Class = fmt.Sprintf("claimed, attempt %d", t.Attempt), "claimed"
		case t.To == statestore.StepAwaiting:
			e.Label, e.Class = "waiting for signal "+st.Wait, "claimed"
		case t.From == statestore.StepProcessing && t.To == statestore.StepProcessed && st.Kind == "compensation":
			e.Label, e.Class = "replied: compensated", "compensated"
		case t.From == statestore.StepProcessing && t.To == statestore.StepProcessed:
			e.Label, e.Class = "replied: done", "replied"
		case t.From == statestore.StepProcessing && t.To == statestore.StepPending:
			e.Label, e.Class = "expired, reset to pending", "expired"
		case t.To == statestore.StepError && held:
			e.Label, e.Class = "failed for good: the order is held for an operator", "failed"
		case t.To == statestore.StepError:
			e.Label, e.Class = "failed for good: the order's done steps are undone", "failed"
		case t.To == statestore.StepCancelled:
			e.Label, e.Class = "cancelled", "cancelled"
		case t.To == statestore.StepPending:
			e.Label, e.Class = "pending", "reset"
		default:
			e.Label, e.Class = fmt.Sprintf("%s → %s", dash(t.From), t.To), "other"
		}
		out = append(out, e)
	}
	return out
}

func operatorName(t statestore.Transition) string {
	if t.ClaimedBy != "" {
		return t.ClaimedBy + " (login " + t.DBUser + ")"
	}
	return strings.TrimPrefix(t.Actor, "operator:")
}

func dash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// failures counts the times a step failed in its history: expiries and
// failures for good, before and after any resubmit.
func failures(events []event) int {
	n := 0
	for _, e := range events {
		if e.Class == "expired" || e.Class == "failed" {
			n++
		}
	}
	return n
}

// graphNode is one action of a graph order, drawn at its level: the
// steps it runs after and, for a for_each step, its instances.
type graphNode struct {
	Step      int
	Name      string
	State     string
	After     []int  // the steps it needs; more than one: a join
	Quorum    string // for a join that runs before all of After end, how many: "any 2"
	Instances []graphNode
	Index     int
}

// graphLevels lays a graph order's actions out by level, each in the
// state it is shown in (shown: statestore.OrderDetail.ShownStates),
// branch beside branch: level 0 the steps that need none, then each step one level past
// the deepest it needs; the instances of a for_each step inside it. A
// list's order has none (nil).
func graphLevels(steps []statestore.Step, shown map[int]string) [][]graphNode {
	byStep := map[int]statestore.Step{}
	graph := false
	for _, st := range steps {
		byStep[st.Step] = st
		graph = graph || st.Needs != nil
	}
	if !graph {
		return nil
	}
	depth := map[int]int{}
	var depthOf func(n int, seen int) int
	depthOf = func(n int, seen int) int {
		if d, ok := depth[n]; ok {
			return d
		}
		d := 0
		if seen < len(steps) { // needs have no cycle; bounded all the same
			for _, m := range byStep[n].Needs {
				d = max(d, depthOf(m, seen+1)+1)
			}
		}
		depth[n] = d
		return d
	}
	state := func(st statestore.Step) string { return cmp.Or(shown[st.Step], st.ProcessState) }
	var levels [][]graphNode
	nodes := map[int]*graphNode{}
	for _, st := range steps {
		if st.Kind != statestore.KindAction || st.Parent > 0 {
			continue
		}
		d := depthOf(st.Step, 0)
		for len(levels) <= d {
			levels = append(levels, nil)
		}
		levels[d] = append(levels[d], graphNode{Step: st.Step, Name: cmp.Or(st.ID, st.Name), State: state(st), After: st.Needs, Quorum: st.Quorum()})
	}
	for d := range levels {
		for i := range levels[d] {
			nodes[levels[d][i].Step] = &levels[d][i]
		}
	}
	for _, st := range steps {
		if st.Kind == statestore.KindAction && st.Parent > 0 && st.Index != nil {
			if p := nodes[st.Parent]; p != nil {
				p.Instances = append(p.Instances, graphNode{Step: st.Step, Name: st.Name, State: state(st), Index: *st.Index})
			}
		}
	}
	return levels
}

// whyEnded says why an order failed or is held: its step in error (a
// compensation's first: it is why an order is held partly undone), with
// the step's last error and its service's last answer. "" for an order
// that did not.
func whyEnded(o statestore.Order, steps []statestore.Step) string {
	if o.Status != statestore.OrderFailed && o.Status != statestore.OrderError && o.Status != statestore.OrderCompensating {
		return ""
	}
	var failed *statestore.Step
	for i, st := range steps {
		if st.ProcessState != statestore.StepError {
			continue
		}
		if failed == nil || st.Kind == statestore.KindCompensation && failed.Kind != statestore.KindCompensation {
			failed = &steps[i]
		}
	}
	if failed == nil {
		return ""
	}
	why := fmt.Sprintf("step %d (%s) failed", failed.Step, cmp.Or(failed.ID, failed.Name))
	if failed.LastError != "" {
		why += ": " + failed.LastError
	}
	if failed.LastAnswer != "" {
		why += "; the service's last answer: " + failed.LastAnswer
	}
	return why
}
