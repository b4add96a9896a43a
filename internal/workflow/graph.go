package workflow

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// A workflow is a graph when one of its steps says needs (other than the
// step before), when, for_each, input, delay, wait or id, or has no agent. Its steps then run as soon
// as the steps they need have ended (completed or skipped): several at
// once, joins after their branches. A workflow that says none of these is
// a list and runs, and hashes, exactly as it always has.

// DefaultMaxParallel is how many instances of a for_each step run at once
// when it says no max_parallel.
const DefaultMaxParallel = 10

// graph checks and resolves the graph keys of wf's steps, once every step
// is read: needs name steps that exist, there is no cycle, every step can
// run, expressions compile for their use, and for_each is bounded.
func (p *parser) graph(wf *Workflow, lines []stepLines) {
	isGraph := false
	for i, st := range wf.Steps {
		ln := lines[i]
		if st.ID != "" || st.When != "" || st.ForEach != "" || st.Input != "" || st.Delay > 0 || st.Wait != nil || st.InSystem() || st.Quorum() != "" || (ln.needsGiven && !defaultNeeds(wf.Steps, i)) {
			isGraph = true
		}
		if st.ForEach == "" && (st.MaxParallel > 0 || st.MaxItems > 0) {
			p.problem(ln.item, "max_parallel and max_items bound a for_each step; add \"for_each: ...\" or remove them")
		}
	}
	if !isGraph {
		for i := range wf.Steps {
			wf.Steps[i].Needs = nil
		}
		return
	}
	wf.Graph = true
	index := p.refIndex(wf)
	for i := range wf.Steps {
		st := &wf.Steps[i]
		ln := lines[i]
		if !ln.needsGiven {
			st.Needs = []string{}
			if i > 0 {
				st.Needs = []string{wf.Steps[i-1].Ref()}
			}
		}
		seen := map[string]bool{}
		resolved := []string{}
		for _, ref := range st.Needs {
			j, ok := index[ref]
			if !ok {
				refs := slices.Sorted(func(yield func(string) bool) {
					for r := range index {
						if !yield(r) {
							return
						}
					}
				})
				hint := "the steps are " + strings.Join(refs, ", ")
				if near := nearest(ref, refs); near != "" {
					hint = fmt.Sprintf("did you mean %q? (%s)", near, hint)
				}
				p.problem(max(ln.needs, ln.item), "needs %q: workflow %q has no such step; %s", ref, wf.Name, hint)
				continue
			}
			r := wf.Steps[j].Ref()
			if seen[r] {
				p.problem(max(ln.needs, ln.item), "needs names %q twice; name it once", ref)
				continue
			}
			seen[r] = true
			resolved = append(resolved, r)
		}
		st.Needs = resolved
		if msg := st.Join.problem(resolved); msg != "" {
			p.problem(max(ln.needs, ln.item), "%s", msg)
		}
		if st.Input != "" {
			use := UseInput
			if st.ForEach != "" {
				use = UseItemInput
			}
			if _, err := CompileExpr(st.Input, use); err != nil {
				p.problem(ln.input, "input %q does not compile: %s; write %s", st.Input, err, exprExample(use))
				st.Input = ""
			}
		}
		if st.ForEach != "" {
			if st.MaxItems == 0 {
				st.MaxItems = DefaultMaxItems
			}
			if st.MaxParallel == 0 {
				st.MaxParallel = min(DefaultMaxParallel, st.MaxItems)
			}
			p.forEachBound(wf, i, ln)
			if e := ln.forEachExpr; e != nil && e.ReadsOnly("payload") {
				if wf.forEach == nil {
					wf.forEach = map[int]*Expr{}
				}
				wf.forEach[i] = e
			}
		}
	}
	if cycle := findCycle(wf, index); cycle != nil {
		names := make([]string, len(cycle))
		for k, j := range cycle {
			names[k] = wf.Steps[j].Ref()
		}
		p.problem(max(lines[cycle[0]].needs, lines[cycle[0]].item), "the steps %s form a cycle through their needs; a step cannot run after itself: remove one of these needs",
			strings.Join(append(names, names[0]), " → "))
		return
	}
	never := map[string]bool{}
	for _, j := range topoOrder(wf, index) {
		st := wf.Steps[j]
		if st.When != "" {
			if e := lines[j].whenExpr; e != nil && e.ConstantFalse() {
				p.problem(lines[j].when, "step %q can never run: its when is always false; remove the step or write a condition over payload or results", st.Ref())
				never[st.Ref()] = true
				continue
			}
		}
		// A skipped step counts as ended; a step that can never be
		// reached is one after a step that never exists (for an N-of-M
		// join, after more of them than it can spare).
		spare := st.Spare(len(st.Needs))
		for _, n := range st.Needs {
			if never[n] {
				if spare--; spare >= 0 {
					continue
				}
				p.problem(max(lines[j].needs, lines[j].item), "step %q is unreachable: it needs %q, which can never run; change its needs", st.Ref(), n)
				never[st.Ref()] = true
				break
			}
		}
	}
}

