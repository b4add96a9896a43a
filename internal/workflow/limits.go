package workflow

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"sas/internal/messages"
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

// Share is one partition's share of a kind's limits in a deployment of n
// partitions (docs/SCALING.md): each partition's schedulers claim within
// it, so that together they hold the kind's limits, not n times them. A
// rate, its floor and a burst are split evenly; max_in_flight too, but
// never below 1 a partition (a kind allowed fewer in flight than there
// are partitions has at most n). n of 1 or less changes nothing.
func (l Limits) Share(n int) Limits {
	if n <= 1 {
		return l
	}
	out := Limits{Rate: l.Rate / float64(n), MinRate: l.MinRate / float64(n)}
	if l.MaxInFlight > 0 {
		out.MaxInFlight = max(1, l.MaxInFlight/n)
	}
	if l.Burst > 0 {
		out.Burst = max(1, l.Burst/n)
	}
	return out
}

// MaxRate bounds a rate (claims a second), MaxInFlightLimit max_in_flight
// and burst.
const (
	MaxRate          = 1_000_000
	MaxInFlightLimit = 1_000_000
)

// Check is the rule of an agent kind's limits (0: no such limit; a
// negative value is one given out of range), wherever they are set: a
// workflows file's limits section, and an operator's change (sasctl
// limits set, the console) once merged with the limits it changes. Each
// limit within its range; at least max_in_flight or rate; a burst or a
// min_rate only with a rate, and the min_rate (the floor a service's 429
// lowers the rate to) not above the rate. The error says which, in the
// same words at every entrance.
func (l Limits) Check() error {
	switch {
	case l.MaxInFlight < 0 || l.MaxInFlight > MaxInFlightLimit:
		return fmt.Errorf("max_in_flight: a whole number from 1 to %d", MaxInFlightLimit)
	case l.Burst < 0 || l.Burst > MaxInFlightLimit:
		return fmt.Errorf("burst: a whole number from 1 to %d", MaxInFlightLimit)
	case !rateInRange(l.Rate):
		return fmt.Errorf("rate: a positive number per s, m or h, at most %d/s", MaxRate)
	case !rateInRange(l.MinRate):
		return fmt.Errorf("min_rate: a positive number per s, m or h, at most %d/s", MaxRate)
	case l.MaxInFlight == 0 && l.Rate == 0:
		return errors.New("they limit nothing: give max_in_flight, rate or both")
	case l.Rate == 0 && (l.Burst != 0 || l.MinRate != 0):
		return errors.New("a burst or a min_rate needs a rate")
	case l.MinRate > l.Rate:
		return fmt.Errorf("min_rate (%g/s) is above rate (%g/s): a service's 429 would raise the rate", l.MinRate, l.Rate)
	}
	return nil
}

// rateInRange: 0 (none), or a positive rate of at most MaxRate.
func rateInRange(r float64) bool {
	return r == 0 || r > 0 && r <= MaxRate && !math.IsInf(r, 0)
}

// CheckKind is the rule of an agent kind's name, wherever one comes from:
// the workflows file's steps and limits, sasctl, the console, a service's
// settings (CheckName's).
func CheckKind(kind string) error { return CheckName("agent kind", kind, maxStepNameLen) }

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
// field it lacks, or more than SubmitExprTime of work) gets the key "":
// one key shared by every such order.
// A number or bool is written as JSON; a key is at most MaxAttrText bytes.
func (wf Workflow) Key(payload []byte) (key string, ok bool) {
	if wf.concurrencyKey == nil {
		return "", false
	}
	act, err := Vars{Payload: payload}.activation(UseKey)
	if err != nil {
		return "", true
	}
	ctx, cancel := submitBudget()
	defer cancel()
	v, err := wf.concurrencyKey.evalIn(ctx, act)
	if err != nil {
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
	if err != nil || n <= 0 || n/per > MaxRate || n != n || math.IsInf(n, 0) {
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
		if err := CheckKind(kind); err != nil {
			p.problem(kindNode.Line, "limits: %v", err)
			continue
		}
		var l Limits
		var scoped *yaml.Node
		p.mapping(v, "the limits of agent "+kind, map[string]func(*yaml.Node){
			"max_in_flight": func(x *yaml.Node) { p.count(x, "max_in_flight", 1, MaxInFlightLimit, &l.MaxInFlight) },
			"burst":         func(x *yaml.Node) { p.count(x, "burst", 1, MaxInFlightLimit, &l.Burst) },
			"rate":          func(x *yaml.Node) { l.Rate = p.rate(x, "rate") },
			"min_rate":      func(x *yaml.Node) { l.MinRate = p.rate(x, "min_rate") },
			"namespaces":    func(x *yaml.Node) { scoped = x },
		})
		if scoped != nil {
			p.namespaceLimits(scoped, kind, r)
			if l == (Limits{}) {
				continue // the namespaces' alone
			}
		}
		if err := l.Check(); err != nil {
			p.problem(v.Line, "the limits of agent %s: %v", kind, err)
			continue
		}
		r.limits[kind] = l
	}
}

// namespaceLimits reads a kind's namespaces: namespace -> its own limits
// on the kind (max_in_flight, rate, burst), within the kind's.
func (p *parser) namespaceLimits(n *yaml.Node, kind string, r *Registry) {
	n = deref(n)
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		p.problem(n.Line, "the namespaces of agent %s's limits must map namespaces to their own limits, e.g. \"namespaces: {team-a: {max_in_flight: 5}}\"", kind)
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		nsNode, v := n.Content[i], deref(n.Content[i+1])
		ns := nsNode.Value
		if err := messages.CheckNamespace(ns); err != nil {
			p.problem(nsNode.Line, "the limits of agent %s: namespaces: %v", kind, err)
			continue
		}
		if ns == defaultNamespace {
			p.problem(nsNode.Line, "the limits of agent %s: the default namespace has no limits of its own: the kind's hold its steps", kind)
			continue
		}
		var l Limits
		p.mapping(v, "the limits of agent "+kind+" in namespace "+ns, map[string]func(*yaml.Node){
			"max_in_flight": func(x *yaml.Node) { p.count(x, "max_in_flight", 1, MaxInFlightLimit, &l.MaxInFlight) },
			"burst":         func(x *yaml.Node) { p.count(x, "burst", 1, MaxInFlightLimit, &l.Burst) },
			"rate":          func(x *yaml.Node) { l.Rate = p.rate(x, "rate") },
		})
		if err := l.Check(); err != nil {
			p.problem(v.Line, "the limits of agent %s in namespace %s: %v", kind, ns, err)
			continue
		}
		if r.scopedLimits == nil {
			r.scopedLimits = map[string]map[string]Limits{}
		}
		if r.scopedLimits[kind] == nil {
			r.scopedLimits[kind] = map[string]Limits{}
		}
		r.scopedLimits[kind][ns] = l
	}
}

// NamespaceLimits returns the file's namespaces' own limits, by agent kind
// then namespace.
func (r *Registry) NamespaceLimits() map[string]map[string]Limits {
	out := make(map[string]map[string]Limits, len(r.scopedLimits))
	for kind, m := range r.scopedLimits {
		out[kind] = maps.Clone(m)
	}
	return out
}

func (p *parser) rate(n *yaml.Node, what string) float64 {
	r, err := ParseRate(n.Value)
	if err != nil {
		p.problem(n.Line, "%s: %v", what, err)
		return 0
	}
	return r
}
