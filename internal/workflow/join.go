package workflow

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A Join is the rule by which a step of a graph waits for the steps it
// needs. By default it runs once every one has ended (processed or
// skipped). Any makes it an N-of-M join: it runs once any Any of them
// have ended well; the rest are let finish, and one that fails for good
// fails the order only when those left can no longer reach Any.
//
// Step, StepSpec and the state store's steps embed it, so its keys reach
// a step's spec and the API as they are; the check, sasctl, the console
// and the checker of invariants read it through its methods alone. A join
// of another kind is written here, in the moves it adds (shapes.go) and
// in the store's advance (sql/20_steps.sql, graph_advance and
// joins_spare).
type Join struct {
	Any int `json:"needs_any,omitempty"`
}

// Quorum says how many of its needs a join that does not wait for every
// one waits for, "any 2"; "" for a join of all of them.
func (j Join) Quorum() string {
	if j.Any > 0 {
		return "any " + strconv.Itoa(j.Any)
	}
	return ""
}

// Required is how many of n needs must end well before the step runs.
func (j Join) Required(n int) int {
	if j.Any > 0 {
		return min(j.Any, n)
	}
	return n
}

// Spare is how many of n needs may fail for good, or never run, while
// the step can still run.
func (j Join) Spare(n int) int { return n - j.Required(n) }

// problem says what is wrong with the join over its needs (resolved, by
// Ref), "" when nothing is.
func (j Join) problem(needs []string) string {
	if j.Any > 0 && j.Any >= len(needs) {
		return fmt.Sprintf("needs {any: %d, of: %d steps}: any must be fewer than the steps it names (any of them may fail while the rest go on); to need every one write \"needs: [%s]\"",
			j.Any, len(needs), strings.Join(needs, ", "))
	}
	return ""
}

// join reads needs written as a mapping, {any: N, of: [steps]}, into dst.
// It returns the list (of), and a node that is no list when there is none.
func (p *parser) join(v *yaml.Node, dst *Join) *yaml.Node {
	of := &yaml.Node{Kind: yaml.ScalarNode, Line: v.Line}
	anyGiven := false
	for k := 0; k+1 < len(v.Content); k += 2 {
		key, val := v.Content[k], deref(v.Content[k+1])
		switch key.Value {
		case "any":
			anyGiven = true
			n, err := strconv.Atoi(val.Value)
			if val.Kind != yaml.ScalarNode || err != nil || n < 1 || n > MaxItemsCap {
				p.problem(val.Line, "needs' any %q is not a whole number from 1 to %d; write for example \"needs: {any: 2, of: [a, b, c]}\"", val.Value, MaxItemsCap)
				continue
			}
			dst.Any = n
		case "of":
			of = val
		default:
			p.problem(key.Line, "needs has no key %q; write \"needs: {any: 2, of: [a, b, c]}\"", key.Value)
		}
	}
	if !anyGiven {
		p.problem(v.Line, "needs as a mapping says how many of its steps must end: write \"needs: {any: 2, of: [a, b, c]}\"")
	}
	return of
}
