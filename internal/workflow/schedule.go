package workflow

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	cron "github.com/netresearch/go-cron"
	"go.yaml.in/yaml/v3"

	"sas/internal/messages"
)

// Schedule starts an order of a workflow at every tick of a cron
// expression (schedules: in the workflows file).
type Schedule struct {
	Name     string `json:"name"`
	Cron     string `json:"cron"`
	Timezone string `json:"timezone"`
	Workflow string `json:"workflow"`
	// Payload is each order's payload, a JSON object ({} by default).
	Payload json.RawMessage `json:"payload"`
	// Overlap is OverlapSkip (a tick is skipped while the order of the
	// one before has not ended) or OverlapAllow.
	Overlap string `json:"overlap"`
	// CatchUp says which ticks missed (while no supervisor led, or one
	// fell behind) still start an order: CatchUpNone, CatchUpLast (the
	// latest) or CatchUpAll (each, at most MaxCatchUp).
	CatchUp string `json:"catch_up"`
	// Namespace is where its orders are written ("": the default one).
	Namespace string `json:"namespace,omitempty"`

	rule tickRule
}

// Overlap and catch-up policies.
const (
	OverlapSkip  = "skip"
	OverlapAllow = "allow"
	CatchUpNone  = "none"
	CatchUpLast  = "last"
	CatchUpAll   = "all"
	// MaxCatchUp bounds the ticks catch_up: all starts after downtime
	// (the latest ones).
	MaxCatchUp = 100
	// MinEvery is the shortest @every.
	MinEvery = time.Second
)

// tickRule is a schedule's ticks: a cron expression in a time zone, or
// @every, whose ticks are the multiples of its period since the Unix
// epoch (so that every supervisor counts the same ticks).
type tickRule struct {
	spec  cron.Schedule
	loc   *time.Location
	every time.Duration
}

// Next is the schedule's first tick after t.
func (s Schedule) Next(t time.Time) time.Time {
	if s.rule.every > 0 {
		return time.Unix(0, 0).Add((t.Sub(time.Unix(0, 0))/s.rule.every + 1) * s.rule.every).UTC()
	}
	for range 4 {
		n := s.rule.spec.Next(t.In(s.rule.loc))
		if n.IsZero() || !repeated(n.In(s.rule.loc)) {
			return n.UTC()
		}
		t = n // the hour the clocks went back over: its tick came already
	}
	return time.Time{}
}

// repeated reports whether t is the second time its wall clock shows,
// the clocks having gone back over it (the autumn's repeated hour).
func repeated(t time.Time) bool {
	_, now := t.Zone()
	_, before := t.Add(-time.Hour).Zone()
	if before <= now {
		return false
	}
	twin := t.Add(-time.Duration(before-now) * time.Second)
	return twin.Format(time.DateTime) == t.Format(time.DateTime)
}

