package proctest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// Outcome is what became of a case's order.
type Outcome struct {
	Case    string
	OrderID string
	Status  string
	// Steps are the order's steps and its sub-processes' (their
	// workflow named), one per step of the workflow (a for_each's
	// instances in theirs), in the order they ended.
	Steps []StepEnd
	// Compensated are the steps undone, in the order their
	// compensations ended.
	Compensated []string
	// Reason, Detail and Results are the ending event's.
	Reason, Detail string
	Results        json.RawMessage
	// Took is the order's virtual time from its submit to its end (or
	// the case's end).
	Took time.Duration
	// Trace is what happened, each line at its virtual time.
	Trace []string
	// Err is why the case could not run to its end.
	Err error
}

// StepEnd is one step of a workflow and how it ended.
type StepEnd struct {
	Workflow string
	// Ref is the step's id, or its action.
	Ref   string
	State string
	// Why is, for a step skipped or failed, the history's reason.
	Why string
	// Instances, for a for_each step, counts its instances by state.
	Instances map[string]int
	// Compensated: its compensation ran and ended well.
	Compensated bool
	// HasWhen, Wait: the step has a when; it waits for a signal.
	HasWhen, Wait bool
	ended         time.Time
	endID         int64
}

// Read reads what became of an order of any store (a case's, or one run
// on a real stack, to compare the two): its status, its steps and its
// children's, its compensations and its ending event.
func Read(ctx context.Context, store *statestore.Store, reg *workflow.Registry, orderID string) (Outcome, error) {
	out := Outcome{OrderID: orderID}
	e := &Env{store: store, reg: reg}
	err := e.read(ctx, orderID, &out)
	return out, err
}

// read reads the order's steps, history and ending event, and its
// children's steps, into out.
func (e *Env) read(ctx context.Context, orderID string, out *Outcome) error {
	d, err := e.store.GetOrder(ctx, orderID)
	if err != nil {
		return err
	}
	out.Status = d.Order.Status
	out.Took = d.Order.UpdatedAt.Sub(d.Order.CreatedAt)
	steps, comps, err := e.steps(ctx, d, map[string]bool{})
	if err != nil {
		return err
	}
	out.Steps = steps
	slices.SortStableFunc(comps, byEnd)
	for _, c := range comps {
		if len(out.Compensated) == 0 || out.Compensated[len(out.Compensated)-1] != c.Ref {
			out.Compensated = append(out.Compensated, c.Ref)
		}
	}
	ev, ended, err := e.store.EndingEvent(ctx, orderID)
	if err != nil {
		return err
	}
	if ended {
		out.Reason, out.Detail, out.Results = ev.Reason, ev.Detail, ev.Results
	}
	return nil
}

func byEnd(a, b StepEnd) int {
	if c := a.ended.Compare(b.ended); c != 0 {
		return c
	}
	return int(a.endID - b.endID)
}

