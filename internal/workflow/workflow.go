// Package workflow holds the processes sas runs, declared as data: which
// agent performs each step, how long a claim may take (the complete-by
// budget), how many expiries a step may have before it fails, how long a
// reset step waits, the step that undoes it, what a failure leads to (the
// workflow's policy) and the JSON Schema its payload must match. They are
// read from a YAML file (Parse, Load); Builtin is the file sas ships with.
package workflow

import (
	"cmp"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"time"
)

// Step is one step of a workflow.
type Step struct {
	// Name is the step's action (e.g. "reserve_inventory").
	Name string `json:"action"`
	// Agent is the agent kind that performs it; requests go to the queue
	// agent.<Agent>.
	Agent string `json:"agent"`
	// Timeout is the budget of one attempt: complete_by = claim time +
	// Timeout on the database clock.
	Timeout time.Duration `json:"timeout"`
	// MaxFailures is the failure threshold.
	MaxFailures int `json:"max_failures"`
	// BackoffBase and BackoffMax, when set, shape the wait of a step the
	// supervisor resets: BackoffBase * 2^(failure_count-1), at most
	// BackoffMax. Zero: the supervisor's own.
	BackoffBase time.Duration `json:"backoff_base,omitempty"`
	BackoffMax  time.Duration `json:"backoff_max,omitempty"`
	// Compensation undoes the step (nil: nothing to undo). It runs, with
	// its own idempotency key, budget and threshold, when the order is
	// compensated after the step was attempted.
	Compensation *Step `json:"compensation,omitempty"`

	// The keys of a graph (see graph.go); all empty in a list.
	//
	// ID names the step in needs and results where its action is used
	// twice ("": its action).
	ID string `json:"id,omitempty"`
	// Needs are the steps (by Ref) that must have ended before this one
	// may be claimed. In a graph every step's needs are spelled out
	// (none: at the order's start); in a list they are nil.
	Needs []string `json:"needs,omitempty"`
	// Join is the rule by which it waits for them (join.go): every one,
	// or, for an N-of-M join, any Join.Any of them.
	Join
	// When, a CEL expression over payload and results, is a bool: false
	// skips the step.
	When string `json:"when,omitempty"`
	// ForEach, a CEL expression, is a list: one instance of the step per
	// item, at most MaxParallel at once; more than MaxItems items fail
	// the step (or refuse the order at submit).
	ForEach     string `json:"for_each,omitempty"`
	MaxParallel int    `json:"max_parallel,omitempty"`
	MaxItems    int    `json:"max_items,omitempty"`
	// Input, a CEL expression, builds the request's input.
	Input string `json:"input,omitempty"`
	// Delay is how long after its needs ended (at the order's start, for
	// a step that needs none) the step becomes claimable: a durable timer
	// on the database clock. A step with a delay and no agent is a timer
	// alone: it ends when its delay does.
	Delay time.Duration `json:"delay,omitempty"`
	// Wait makes the step wait for a signal instead of calling a service.
	Wait *Wait `json:"wait,omitempty"`
	// Workflow makes the step a sub-process: it starts a child order of
	// that workflow (its payload the step's input, else the order's) and
	// ends with it. Its compensation, made by the parser, undoes the
	// child.
	Workflow string `json:"workflow,omitempty"`
	// MaxDuration bounds how long a step whose service answered 202
	// Accepted may be held open by its heartbeats, from its claim (0:
	// DefaultMaxDuration).
	MaxDuration time.Duration `json:"max_duration,omitempty"`
}

// Ref is how needs and results name the step: its id, or its action.
func (st Step) Ref() string {
	if st.ID != "" {
		return st.ID
	}
	return st.Name
}

// Failure policies.
const (
	// Compensate: when an action fails for good, undo the actions already
	// attempted, last first; the order ends failed.
	Compensate = "compensate"
	// Hold: when an action fails for good, hold the order in error for an
	// operator to resubmit or cancel (cancel compensates).
	Hold = "hold"
	// Fail, as an on_deadline: the order fails with nothing undone.
	Fail = "fail"
)

