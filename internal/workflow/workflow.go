// Package workflow defines the steps an order runs: which agent performs
// each, how long a claim may take (the complete-by budget) and how many
// expiries a step may have before it is held in error. Adding a step or a
// workflow is a change here, not in the services.
package workflow

import (
	"fmt"
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
}

// Workflow is a named, ordered list of steps.
type Workflow struct {
	Name  string
	Steps []Step
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
		for i, st := range wf.Steps {
			if st.Name == "" || st.Agent == "" || st.Timeout <= 0 || st.MaxFailures < 1 {
				return nil, fmt.Errorf("workflow %q step %d: needs a name, an agent, a positive timeout and a threshold of at least 1", wf.Name, i+1)
			}
		}
		r.byName[wf.Name] = wf
	}
	return r, nil
}

// Builtin returns the workflows sas ships with: "order" (reserve inventory,
// charge payment, create shipment) and "single" (one step, for load tests
// and simple integrations).
func Builtin() *Registry {
	r, err := NewRegistry(
		Workflow{Name: DefaultName, Steps: []Step{
			{Name: "reserve_inventory", Agent: "inventory", Timeout: 10 * time.Second, MaxFailures: 5},
			{Name: "charge_payment", Agent: "payment", Timeout: 10 * time.Second, MaxFailures: 5},
			{Name: "create_shipment", Agent: "shipping", Timeout: 10 * time.Second, MaxFailures: 5},
		}},
		Workflow{Name: "single", Steps: []Step{
			{Name: "reserve_inventory", Agent: "inventory", Timeout: 10 * time.Second, MaxFailures: 5},
		}},
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

// Agents lists every agent kind the workflows use, in alphabetical order.
func (r *Registry) Agents() []string {
	seen := map[string]bool{}
	var out []string
	for _, wf := range r.byName {
		for _, st := range wf.Steps {
			if !seen[st.Agent] {
				seen[st.Agent] = true
				out = append(out, st.Agent)
			}
		}
	}
	sort.Strings(out)
	return out
}