// steps are an order's steps as the workflow names them, in the order
// they ended, with its children's; and its compensations that ran.
func (e *Env) steps(ctx context.Context, d statestore.OrderDetail, seen map[string]bool) (steps, comps []StepEnd, err error) {
	seen[d.Order.OrderID] = true
	wf, _ := e.reg.Lookup(d.Order.Workflow)
	specs := map[string]bool{}
	for _, st := range wf.Steps {
		if st.When != "" {
			specs[st.Ref()] = true
		}
	}
	ended := map[int]statestore.Transition{}
	why := map[int]string{}
	for _, h := range d.History {
		if h.Step == nil {
			continue
		}
		switch h.To {
		case statestore.StepProcessed, statestore.StepSkipped, statestore.StepError, statestore.StepCancelled:
			ended[*h.Step] = h
			why[*h.Step] = h.Reason
		}
	}
	refOf := map[int]string{}
	for _, st := range d.Steps {
		refOf[st.Step] = cmpOr(st.ID, st.Name)
	}
	byNumber := map[int]*StepEnd{}
	for _, st := range d.Steps {
		ref := refOf[st.Step]
		switch {
		case st.Kind == statestore.KindCompensation:
			if st.ProcessState == statestore.StepProcessed {
				target := st.Compensates
				if p := parentOf(d.Steps, target); p != 0 {
					target = p
				}
				h := ended[st.Step]
				comps = append(comps, StepEnd{Workflow: wf.Name, Ref: refOf[target], ended: h.At, endID: h.ID})
				if se, ok := byNumber[target]; ok {
					se.Compensated = true
				}
			}
		case st.Index != nil:
			if p, ok := byNumber[st.Parent]; ok {
				if p.Instances == nil {
					p.Instances = map[string]int{}
				}
				p.Instances[st.ProcessState]++
			}
		default:
			h := ended[st.Step]
			se := &StepEnd{Workflow: wf.Name, Ref: ref, State: st.ProcessState, HasWhen: specs[ref], Wait: st.Wait != "",
				ended: h.At, endID: h.ID}
			if st.ProcessState == statestore.StepSkipped || st.ProcessState == statestore.StepError {
				se.Why = cmpOr(why[st.Step], st.LastError)
			}
			if h.ID == 0 {
				se.ended, se.endID = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), int64(st.Step)
			}
			byNumber[st.Step] = se
		}
	}
	// Compensations were read before some of their actions: mark again.
	for _, c := range comps {
		for _, se := range byNumber {
			if se.Ref == c.Ref {
				se.Compensated = true
			}
		}
	}
	for _, se := range byNumber {
		steps = append(steps, *se)
	}
	slices.SortStableFunc(steps, byEnd)
	for _, ch := range d.Children {
		if seen[ch.OrderID] {
			continue
		}
		cd, err := e.store.GetOrder(ctx, ch.OrderID)
		if err != nil {
			return nil, nil, err
		}
		more, _, err := e.steps(ctx, cd, seen)
		if err != nil {
			return nil, nil, err
		}
		steps = append(steps, more...)
	}
	return steps, comps, nil
}