// Workflow is a named, ordered list of steps, its failure policy and the
// schema of its payload.
type Workflow struct {
	Name   string `json:"name"`
	Policy string `json:"policy"`
	// PayloadSchema is the JSON Schema payloads must match, as JSON; nil
	// when the workflow declares none.
	PayloadSchema json.RawMessage `json:"payload_schema,omitempty"`
	// Graph is set when a step says needs, when, for_each, input or id:
	// the steps then run as their needs allow, not one after the other.
	Graph bool   `json:"graph,omitempty"`
	Steps []Step `json:"steps"`
	// SearchAttributes are what its orders can be found by: each read
	// from the payload at submit and stored typed.
	SearchAttributes []SearchAttribute `json:"search_attributes,omitempty"`
	// ConcurrencyKey, a CEL expression over the payload, is the key its
	// orders' steps are served by, round robin with other keys'; at most
	// MaxPerKey steps of one key and agent kind run at once (0: no bound).
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	MaxPerKey      int    `json:"max_per_key,omitempty"`
	// Webhooks are told of its orders' ends (webhooks.go).
	Webhooks []Webhook `json:"webhooks,omitempty"`
	// DeadlineMs bounds each of its orders as a whole (0: no bound; an
	// order may give its own at submit): when it passes on the database
	// clock, the order follows OnDeadline (Compensate, Hold or Fail).
	DeadlineMs int64  `json:"deadline_ms,omitempty"`
	OnDeadline string `json:"on_deadline,omitempty"`
	// Inbound are the routes that turn foreign events into its orders or
	// signals (inbound.go).
	Inbound []Inbound `json:"inbound,omitempty"`
	// Namespaces are the namespaces whose orders it may run (none: every
	// namespace); to a submit of any other it does not exist.
	Namespaces []string `json:"namespaces,omitempty"`

	concurrencyKey *Expr
	schema         *Schema
	version        string // set by Parse: Version is read for every order
	// forEach holds, by step index, the for_each expressions that read
	// only the payload: their lists are bounded at submit.
	forEach map[int]*Expr
}

// Deadline is what bounds an order of the workflow: its own deadline
// (given at submit) or else the workflow's, and what the order does when
// it passes (Compensate by default); zero when neither gives one.
func (wf Workflow) Deadline(own time.Duration) (time.Duration, string) {
	d := own
	if d <= 0 {
		d = time.Duration(wf.DeadlineMs) * time.Millisecond
	}
	if d <= 0 {
		return 0, ""
	}
	return d, cmp.Or(wf.OnDeadline, Compensate)
}

// Definition is the workflow's canonical JSON: what its version hashes
// and what the state store keeps.
func (wf Workflow) Definition() []byte {
	b, _ := json.Marshal(wf) // plain fields and valid raw JSON always marshal
	return b
}

// Version identifies the workflow's definition: the first 16 hex digits
// of the SHA-256 of Definition. Comments, layout and key order in the file
// do not change it; any change to what runs does.
func (wf Workflow) Version() string {
	if wf.version != "" {
		return wf.version
	}
	return versionOf(wf)
}

func versionOf(wf Workflow) string {
	sum := sha256.Sum256(wf.Definition())
	return hex.EncodeToString(sum[:8])
}

// DefaultName is the workflow of an order that names none.
const DefaultName = "order"

// Registry holds the workflows a deployment knows.
type Registry struct {
	byName map[string]Workflow
	// limits are the file's limits, by agent kind.
	limits map[string]Limits
	// scopedLimits are the namespaces' own, by agent kind then namespace.
	scopedLimits map[string]map[string]Limits
	// schedules are the file's schedules, by name.
	schedules map[string]Schedule
	// Source is the file the workflows came from ("built-in" for Builtin).
	Source string
}

//go:embed builtin.yaml
var builtinYAML []byte

// BuiltinYAML returns the text of the built-in workflows file (also
// shipped as deploy/workflows.yaml, the example to copy).
func BuiltinYAML() []byte { return slices.Clone(builtinYAML) }

// BuiltinSource names the built-in file in messages.
const BuiltinSource = "built-in"

// Builtin returns the workflows sas ships with:
//   - "order": reserve inventory, charge payment, create shipment; on a
//     failure, the attempted ones are undone (release inventory, refund
//     payment, cancel shipment).
//   - "order_hold": the same steps, but a failure holds the order for an
//     operator.
//   - "single": reserve inventory only, for load tests and simple
//     integrations.
func Builtin() *Registry {
	r, err := Parse(BuiltinSource, builtinYAML)
	if err != nil {
		panic("workflow: the built-in file is invalid: " + err.Error())
	}
	return r
}

// Lookup returns the named workflow; "" means DefaultName.
func (r *Registry) Lookup(name string) (Workflow, bool) {
	if name == "" {
		name = DefaultName
	}
	wf, ok := r.byName[name]
	return wf, ok
}

// defaultNamespace is the namespace of whatever names none.
const defaultNamespace = "default"

// In reports whether the workflow's orders may be of namespace ns (""
// is the default one).
func (wf Workflow) In(ns string) bool {
	return len(wf.Namespaces) == 0 || slices.Contains(wf.Namespaces, cmp.Or(ns, defaultNamespace))
}

// NamesIn lists, in alphabetical order, the workflows namespace ns may
// run.
func (r *Registry) NamesIn(ns string) []string {
	var names []string
	for _, n := range r.Names() {
		if r.byName[n].In(ns) {
			names = append(names, n)
		}
	}
	return names
}