// defaultNeeds reports whether step i's needs are the step before (or,
// for the first, none): what a list means.
func defaultNeeds(steps []Step, i int) bool {
	n := steps[i].Needs
	if i == 0 {
		return len(n) == 0
	}
	prev := steps[i-1]
	return len(n) == 1 && (n[0] == prev.Ref() || n[0] == prev.Name)
}

// refIndex maps every name a needs entry may use to its step: ids, and
// actions used once.
func (p *parser) refIndex(wf *Workflow) map[string]int {
	index := map[string]int{}
	uses := map[string]int{}
	for _, st := range wf.Steps {
		uses[st.Name]++
	}
	for i, st := range wf.Steps {
		if uses[st.Name] == 1 {
			index[st.Name] = i
		}
		if st.ID != "" {
			index[st.ID] = i
		}
	}
	return index
}

// forEachBound checks a for_each over a payload list against the
// payload schema: a schema that lets the list be longer than max_items
// lets orders in that would fail.
func (p *parser) forEachBound(wf *Workflow, i int, ln stepLines) {
	st := wf.Steps[i]
	field, ok := strings.CutPrefix(strings.TrimSpace(st.ForEach), "payload.")
	if !ok || !namePattern.MatchString(field) || wf.PayloadSchema == nil {
		return
	}
	most, bounded := schemaMaxItems(wf.PayloadSchema, field)
	if !bounded {
		return
	}
	if most > st.MaxItems {
		p.problem(max(ln.maxItems, ln.forEach), "for_each %q: the payload schema lets %s have %d items, more than max_items %d; write \"max_items: %d\" (at most %d) or lower the schema's maxItems",
			st.ForEach, field, most, st.MaxItems, min(most, MaxItemsCap), MaxItemsCap)
	}
}

// findCycle returns the steps of a cycle through needs, or nil.
func findCycle(wf *Workflow, index map[string]int) []int {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(wf.Steps))
	var stack []int
	var found []int
	var visit func(int) bool
	visit = func(i int) bool {
		color[i] = grey
		stack = append(stack, i)
		for _, ref := range wf.Steps[i].Needs {
			j, ok := index[ref]
			if !ok {
				continue
			}
			if color[j] == grey {
				k := slices.Index(stack, j)
				found = slices.Clone(stack[k:])
				return true
			}
			if color[j] == white && visit(j) {
				return true
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		return false
	}
	for i := range wf.Steps {
		if color[i] == white && visit(i) {
			return found
		}
	}
	return nil
}

// topoOrder lists the steps so that each comes after those it needs (the
// graph has no cycle).
func topoOrder(wf *Workflow, index map[string]int) []int {
	done := make([]bool, len(wf.Steps))
	var out []int
	var visit func(int)
	visit = func(i int) {
		if done[i] {
			return
		}
		done[i] = true
		for _, ref := range wf.Steps[i].Needs {
			if j, ok := index[ref]; ok {
				visit(j)
			}
		}
		out = append(out, i)
	}
	for i := range wf.Steps {
		visit(i)
	}
	return out
}

// needIndexes returns, by step index, the indexes of the steps it needs.
func (wf Workflow) needIndexes() [][]int {
	index := map[string]int{}
	for i, st := range wf.Steps {
		index[st.Ref()] = i
	}
	out := make([][]int, len(wf.Steps))
	for i, st := range wf.Steps {
		if !wf.Graph {
			if i > 0 {
				out[i] = []int{i - 1}
			}
			continue
		}
		for _, ref := range st.Needs {
			if j, ok := index[ref]; ok {
				out[i] = append(out[i], j)
			}
		}
	}
	return out
}

// ancestors returns, by step index, every step it needs, transitively,
// in step order.
func (wf Workflow) ancestors() [][]int {
	needs := wf.needIndexes()
	out := make([][]int, len(needs))
	var walk func(i int, seen map[int]bool)
	walk = func(i int, seen map[int]bool) {
		for _, j := range needs[i] {
			if !seen[j] {
				seen[j] = true
				walk(j, seen)
			}
		}
	}
	for i := range needs {
		seen := map[int]bool{}
		walk(i, seen)
		out[i] = slices.Sorted(func(yield func(int) bool) {
			for j := range seen {
				if !yield(j) {
					return
				}
			}
		})
	}
	return out
}

// Levels lays the steps out by depth: level 0 the steps that need none,
// then each step one level past the deepest step it needs. Steps of a
// level can run at once.
func (wf Workflow) Levels() [][]int {
	needs := wf.needIndexes()
	depth := make([]int, len(needs))
	var deepest int
	var depthOf func(i int) int
	memo := map[int]bool{}
	depthOf = func(i int) int {
		if memo[i] {
			return depth[i]
		}
		d := 0
		for _, j := range needs[i] {
			d = max(d, depthOf(j)+1)
		}
		depth[i], memo[i] = d, true
		return d
	}
	for i := range needs {
		deepest = max(deepest, depthOf(i))
	}
	levels := make([][]int, deepest+1)
	for i, d := range depth {
		levels[d] = append(levels[d], i)
	}
	return levels
}

// Needed returns, by step index, the steps that need it (its dependents).
func (wf Workflow) Needed() [][]int {
	needs := wf.needIndexes()
	out := make([][]int, len(needs))
	for i, ns := range needs {
		for _, j := range ns {
			out[j] = append(out[j], i)
		}
	}
	return out
}

// CheckForEach checks the payload-only for_each lists of an order's
// payload: a list that is not one (null, a missing field, an object, a
// number) or has more items than its max_items refuses the order at
// submit, where the step has no when (its list is then read at run time
// from the same payload, and would fail the step there). Lists that read
// results, and lists of steps with a when (which may skip the step
// before its list is read), are left to run time, where the same rule
// fails the step. The lists of one payload are read within the submit's
// budget of time (SubmitExprTime): those it leaves unread are left to
// run time.
func (wf Workflow) CheckForEach(payload []byte) error {
	if len(wf.forEach) == 0 {
		return nil
	}
	ctx, cancel := submitBudget()
	defer cancel()
	for i, e := range wf.forEach {
		st := wf.Steps[i]
		items, err := e.listIn(ctx, Vars{Payload: payload})
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && st.When == "":
			return fmt.Errorf("step %s: %w", st.Ref(), err)
		case err != nil:
		case len(items) > st.MaxItems:
			return fmt.Errorf("step %s: for_each %s has %d items, more than its max_items %d", st.Ref(), st.ForEach, len(items), st.MaxItems)
		}
	}
	return nil
}