func parentOf(steps []statestore.Step, n int) int {
	for _, st := range steps {
		if st.Step == n && st.Index != nil {
			return st.Parent
		}
	}
	return 0
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// own are the outcome's steps of the case's own workflow.
func (o Outcome) own(workflow string) []StepEnd {
	var out []StepEnd
	for _, s := range o.Steps {
		if s.Workflow == workflow {
			out = append(out, s)
		}
	}
	return out
}

// Diff compares an outcome with its case's expectations: one line per
// difference, none when it passed.
func Diff(c Case, o Outcome) []string {
	var diffs []string
	if o.Err != nil {
		return []string{"the case could not run: " + o.Err.Error()}
	}
	x := c.Expect
	mismatch := func(what, want, got string) {
		diffs = append(diffs, fmt.Sprintf("%s:\n    want %s\n    got  %s", what, want, got))
	}
	if x.Status != "" && x.Status != o.Status {
		mismatch("status", x.Status, o.Status)
	}
	own := o.own(c.Workflow)
	sets := []struct {
		name  string
		want  []string
		state string
	}{{"ran", x.Ran, statestore.StepProcessed}, {"skipped", x.Skipped, statestore.StepSkipped}, {"failed", x.Failed, statestore.StepError}}
	for _, s := range sets {
		if s.want == nil {
			continue
		}
		var got []string
		for _, st := range own {
			if st.State == s.state {
				got = append(got, st.Ref)
			}
		}
		w, g := sorted(s.want), sorted(got)
		if !slices.Equal(w, g) {
			mismatch(s.name, list(w), list(g))
		}
	}
	if x.Compensated != nil && !slices.Equal(x.Compensated, o.Compensated) {
		mismatch("compensated (in order)", list(x.Compensated), list(o.Compensated))
	}
	if len(x.Sequence) > 0 {
		var order []string
		for _, st := range own {
			if st.State == statestore.StepProcessed || st.State == statestore.StepSkipped || st.State == statestore.StepError {
				order = append(order, st.Ref)
			}
		}
		if !subsequence(x.Sequence, order) {
			mismatch("sequence (steps ended in this order)", list(x.Sequence), list(order))
		}
	}
	if x.Reason != "" && x.Reason != o.Reason {
		mismatch("reason", x.Reason, cmpOr(o.Reason, "(none)"))
	}
	if x.Detail != "" && !strings.Contains(o.Detail, x.Detail) {
		mismatch("detail (a part of it)", fmt.Sprintf("%q", x.Detail), fmt.Sprintf("%q", o.Detail))
	}
	if len(x.Results) > 0 {
		var got map[string]json.RawMessage
		_ = json.Unmarshal(o.Results, &got)
		keys := make([]string, 0, len(x.Results))
		for k := range x.Results {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if !contains(got[k], x.Results[k]) {
				mismatch("results."+k, string(x.Results[k]), cmpOr(string(got[k]), "(none)"))
			}
		}
	}
	if x.TookAtLeast > 0 && o.Took < x.TookAtLeast {
		mismatch("took", "at least "+short(x.TookAtLeast), short(o.Took))
	}
	if x.TookAtMost > 0 && o.Took > x.TookAtMost {
		mismatch("took", "at most "+short(x.TookAtMost), short(o.Took))
	}
	return diffs
}

// contains reports whether got holds want: equal, or for objects, each
// of want's keys holding its value.
func contains(got, want json.RawMessage) bool {
	var g, w any
	if json.Unmarshal(got, &g) != nil || json.Unmarshal(want, &w) != nil {
		return false
	}
	return part(g, w)
}

func part(g, w any) bool {
	wm, ok := w.(map[string]any)
	if !ok {
		gb, _ := json.Marshal(g)
		wb, _ := json.Marshal(w)
		return bytes.Equal(gb, wb)
	}
	gm, ok := g.(map[string]any)
	if !ok {
		return false
	}
	for k, v := range wm {
		gv, ok := gm[k]
		if !ok || !part(gv, v) {
			return false
		}
	}
	return true
}

func subsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && want[i] == g {
			i++
		}
	}
	return i == len(want)
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func list(s []string) string {
	if len(s) == 0 {
		return "[]"
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// line is the step and how it ended: WORKFLOW.REF: STATE, with a
// for_each's instances counted by state.
func (s StepEnd) line() string {
	line := s.Workflow + "." + s.Ref + ": " + s.State
	if len(s.Instances) > 0 {
		var parts []string
		for st, n := range s.Instances {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
		slices.Sort(parts)
		line += " (" + strings.Join(parts, ", ") + ")"
	}
	return line
}

// Path is the outcome as lines: each step of the order's workflow with how
// it ended, then the compensations and the ending event.
func (o Outcome) Path() []string {
	var lines []string
	for _, s := range o.Steps {
		line := s.line()
		if s.Why != "" {
			line += " — " + s.Why
		}
		lines = append(lines, line)
	}
	if len(o.Compensated) > 0 {
		lines = append(lines, "compensated: "+strings.Join(o.Compensated, ", "))
	}
	end := "order " + o.Status
	if o.Reason != "" {
		end += " (" + o.Reason + ": " + o.Detail + ")"
	}
	return append(lines, end+" after "+short(o.Took))
}

// Shape is the outcome without what a real run and a case's may differ
// in (times, the services' own words): each step and how it ended (a
// for_each's instances counted), the steps undone in order, and the
// order's status with its ending reason. The steps are sorted: branches
// that end at the same moment of a case may end in any order in a real
// run.
func (o Outcome) Shape() []string {
	var lines []string
	for _, s := range o.Steps {
		lines = append(lines, s.line())
	}
	slices.Sort(lines)
	return append(lines, "compensated: "+list(o.Compensated), "order "+o.Status+" "+o.Reason)
}