// Names lists the workflows in alphabetical order.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.byName))
	for n := range r.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// All lists the workflows by name.
func (r *Registry) All() []Workflow {
	out := make([]Workflow, 0, len(r.byName))
	for _, n := range r.Names() {
		out = append(out, r.byName[n])
	}
	return out
}

// Agents lists every agent kind the workflows use, compensations included,
// in alphabetical order.
func (r *Registry) Agents() []string {
	seen := map[string]bool{"": true} // steps in the system's hands call no agent
	var out []string
	r.each(func(st Step) {
		if !seen[st.Agent] {
			seen[st.Agent] = true
			out = append(out, st.Agent)
		}
	})
	sort.Strings(out)
	return out
}

// HasSystemSteps reports whether a workflow has a step sas performs
// itself (a wait, a timer alone): schedulers then claim those too.
func (r *Registry) HasSystemSteps() bool {
	found := false
	r.each(func(st Step) { found = found || st.InSystem() })
	return found
}

// StepNames lists the name of every step of the workflows, compensations
// included, in alphabetical order; with kinds, only those some of the
// agent kinds perform.
func (r *Registry) StepNames(kinds ...string) []string {
	seen := map[string]bool{}
	var out []string
	r.each(func(st Step) {
		if (len(kinds) == 0 || slices.Contains(kinds, st.Agent)) && !seen[st.Name] {
			seen[st.Name] = true
			out = append(out, st.Name)
		}
	})
	sort.Strings(out)
	return out
}

func (r *Registry) each(fn func(Step)) {
	for _, wf := range r.byName {
		for _, st := range wf.Steps {
			fn(st)
			if st.Compensation != nil {
				fn(*st.Compensation)
			}
		}
	}
}

// Wait is a step's wait for a signal: it ends when a signal of that name
// comes for its order, the signal's payload its result; at Timeout it
// fails for good, or with OnTimeout "skip" is skipped.
type Wait struct {
	Signal    string        `json:"signal"`
	Timeout   time.Duration `json:"timeout"`
	OnTimeout string        `json:"on_timeout,omitempty"`
	// Schema, when set, is the JSON Schema a signal's payload must meet.
	Schema json.RawMessage `json:"schema,omitempty"`
}

// InSystem reports whether sas itself performs the step (a wait, a timer
// alone, a sub-process) rather than an agent: it has no agent.
func (st Step) InSystem() bool { return st.Agent == "" }

// Row is one step row an order of the workflow gets.
type Row struct {
	Step
	// Compensates is, for a compensation, the number of the action step it
	// undoes (0 for an action).
	Compensates int
	// Needs and Ancestors, in a graph, are the row numbers of the rows
	// that must have ended before this one may run, and of the actions
	// whose results it sees; nil in a list.
	Needs, Ancestors []int
}

// Rows lays the workflow out as an order's step rows, numbered from 1:
// the actions in order, then their compensations in reverse, so that the
// compensation undoing the last action comes first. Running "the next
// step" after each processed compensation then undoes the actions last to
// first.
//
// In a graph, an action's row needs the rows of its needs, and sees the
// results of its ancestors; a compensation needs the compensations of
// every action after its own in the graph (they are undone first) and
// sees every action's result.
func (wf Workflow) Rows() []Row {
	rows := make([]Row, 0, 2*len(wf.Steps))
	for _, st := range wf.Steps {
		rows = append(rows, Row{Step: st})
	}
	compRow := make([]int, len(wf.Steps)) // by step index: its compensation's row, or 0
	for i := len(wf.Steps) - 1; i >= 0; i-- {
		if c := wf.Steps[i].Compensation; c != nil {
			rows = append(rows, Row{Step: *c, Compensates: i + 1})
			compRow[i] = len(rows)
		}
	}
	if !wf.Graph {
		return rows
	}
	needs, anc := wf.needIndexes(), wf.ancestors()
	all := make([]int, len(wf.Steps))
	for i := range wf.Steps {
		rows[i].Needs = plusOne(needs[i])
		rows[i].Ancestors = plusOne(anc[i])
		all[i] = i + 1
	}
	for i := range wf.Steps {
		if compRow[i] == 0 {
			continue
		}
		r := &rows[compRow[i]-1]
		r.Needs, r.Ancestors = []int{}, all
		for j := range wf.Steps {
			if compRow[j] != 0 && slices.Contains(anc[j], i) {
				r.Needs = append(r.Needs, compRow[j])
			}
		}
		slices.Sort(r.Needs)
	}
	return rows
}

func plusOne(idx []int) []int {
	out := make([]int, len(idx))
	for k, i := range idx {
		out[k] = i + 1
	}
	return out
}