// Version identifies what the schedule says: a change of it starts its
// ticks afresh from the change.
func (s Schedule) Version() string {
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ParseTicks reads a cron expression (5 fields, a descriptor such as
// @daily, or @every DURATION) in a time zone ("" is UTC).
func ParseTicks(expr, timezone string) (Schedule, error) {
	loc := time.UTC
	if timezone != "" {
		l, err := time.LoadLocation(timezone)
		if err != nil || timezone == "Local" {
			return Schedule{}, fmt.Errorf("timezone %q is not an IANA time zone such as Europe/Berlin or UTC", timezone)
		}
		loc = l
	}
	if strings.Contains(expr, "TZ=") {
		return Schedule{}, fmt.Errorf("cron %q: give the time zone in timezone, not in the expression", expr)
	}
	if d, ok := strings.CutPrefix(expr, "@every "); ok {
		if every, err := time.ParseDuration(strings.TrimSpace(d)); err == nil && every%time.Second != 0 {
			return Schedule{}, fmt.Errorf("cron %q: @every in whole seconds", expr)
		}
	}
	spec, err := cron.ParseStandard(expr)
	if err != nil {
		return Schedule{}, fmt.Errorf("cron %q: %v; write 5 fields (minute hour day-of-month month day-of-week), a descriptor such as @daily, or @every 10m", expr, err)
	}
	rule := tickRule{spec: spec, loc: loc}
	if d, ok := spec.(cron.ConstantDelaySchedule); ok {
		rule.every = d.Delay
	} else if d, ok := spec.(*cron.ConstantDelaySchedule); ok {
		rule.every = d.Delay
	}
	if rule.every > 0 && rule.every < MinEvery {
		return Schedule{}, fmt.Errorf("cron %q: @every at least %s", expr, MinEvery)
	}
	s := Schedule{Cron: expr, Timezone: timezone, rule: rule}
	if s.Next(time.Now()).IsZero() {
		return Schedule{}, fmt.Errorf("cron %q matches no date in the years ahead; check the day of the month against the month", expr)
	}
	return s, nil
}

// schedules reads the file's schedules.
func (p *parser) schedules(n *yaml.Node, r *Registry) {
	if n.Kind != yaml.SequenceNode {
		p.problem(n.Line, "schedules must be a list; write \"schedules:\" then \"  - name: ...\" items")
		return
	}
	lines := map[string]int{}
	for _, item := range n.Content {
		item = deref(item)
		var s Schedule
		var cronNode, tzNode, wfNode *yaml.Node
		ok := p.mapping(item, "a schedule", map[string]func(*yaml.Node){
			"name":     func(v *yaml.Node) { p.name(v, "schedule name", maxNameLen, &s.Name) },
			"cron":     func(v *yaml.Node) { cronNode = v },
			"timezone": func(v *yaml.Node) { tzNode = v },
			"workflow": func(v *yaml.Node) { wfNode = v; p.name(v, "workflow", maxNameLen, &s.Workflow) },
			"payload": func(v *yaml.Node) {
				var val any
				if err := v.Decode(&val); err != nil {
					p.problem(v.Line, "payload cannot be read: %v", err)
					return
				}
				if _, isMap := val.(map[string]any); !isMap {
					p.problem(v.Line, "payload must be a mapping (a JSON object); write for example \"payload: {kind: monthly}\"")
					return
				}
				s.Payload, _ = json.Marshal(val)
			},
			"overlap": func(v *yaml.Node) {
				if v.Value != OverlapSkip && v.Value != OverlapAllow {
					p.problem(v.Line, "overlap %q is not skip or allow; write skip (no tick while the last order runs) or allow", v.Value)
				}
				s.Overlap = v.Value
			},
			"namespace": func(v *yaml.Node) {
				if err := messages.CheckNamespace(v.Value); err != nil {
					p.problem(v.Line, "schedule's %v", err)
					return
				}
				s.Namespace = v.Value
			},
			"catch_up": func(v *yaml.Node) {
				if v.Value != CatchUpNone && v.Value != CatchUpLast && v.Value != CatchUpAll {
					p.problem(v.Line, "catch_up %q is not none, last or all; write which ticks missed during a downtime still start an order", v.Value)
				}
				s.CatchUp = v.Value
			},
		}, "name", "cron", "workflow")
		if !ok || cronNode == nil {
			continue
		}
		tz := ""
		if tzNode != nil {
			tz = tzNode.Value
		}
		ticks, err := ParseTicks(cronNode.Value, tz)
		if err != nil {
			line := cronNode.Line
			if strings.HasPrefix(err.Error(), "timezone") && tzNode != nil {
				line = tzNode.Line
			}
			p.problem(line, "%v", err)
			continue
		}
		s.Cron, s.Timezone, s.rule = ticks.Cron, cmp.Or(tz, "UTC"), ticks.rule
		if s.Payload == nil {
			s.Payload = json.RawMessage(`{}`)
		}
		s.Overlap = cmp.Or(s.Overlap, OverlapSkip)
		s.CatchUp = cmp.Or(s.CatchUp, CatchUpLast)
		if first, dup := lines[s.Name]; dup {
			p.problem(item.Line, "schedule %q is defined twice (first at line %d); rename or remove one", s.Name, first)
			continue
		}
		lines[s.Name] = item.Line
		p.pendingSchedules = append(p.pendingSchedules, pendingSchedule{s: s, wfLine: wfNode.Line})
	}
}

type pendingSchedule struct {
	s      Schedule
	wfLine int
}

// checkSchedules checks each schedule's workflow and payload, once every
// workflow is read.
func (p *parser) checkSchedules(r *Registry) {
	for _, ps := range p.pendingSchedules {
		wf, ok := r.byName[ps.s.Workflow]
		if !ok {
			p.problem(ps.wfLine, "workflow %q is not in the file; write the name of one of its workflows (%s)", ps.s.Workflow, strings.Join(r.Names(), ", "))
			continue
		}
		if err := wf.CheckOrderPayload(ps.s.Payload); err != nil {
			p.problem(ps.wfLine, "the schedule's payload does not suit workflow %s: %v", wf.Name, err)
			continue
		}
		if !wf.In(ps.s.Namespace) {
			p.problem(ps.wfLine, "workflow %s does not run in namespace %s, the schedule's; add it to the workflow's namespaces, or give the schedule one of %s",
				wf.Name, cmp.Or(ps.s.Namespace, defaultNamespace), strings.Join(wf.Namespaces, ", "))
			continue
		}
		if r.schedules == nil {
			r.schedules = map[string]Schedule{}
		}
		r.schedules[ps.s.Name] = ps.s
	}
}

// Schedule is the file's schedule of that name.
func (r *Registry) Schedule(name string) (Schedule, bool) {
	s, ok := r.schedules[name]
	return s, ok
}

// Schedules lists the file's schedules by name.
func (r *Registry) Schedules() []Schedule {
	out := make([]Schedule, 0, len(r.schedules))
	for _, s := range r.schedules {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