// schemaMaxItems reads the maxItems of the payload property field, when
// the schema declares it an array with one.
func schemaMaxItems(schema []byte, field string) (int, bool) {
	var doc struct {
		Properties map[string]struct {
			MaxItems *int `json:"maxItems"`
		} `json:"properties"`
	}
	if json.Unmarshal(schema, &doc) != nil {
		return 0, false
	}
	prop, ok := doc.Properties[field]
	if !ok || prop.MaxItems == nil {
		return 0, false
	}
	return *prop.MaxItems, true
}

// StepSpec is what a step of a graph says beyond a list's keys, as its
// rows keep it (steps.spec) and a scheduler reads it at claim.
type StepSpec struct {
	ID          string `json:"id,omitempty"`
	When        string `json:"when,omitempty"`
	ForEach     string `json:"for_each,omitempty"`
	Input       string `json:"input,omitempty"`
	MaxParallel int    `json:"max_parallel,omitempty"`
	MaxItems    int    `json:"max_items,omitempty"`
	// Join is the rule by which the step waits for its needs (the state
	// store reads it when they end).
	Join
	// DelayMS is the step's delay in milliseconds (the state store reads
	// it when the step's needs end).
	DelayMS int64 `json:"delay_ms,omitempty"`
	// Wait is the step's wait for a signal (the state store reads it).
	Wait *SpecWait `json:"wait,omitempty"`
	// Workflow is, for a sub-process step and its compensation, the
	// child's workflow.
	Workflow string `json:"workflow,omitempty"`
	// MaxDurationMS is the step's max_duration in milliseconds (the state
	// store reads it when the step's service holds it open); a list's
	// rows and compensations carry it too.
	MaxDurationMS int64 `json:"max_duration_ms,omitempty"`
}

// SpecWait is a wait as a step's spec keeps it.
type SpecWait struct {
	Signal    string          `json:"signal"`
	TimeoutMS int64           `json:"timeout_ms"`
	OnTimeout string          `json:"on_timeout,omitempty"`
	Schema    json.RawMessage `json:"schema,omitempty"`
}

// Spec is the row's StepSpec as JSON: nil for the rows that say nothing
// but needs (a list's rows and compensations but for a max_duration).
func (r Row) Spec() []byte {
	sp := StepSpec{MaxDurationMS: r.MaxDuration.Milliseconds(), Workflow: r.Workflow}
	if r.Needs == nil || r.Compensates > 0 {
		if sp == (StepSpec{}) {
			return nil
		}
		b, _ := json.Marshal(sp)
		return b
	}
	sp.ID, sp.When, sp.ForEach, sp.Input, sp.MaxParallel, sp.MaxItems = r.ID, r.When, r.ForEach, r.Input, r.MaxParallel, r.MaxItems
	sp.DelayMS, sp.Join = r.Delay.Milliseconds(), r.Join
	if r.Wait != nil {
		sp.Wait = &SpecWait{Signal: r.Wait.Signal, TimeoutMS: r.Wait.Timeout.Milliseconds(), OnTimeout: r.Wait.OnTimeout, Schema: r.Wait.Schema}
	}
	if sp == (StepSpec{}) {
		return nil
	}
	b, _ := json.Marshal(sp) // strings and numbers always marshal
	return b
}
