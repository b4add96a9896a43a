package workflow

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/cel-go/common/types"
	"go.yaml.in/yaml/v3"
)

// Limits are what the file's limits section says of an agent kind: at
// most MaxInFlight of its steps processing at once, at most Rate claims a
// second (bursts of Burst), and, when a service's 429 lowers the rate,
// not below MinRate. Zero is no such limit (Burst: a tenth of the rate,
// at least 1; MinRate: a tenth of the rate). They hold across every
// scheduler and agent replica: the state store keeps them, and a claim
// obeys them.
type Limits struct {
	MaxInFlight int
	Rate        float64
	Burst       int
	MinRate     float64
}

// MaxRate bounds a rate (claims a second), MaxInFlightLimit max_in_flight
// and burst.
const (
	maxKindLen       = 100
	MaxRate          = 1_000_000
	MaxInFlightLimit = 1_000_000
)

// Limits returns the file's limits, by agent kind.
func (r *Registry) Limits() map[string]Limits { return maps.Clone(r.limits) }

// KeyedKinds lists the agent kinds that steps of workflows with a
// concurrency_key run on.
func (r *Registry) KeyedKinds() []string {
	seen := map[string]bool{}
	for _, wf := range r.byName {
		if wf.ConcurrencyKey == "" {
			continue
		}
		var walk func(st Step)
		walk = func(st Step) {
			if st.Agent != "" {
				seen[st.Agent] = true
			}
			if st.Compensation != nil {
				walk(*st.Compensation)
			}
		}
		for _, st := range wf.Steps {
			walk(st)
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// Key reads the order's concurrency key from its payload: ok is false
// when the workflow declares none. A payload the expression fails on (a
// field it lacks) gets the key "": one key shared by every such order.
// A number or bool is written as JSON; a key is at most MaxAttrText bytes.
func (wf Workflow) Key(payload []byte) (key string, ok bool) {
	if wf.concurrencyKey == nil {
		return "", false
	}
	act, err := Vars{Payload: payload}.activation(UseKey)
	if err != nil {
		return "", true
	}
	v, _, err := wf.concurrencyKey.prg.Eval(act)
	if err != nil || types.IsError(v) {
		return "", true
	}
	k, good := ConvertAttr(AttrString, v.Value())
	if !good {
		return "", true
	}
	return k.(string), true
}

// ParseRate reads a rate: "50/s", "3000/m", "100000/h", or a number (a
// second's).
func ParseRate(s string) (float64, error) {
	num, unit, found := strings.Cut(strings.TrimSpace(s), "/")
	per := 1.0
	if found {
		switch strings.TrimSpace(unit) {
		case "s":
		case "m":
			per = 60
		case "h":
			per = 3600
		default:
			return 0, fmt.Errorf("rate %q: write a number per s, m or h, e.g. 50/s", s)
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if err != nil || n <= 0 || n/per > MaxRate || n != n {
		return 0, fmt.Errorf("rate %q: write a positive number per s, m or h (at most %d/s), e.g. 50/s", s, MaxRate)
	}
	return n / per, nil
}

// limits reads the file's limits section: agent kind -> its limits.
func (p *parser) limits(n *yaml.Node, r *Registry) {
	if n.Kind != yaml.MappingNode {
		p.problem(n.Line, "limits must map agent kinds to their limits; write \"limits:\" then \"  inventory: {max_in_flight: 20, rate: 50/s}\"")
		return
	}
	r.limits = map[string]Limits{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		kindNode, v := n.Content[i], deref(n.Content[i+1])
		kind := kindNode.Value
		if kind == "" || len(kind) > maxKindLen {
			p.problem(kindNode.Line, "limits: an agent kind of 1 to %d characters", maxKindLen)
			continue
		}
		var l Limits
		p.mapping(v, "the limits of agent "+kind, map[string]func(*yaml.Node){
			"max_in_flight": func(x *yaml.Node) { p.count(x, "max_in_flight", 1, MaxInFlightLimit, &l.MaxInFlight) },
			"burst":         func(x *yaml.Node) { p.count(x, "burst", 1, MaxInFlightLimit, &l.Burst) },
			"rate":          func(x *yaml.Node) { l.Rate = p.rate(x, "rate") },
			"min_rate":      func(x *yaml.Node) { l.MinRate = p.rate(x, "min_rate") },
		})
		if l.MaxInFlight == 0 && l.Rate == 0 {
			p.problem(v.Line, "the limits of agent %s limit nothing; write max_in_flight, rate or both", kind)
			continue
		}
		if l.Rate == 0 && (l.Burst != 0 || l.MinRate != 0) {
			p.problem(v.Line, "the limits of agent %s have a burst or min_rate but no rate; write rate: N/s", kind)
			continue
		}
		if l.MinRate > l.Rate {
			p.problem(v.Line, "the limits of agent %s: min_rate (%g/s) is above rate (%g/s)", kind, l.MinRate, l.Rate)
			continue
		}
		r.limits[kind] = l
	}
}

func (p *parser) rate(n *yaml.Node, what string) float64 {
	r, err := ParseRate(n.Value)
	if err != nil {
		p.problem(n.Line, "%s: %v", what, err)
		return 0
	}
	return r
}
