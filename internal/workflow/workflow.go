// Package workflow defines the steps an order runs: which agent performs
// each, how long a claim may take (the complete-by budget), how many
// expiries a step may have before it fails, the step that undoes it, and
// what a failure leads to (the workflow's policy). Adding a step or a
// workflow is a change here, not in the services.
package workflow

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Step is one step of a workflow.
type Step struct {
	// Name is the step's action (e.g. "reserve_inventory").
	Name string
	// Agent is the agent kind that performs it; requests go to the queue
	// agent.<Agent>.
	Agent string
	// Timeout is the budget of one attempt: complete_by = claim time +
	// Timeout on the database clock.
	Timeout time.Duration
	// MaxFailures is the failure threshold.
	MaxFailures int
	// Compensation undoes the step (nil: nothing to undo). It runs, with
	// its own idempotency key, budget and threshold, when the order is
	// compensated after the step was attempted.
	Compensation *Step
}

// Failure policies.
const (
	// Compensate: when an action fails for good, undo the actions already
	// attempted, last first; the order ends failed.
	Compensate = "compensate"
	// Hold: when an action fails for good, hold the order in error for an
	// operator to resubmit or cancel (cancel compensates).
	Hold = "hold"
)

// Workflow is a named, ordered list of steps and its failure policy.
type Workflow struct {
	Name   string
	Policy string // Compensate (default when empty) or Hold
	Steps  []Step
}

// DefaultName is the workflow of an order that names none.
const DefaultName = "order"

// Registry holds the workflows a deployment knows.
type Registry struct {
	byName map[string]Workflow
}

// NewRegistry checks the workflows and indexes them by name.
func NewRegistry(wfs ...Workflow) (*Registry, error) {
	r := &Registry{byName: map[string]Workflow{}}
	for _, wf := range wfs {
		if wf.Name == "" || len(wf.Steps) == 0 {
			return nil, fmt.Errorf("workflow %q: needs a name and at least one step", wf.Name)
		}
		if _, dup := r.byName[wf.Name]; dup {
			return nil, fmt.Errorf("workflow %q defined twice", wf.Name)
		}
		if wf.Policy == "" {
			wf.Policy = Compensate
		}
		if wf.Policy != Compensate && wf.Policy != Hold {
			return nil, fmt.Errorf("workflow %q: policy %q is not %q or %q", wf.Name, wf.Policy, Compensate, Hold)
		}
		for i, st := range wf.Steps {
			if err := checkStep(st); err != nil {
				return nil, fmt.Errorf("workflow %q step %d: %w", wf.Name, i+1, err)
			}
			if st.Compensation != nil {
				if err := checkStep(*st.Compensation); err != nil {
					return nil, fmt.Errorf("workflow %q step %d's compensation: %w", wf.Name, i+1, err)
				}
				if st.Compensation.Compensation != nil {
					return nil, fmt.Errorf("workflow %q step %d: a compensation cannot have a compensation", wf.Name, i+1)
				}
			}
		}
		r.byName[wf.Name] = wf
	}
	return r, nil
}

func checkStep(st Step) error {
	if st.Name == "" || st.Agent == "" || st.Timeout <= 0 || st.MaxFailures < 1 {
		return fmt.Errorf("needs a name, an agent, a positive timeout and a threshold of at least 1")
	}
	return nil
}

// Builtin returns the workflows sas ships with:
//   - "order": reserve inventory, charge payment, create shipment; on a
//     failure, the attempted ones are undone (release inventory, refund
//     payment, cancel shipment).
//   - "order_hold": the same steps, but a failure holds the order for an
//     operator.
//   - "single": reserve inventory only, for load tests and simple
//     integrations.
func Builtin() *Registry {
	reserve := Step{Name: "reserve_inventory", Agent: "inventory", Timeout: 10 * time.Second, MaxFailures: 5,
		Compensation: &Step{Name: "release_inventory", Agent: "inventory", Timeout: 10 * time.Second, MaxFailures: 5}}
	charge := Step{Name: "charge_payment", Agent: "payment", Timeout: 10 * time.Second, MaxFailures: 5,
		Compensation: &Step{Name: "refund_payment", Agent: "payment", Timeout: 10 * time.Second, MaxFailures: 5}}
	ship := Step{Name: "create_shipment", Agent: "shipping", Timeout: 10 * time.Second, MaxFailures: 5,
		Compensation: &Step{Name: "cancel_shipment", Agent: "shipping", Timeout: 10 * time.Second, MaxFailures: 5}}
	r, err := NewRegistry(
		Workflow{Name: DefaultName, Policy: Compensate, Steps: []Step{reserve, charge, ship}},
		Workflow{Name: "order_hold", Policy: Hold, Steps: []Step{reserve, charge, ship}},
		Workflow{Name: "single", Policy: Compensate, Steps: []Step{reserve}},
	)
	if err != nil {
		panic("workflow: builtin definitions are invalid: " + err.Error())
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

// Names lists the workflows in alphabetical order.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.byName))
	for n := range r.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Agents lists every agent kind the workflows use, compensations included,
// in alphabetical order.
func (r *Registry) Agents() []string {
	seen := map[string]bool{}
	var out []string
	add := func(agent string) {
		if !seen[agent] {
			seen[agent] = true
			out = append(out, agent)
		}
	}
	for _, wf := range r.byName {
		for _, st := range wf.Steps {
			add(st.Agent)
			if st.Compensation != nil {
				add(st.Compensation.Agent)
			}
		}
	}
	sort.Strings(out)
	return out
}

// StepNames lists the name of every step of the workflows, compensations
// included, in alphabetical order; with kinds, only those some of the
// agent kinds perform.
func (r *Registry) StepNames(kinds ...string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(st Step) {
		if (len(kinds) == 0 || slices.Contains(kinds, st.Agent)) && !seen[st.Name] {
			seen[st.Name] = true
			out = append(out, st.Name)
		}
	}
	for _, wf := range r.byName {
		for _, st := range wf.Steps {
			add(st)
			if st.Compensation != nil {
				add(*st.Compensation)
			}
		}
	}
	sort.Strings(out)
	return out
}

// Row is one step row an order of the workflow gets.
type Row struct {
	Step
	// Compensates is, for a compensation, the number of the action step it
	// undoes (0 for an action).
	Compensates int
}

// Rows lays the workflow out as an order's step rows, numbered from 1:
// the actions in order, then their compensations in reverse, so that the
// compensation undoing the last action comes first. Running "the next
// step" after each processed compensation then undoes the actions last to
// first.
func (wf Workflow) Rows() []Row {
	rows := make([]Row, 0, 2*len(wf.Steps))
	for _, st := range wf.Steps {
		rows = append(rows, Row{Step: st})
	}
	for i := len(wf.Steps) - 1; i >= 0; i-- {
		if c := wf.Steps[i].Compensation; c != nil {
			rows = append(rows, Row{Step: *c, Compensates: i + 1})
		}
	}
	return rows
}
