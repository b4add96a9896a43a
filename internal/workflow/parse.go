package workflow

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sas/internal/messages"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// Limits of a workflow file.
const (
	MaxSteps       = 20   // actions per workflow
	MaxFailuresCap = 1000 // highest failure threshold
	MinTimeout     = 100 * time.Millisecond
	MaxTimeout     = 24 * time.Hour
	MaxItemsCap    = 1000                 // highest max_items and max_parallel
	MaxDelay       = 366 * 24 * time.Hour // longest delay of a step
	maxNameLen     = 64                   // workflow names
	maxStepNameLen = 100                  // actions and agent kinds
)

// Defaults of a step that leaves them out.
const (
	DefaultTimeout     = 10 * time.Second
	DefaultMaxFailures = 5
	// DefaultMaxItems bounds a for_each that says no max_items.
	DefaultMaxItems = 100
	// DefaultMaxDuration bounds, from its claim, how long heartbeats may
	// hold open a step whose service answered 202 Accepted, when the step
	// says no max_duration (the step_hold function has the same figure).
	DefaultMaxDuration = time.Hour
)

// Problem is one thing wrong in a workflow file, at a line.
type Problem struct {
	File string
	Line int
	// Msg says what is wrong and what to write instead.
	Msg string
}

func (p Problem) String() string {
	if p.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg)
	}
	return fmt.Sprintf("%s: %s", p.File, p.Msg)
}

// Problems is every problem found in a file, in line order.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// AsProblems returns err's problems, if it is a Problems.
func AsProblems(err error) (Problems, bool) {
	var ps Problems
	ok := errors.As(err, &ps)
	return ps, ok
}

// Load reads and checks the workflows file at path.
func Load(path string) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workflows file: %w", err)
	}
	return Parse(path, data)
}

// LoadOrBuiltin is Load(path), or Builtin() when path is "".
func LoadOrBuiltin(path string) (*Registry, error) {
	if path == "" {
		return Builtin(), nil
	}
	return Load(path)
}

// Parse reads and checks a workflows file; file names it in problems. On
// any problem it returns them all as Problems, and no registry.
func Parse(file string, data []byte) (*Registry, error) {
	p := &parser{file: file}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.problem(yamlErrorLine(err), "%s; fix the YAML syntax there", yamlErrorText(err))
		return nil, p.problems
	}
	r := &Registry{byName: map[string]Workflow{}, Source: file}
	if len(doc.Content) == 0 {
		p.problem(0, "the file is empty; write a top-level \"workflows:\" list")
		return nil, p.problems
	}
	root := deref(doc.Content[0])
	p.mapping(root, "the file", map[string]func(*yaml.Node){
		"workflows": func(n *yaml.Node) {
			if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
				p.problem(n.Line, "workflows must be a list of at least one workflow; write \"workflows:\" then \"  - name: ...\" items")
				return
			}
			lines := map[string]int{}
			for _, item := range n.Content {
				wf, ok := p.workflow(deref(item))
				if !ok {
					continue
				}
				if first, dup := lines[wf.Name]; dup {
					p.problem(item.Line, "workflow %q is defined twice (first at line %d); rename or remove one", wf.Name, first)
					continue
				}
				lines[wf.Name] = item.Line
				wf.version = versionOf(wf)
				r.byName[wf.Name] = wf
			}
		},
		"schedules": func(n *yaml.Node) { p.schedules(n, r) },
		"limits":    func(n *yaml.Node) { p.limits(n, r) },
	}, "workflows")
	p.subProcesses(r)
	p.checkSchedules(r)
	if len(p.problems) > 0 {
		slices.SortStableFunc(p.problems, func(a, b Problem) int { return a.Line - b.Line })
		return nil, p.problems
	}
	return r, nil
}

type parser struct {
	file     string
	problems Problems
	// subs are the sub-process steps read, checked once every workflow is.
	subs []subRef
	// pendingSchedules are the schedules read, checked likewise.
	pendingSchedules []pendingSchedule
}

// subRef is a sub-process step: workflow from starts workflow to.
type subRef struct {
	from, to string
	line     int
}

// MaxDepth is how deep children may nest: an order's child is at depth 1,
// its child's child at 2, and so on.
const MaxDepth = 5

// subProcesses checks the sub-process steps against every workflow: each
// names one that exists, no workflow starts itself through its children
// (a cycle), and no chain of children is deeper than MaxDepth.
func (p *parser) subProcesses(r *Registry) {
	starts := map[string][]subRef{}
	for _, s := range p.subs {
		child, ok := r.byName[s.to]
		if !ok {
			p.problem(s.line, "workflow %q is not in the file; write the name of one of its workflows (%s)", s.to, strings.Join(r.Names(), ", "))
			continue
		}
		// A child is written in its parent's namespace: the child must
		// run in every namespace the parent does.
		if parent := r.byName[s.from]; len(child.Namespaces) > 0 {
			if len(parent.Namespaces) == 0 {
				p.problem(s.line, "workflow %q runs in every namespace, but its sub-process %q only in %s; give %q namespaces: among those",
					s.from, s.to, strings.Join(child.Namespaces, ", "), s.from)
			}
			for _, ns := range parent.Namespaces {
				if !child.In(ns) {
					p.problem(s.line, "workflow %q runs in namespace %s, but its sub-process %q does not; add %s to %q's namespaces",
						s.from, ns, s.to, ns, s.to)
				}
			}
		}
		starts[s.from] = append(starts[s.from], s)
	}
	// depth is how many levels of children a workflow starts below it;
	// -1 while it is being read (a cycle).
	depth := map[string]int{}
	var walk func(name string, path []string) int
	walk = func(name string, path []string) int {
		if d, ok := depth[name]; ok {
			return d
		}
		depth[name] = -1
		deepest := 0
		for _, s := range starts[name] {
			if d, seen := depth[s.to]; seen && d == -1 {
				p.problem(s.line, "workflow %q starts %q, which starts it again (%s): a cycle of sub-processes never ends; remove one of the workflow steps",
					s.from, s.to, strings.Join(append(slices.Clone(path), s.to), " → "))
				continue
			}
			d := walk(s.to, append(path, s.to))
			if d < 0 {
				continue
			}
			deepest = max(deepest, d+1)
			if deepest > MaxDepth {
				p.problem(s.line, "workflow %q nests children %d deep through %q, at most %d; flatten the process", name, deepest, s.to, MaxDepth)
				deepest = MaxDepth
			}
		}
		depth[name] = deepest
		return deepest
	}
	for _, name := range r.Names() {
		walk(name, []string{name})
	}
}

func (p *parser) problem(line int, format string, args ...any) {
	p.problems = append(p.problems, Problem{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// mapping reads n as a mapping whose keys must be among fields, each
// handled by its function; required keys must be present.
func (p *parser) mapping(n *yaml.Node, what string, fields map[string]func(*yaml.Node), required ...string) bool {
	if n.Kind != yaml.MappingNode {
		p.problem(n.Line, "%s must be a mapping of key: value lines; write one with the keys %s", what, strings.Join(sortedKeys(fields), ", "))
		return false
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], deref(n.Content[i+1])
		if first, dup := seen[k.Value]; dup {
			p.problem(k.Line, "%q is given twice in %s (first at line %d); keep one", k.Value, what, first)
			continue
		}
		seen[k.Value] = k.Line
		fn, ok := fields[k.Value]
		if !ok {
			hint := "the keys are " + strings.Join(sortedKeys(fields), ", ")
			if near := nearest(k.Value, sortedKeys(fields)); near != "" {
				hint = fmt.Sprintf("did you mean %q? (%s)", near, hint)
			}
			p.problem(k.Line, "unknown field %q in %s; %s", k.Value, what, hint)
			continue
		}
		fn(v)
	}
	for _, req := range required {
		if _, ok := seen[req]; !ok {
			p.problem(n.Line, "%s has no %q; add \"%s: ...\"", what, req, req)
		}
	}
	return true
}

func sortedKeys(m map[string]func(*yaml.Node)) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// nearest returns the candidate within two edits of s, if any.
func nearest(s string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`)

// CheckName is the rule of every name a workflows file declares (a
// workflow, an action, an agent kind, a step's id, a signal, a schedule)
// and of every entrance that names one: lower-case letters, digits, _ .
// or -, starting with a letter or digit, at most maxLen bytes. The error
// quotes the name (clipped, escaped) and says what to write.
func CheckName(what, s string, maxLen int) error {
	if namePattern.MatchString(s) && len(s) <= maxLen {
		return nil
	}
	shown := s
	if len(shown) > 80 {
		shown = strings.ToValidUTF8(shown[:80], "") + "…"
	}
	return fmt.Errorf("%s %q is not a name; write lower-case letters, digits, _ . or - (at most %d, starting with a letter or digit)",
		what, shown, maxLen)
}

func (p *parser) name(n *yaml.Node, what string, maxLen int, dst *string) {
	if n.Kind != yaml.ScalarNode {
		p.problem(n.Line, "%s is not a name; write lower-case letters, digits, _ . or - (at most %d, starting with a letter or digit)", what, maxLen)
		return
	}
	if err := CheckName(what, n.Value, maxLen); err != nil {
		p.problem(n.Line, "%v", err)
		return
	}
	*dst = n.Value
}

func (p *parser) workflow(n *yaml.Node) (Workflow, bool) {
	wf := Workflow{Policy: Compensate}
	before := len(p.problems)
	var stepsNode, keyNode, maxNode, inboundNode *yaml.Node
	p.mapping(n, "a workflow", map[string]func(*yaml.Node){
		"name": func(v *yaml.Node) { p.name(v, "workflow name", maxNameLen, &wf.Name) },
		"policy": func(v *yaml.Node) {
			if v.Value != Compensate && v.Value != Hold {
				p.problem(v.Line, "policy %q is not known; write %s (undo the steps before, the order fails) or %s (hold the order for an operator)",
					v.Value, Compensate, Hold)
				return
			}
			wf.Policy = v.Value
		},
		"payload_schema": func(v *yaml.Node) {
			wf.PayloadSchema, wf.schema = p.schema(v, "payload_schema")
		},
		"steps":             func(v *yaml.Node) { stepsNode = v },
		"search_attributes": func(v *yaml.Node) { wf.SearchAttributes = p.searchAttributes(v) },
		"concurrency_key":   func(v *yaml.Node) { keyNode = v },
		"max_per_key":       func(v *yaml.Node) { maxNode = v },
		"webhooks":          func(v *yaml.Node) { wf.Webhooks = p.webhooks(v) },
		"inbound":           func(v *yaml.Node) { inboundNode = v },
		"namespaces":        func(v *yaml.Node) { wf.Namespaces = p.namespaces(v) },
		"deadline": func(v *yaml.Node) {
			var d time.Duration
			p.duration(v, "deadline", messages.MinDeadline, messages.MaxDeadline, &d)
			wf.DeadlineMs = d.Milliseconds()
		},
		"on_deadline": func(v *yaml.Node) {
			if v.Value != Compensate && v.Value != Hold && v.Value != Fail {
				p.problem(v.Line, "on_deadline %q is not known; write %s (undo what was done, the default), %s (hold the order for an operator) or %s (fail it, nothing undone)",
					v.Value, Compensate, Hold, Fail)
				return
			}
			wf.OnDeadline = v.Value
		},
	}, "name", "steps")
	if keyNode != nil {
		wf.concurrencyKey = p.expr(keyNode, UseKey, &wf.ConcurrencyKey)
	}
	if maxNode != nil {
		if keyNode == nil {
			p.problem(maxNode.Line, "max_per_key bounds the steps of one concurrency key; write concurrency_key (e.g. payload.tenant) too")
		} else {
			p.count(maxNode, "max_per_key", 1, MaxInFlightLimit, &wf.MaxPerKey)
		}
	}
	if stepsNode != nil {
		p.steps(stepsNode, &wf)
	}
	if inboundNode != nil {
		wf.Inbound = p.inbound(inboundNode, &wf)
	}
	return wf, len(p.problems) == before
}

// MaxNamespaces bounds the namespaces a workflow lists.
const MaxNamespaces = 64

// namespaces reads a workflow's namespaces: a list of namespaces' names,
// each once.
func (p *parser) namespaces(n *yaml.Node) []string {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 || len(n.Content) > MaxNamespaces {
		p.problem(n.Line, "namespaces must be a list of 1 to %d namespaces whose orders may run the workflow (leave it out for every namespace)", MaxNamespaces)
		return nil
	}
	var out []string
	for _, item := range n.Content {
		item = deref(item)
		if err := messages.CheckNamespace(item.Value); item.Kind != yaml.ScalarNode || err != nil {
			p.problem(item.Line, "namespaces: %v", err)
			continue
		}
		if slices.Contains(out, item.Value) {
			p.problem(item.Line, "namespace %q is listed twice", item.Value)
			continue
		}
		out = append(out, item.Value)
	}
	return out
}

func (p *parser) steps(n *yaml.Node, wf *Workflow) {
	if n.Kind != yaml.SequenceNode || len(n.Content) == 0 {
		p.problem(n.Line, "steps must be a list of at least one step; write \"steps:\" then \"  - action: ...\" items")
		return
	}
	if len(n.Content) > MaxSteps {
		p.problem(n.Line, "%d steps, at most %d; split the process into workflows", len(n.Content), MaxSteps)
		return
	}
	var lines []stepLines
	for _, item := range n.Content {
		item = deref(item)
		st, ln := p.step(item, nil)
		wf.Steps = append(wf.Steps, st)
		lines = append(lines, ln)
		if st.Workflow != "" {
			p.subs = append(p.subs, subRef{from: wf.Name, to: st.Workflow, line: ln.workflow})
		}
	}
	p.names(wf, lines)
	p.graph(wf, lines)
}

// names checks that no two steps share a ref (id, or action) and no
// compensation shares its action with another step.
func (p *parser) names(wf *Workflow, lines []stepLines) {
	refs := map[string]int{}
	actions := map[string]int{}
	for i, st := range wf.Steps {
		if st.Name == "" {
			continue
		}
		if first, dup := refs[st.Ref()]; dup {
			if st.ID != "" {
				p.problem(lines[i].id, "id %q is used twice in workflow %q (first at line %d); give each step its own id", st.ID, wf.Name, first)
			} else {
				p.problem(lines[i].item, "step %q appears twice in workflow %q (first at line %d); give each step and compensation its own action name, or each use of the action its own \"id:\"",
					st.Name, wf.Name, first)
			}
			continue
		}
		refs[st.Ref()] = lines[i].item
		actions[st.Name] = lines[i].item
	}
	for i, st := range wf.Steps {
		if c := st.Compensation; c != nil && c.Name != "" {
			if first, dup := actions[c.Name]; dup {
				p.problem(lines[i].comp, "step %q appears twice in workflow %q (first at line %d); give each step and compensation its own action name",
					c.Name, wf.Name, first)
				continue
			}
			actions[c.Name] = lines[i].comp
		}
	}
}

// stepLines is where a step's keys are in the file, for problems found
// once every step is read.
type stepLines struct {
	item, comp, id, needs, when, forEach, maxItems, input, maxDuration, workflow int
	needsGiven                                                                   bool
	whenExpr, forEachExpr                                                        *Expr // compiled once, read by the graph's checks
}

// step reads a step, or with parent the compensation of parent (whose
// agent, timeout, threshold and backoff it takes by default). It returns
// where its keys are.
func (p *parser) step(n *yaml.Node, parent *Step) (Step, stepLines) {
	st := Step{Timeout: DefaultTimeout, MaxFailures: DefaultMaxFailures}
	ln := stepLines{item: n.Line}
	what := "a step"
	var required []string
	if parent != nil {
		st = Step{Agent: parent.Agent, Timeout: parent.Timeout, MaxFailures: parent.MaxFailures,
			BackoffBase: parent.BackoffBase, BackoffMax: parent.BackoffMax}
		what = "a compensation"
	} else {
		required = nil // checked below: a wait has neither, a timer alone no agent
	}
	if parent != nil {
		required = append(required, "action")
	}
	fields := map[string]func(*yaml.Node){
		"action": func(v *yaml.Node) { p.name(v, "action", maxStepNameLen, &st.Name) },
		"agent":  func(v *yaml.Node) { p.name(v, "agent kind", maxStepNameLen, &st.Agent) },
		"timeout": func(v *yaml.Node) {
			p.duration(v, "timeout", MinTimeout, MaxTimeout, &st.Timeout)
		},
		"max_failures": func(v *yaml.Node) {
			p.count(v, "max_failures", 1, MaxFailuresCap, &st.MaxFailures)
		},
		"max_duration": func(v *yaml.Node) {
			ln.maxDuration = v.Line
			p.duration(v, "max_duration", MinTimeout, MaxDelay, &st.MaxDuration)
		},
		"backoff": func(v *yaml.Node) {
			p.mapping(v, "backoff", map[string]func(*yaml.Node){
				"base": func(v *yaml.Node) { p.duration(v, "backoff base", time.Millisecond, MaxTimeout, &st.BackoffBase) },
				"max":  func(v *yaml.Node) { p.duration(v, "backoff max", time.Millisecond, MaxTimeout, &st.BackoffMax) },
			}, "base", "max")
			if st.BackoffBase > 0 && st.BackoffMax > 0 && st.BackoffMax < st.BackoffBase {
				p.problem(v.Line, "backoff max %s is below its base %s; write a max at least the base", st.BackoffMax, st.BackoffBase)
			}
		},
		"compensation": func(v *yaml.Node) {
			ln.comp = v.Line
			if parent != nil {
				p.problem(v.Line, "a compensation cannot have a compensation of its own; remove this one (undo work in the compensation itself)")
				return
			}
			c, _ := p.step(v, &st)
			st.Compensation = &c
		},
	}
	if parent == nil {
		fields["id"] = func(v *yaml.Node) { ln.id = v.Line; p.name(v, "id", maxStepNameLen, &st.ID) }
		fields["needs"] = func(v *yaml.Node) {
			ln.needs, ln.needsGiven = v.Line, true
			st.Needs = []string{}
			if v.Kind == yaml.MappingNode {
				v = p.join(v, &st.Join)
			}
			if v.Kind != yaml.SequenceNode {
				p.problem(v.Line, "needs must be a list of the steps (by action or id) this one runs after; write for example \"needs: [reserve_stock]\", \"needs: []\" to start at once, or \"needs: {any: 2, of: [a, b, c]}\" to run once any two of three have ended")
				return
			}
			for _, it := range v.Content {
				var ref string
				p.name(deref(it), "needs entry", maxStepNameLen, &ref)
				if ref != "" {
					st.Needs = append(st.Needs, ref)
				}
			}
		}
		fields["when"] = func(v *yaml.Node) { ln.when = v.Line; ln.whenExpr = p.expr(v, UseWhen, &st.When) }
		fields["for_each"] = func(v *yaml.Node) { ln.forEach = v.Line; ln.forEachExpr = p.expr(v, UseForEach, &st.ForEach) }
		fields["input"] = func(v *yaml.Node) { ln.input = v.Line; st.Input = v.Value }
		fields["max_parallel"] = func(v *yaml.Node) { p.count(v, "max_parallel", 1, MaxItemsCap, &st.MaxParallel) }
		fields["max_items"] = func(v *yaml.Node) { ln.maxItems = v.Line; p.count(v, "max_items", 1, MaxItemsCap, &st.MaxItems) }
		fields["delay"] = func(v *yaml.Node) { p.duration(v, "delay", time.Millisecond, MaxDelay, &st.Delay) }
		fields["wait"] = func(v *yaml.Node) { st.Wait = p.wait(v) }
		fields["workflow"] = func(v *yaml.Node) {
			ln.workflow = v.Line
			p.name(v, "workflow", maxNameLen, &st.Workflow)
		}
	}
	ok := p.mapping(n, what, fields, required...)
	if st.MaxDuration > 0 && st.MaxDuration < st.Timeout {
		p.problem(ln.maxDuration, "max_duration %s is below the timeout %s; write at least the timeout (it bounds how long heartbeats may hold a step its service answered 202)",
			st.MaxDuration, st.Timeout)
	}
	if !ok || parent != nil {
		return st, ln
	}
	p.inSystem(n, &st, ln)
	return st, ln
}

// inSystem checks what a step that names no agent may say: a wait (its
// id its name, unless it names an action) or a timer alone (an action
// with a delay); neither calls a service, so neither has what only a
// call has.
func (p *parser) inSystem(n *yaml.Node, st *Step, ln stepLines) {
	switch {
	case st.Workflow != "" && (st.Agent != "" || st.Wait != nil || st.Delay > 0):
		p.problem(n.Line, "a sub-process step (workflow: %s) calls no agent, waits for no signal and has no delay; remove them (put a delay on a step before it)", st.Workflow)
		return
	case st.Workflow != "":
		if st.Name == "" {
			st.Name = cmp.Or(st.ID, st.Workflow)
		}
		if st.Compensation != nil {
			p.problem(ln.comp, "a sub-process step is undone by its child's own compensations; remove its compensation")
		}
		if st.ForEach != "" || st.MaxDuration > 0 {
			p.problem(n.Line, "a sub-process step cannot have for_each or max_duration; run the child workflow once per item with a for_each step inside it")
		}
		// Undoing the step undoes its child, as sas does it.
		st.Compensation = &Step{Name: "undo_" + st.Name, Workflow: st.Workflow, Timeout: st.Timeout, MaxFailures: st.MaxFailures}
		return
	case st.Wait != nil && st.Agent != "":
		p.problem(n.Line, "a wait step calls no agent; remove \"agent: %s\" (or the wait, to call it)", st.Agent)
		return
	case st.Wait != nil && st.Name == "" && st.ID == "":
		p.problem(n.Line, "a wait step has no \"id\"; add \"id: ...\" to name it in needs and results")
		return
	case st.Wait != nil && st.Delay > 0:
		p.problem(n.Line, "a wait step cannot have a delay; put the delay on a step before it")
		return
	case st.Wait == nil && st.Name == "":
		p.problem(n.Line, "a step has no \"action\"; add \"action: ...\"")
		return
	case st.Wait == nil && st.Agent == "" && st.Delay == 0:
		p.problem(n.Line, "a step has no \"agent\"; add \"agent: ...\" (or \"delay: ...\" for a timer alone, or \"wait: ...\" for a signal)")
		return
	case !st.InSystem():
		return
	}
	if st.Name == "" {
		st.Name = st.ID
	}
	what := "a timer alone (no agent)"
	if st.Wait != nil {
		what = "a wait step"
	}
	if st.Compensation != nil {
		p.problem(ln.comp, "%s does nothing to undo; remove its compensation", what)
	}
	if st.ForEach != "" || st.Input != "" || st.MaxDuration > 0 {
		p.problem(n.Line, "%s calls no service; remove for_each, input and max_duration", what)
	}
}

// wait reads a step's wait: the signal's name, the timeout, what a
// timeout does, and the payload's schema.
func (p *parser) wait(v *yaml.Node) *Wait {
	w := &Wait{}
	ok := p.mapping(v, "wait", map[string]func(*yaml.Node){
		"signal":  func(v *yaml.Node) { p.name(v, "signal", maxStepNameLen, &w.Signal) },
		"timeout": func(v *yaml.Node) { p.duration(v, "wait timeout", time.Millisecond, MaxDelay, &w.Timeout) },
		"on_timeout": func(v *yaml.Node) {
			if v.Value != "fail" && v.Value != "skip" {
				p.problem(v.Line, "on_timeout %q is not fail or skip; write \"on_timeout: skip\" to go on without the signal", v.Value)
				return
			}
			if v.Value == "skip" {
				w.OnTimeout = "skip"
			}
		},
		"schema": func(v *yaml.Node) { w.Schema, _ = p.schema(v, "wait schema") },
	}, "signal", "timeout")
	if !ok {
		return nil
	}
	return w
}

// count reads a whole number from lo to hi.
func (p *parser) count(v *yaml.Node, what string, lo, hi int, dst *int) {
	n, err := strconv.Atoi(v.Value)
	if v.Kind != yaml.ScalarNode || err != nil || n < lo || n > hi {
		p.problem(v.Line, "%s %q is not a whole number from %d to %d; write for example \"%s: %d\"", what, v.Value, lo, hi, what, min(max(5, lo), hi))
		return
	}
	*dst = n
}

// expr reads a CEL expression and compiles it for its use (nil: a
// problem, reported).
func (p *parser) expr(v *yaml.Node, use string, dst *string) *Expr {
	if v.Kind != yaml.ScalarNode {
		p.problem(v.Line, "%s must be a CEL expression on one line; write for example %s", use, exprExample(use))
		return nil
	}
	e, err := CompileExpr(v.Value, use)
	if err != nil {
		p.problem(v.Line, "%s %q does not compile: %s; write %s", use, v.Value, err, exprExample(use))
		return nil
	}
	*dst = v.Value
	return e
}

func exprExample(use string) string {
	switch use {
	case UseWhen:
		return "a bool over payload and results, such as \"payload.amount > 100000\""
	case UseForEach:
		return "a list over payload and results, such as \"payload.parcels\""
	case UseAttribute:
		return "a value over the payload, such as \"payload.customer\""
	case UseKey:
		return "a value over the payload, such as \"payload.tenant\""
	case UseInbound:
		return "a value over the event the sender posted, seen as payload, such as \"payload.data.id\""
	}
	return "a value over payload and results (and item and index in a for_each step), such as \"{'sku': item.sku}\""
}

func (p *parser) duration(n *yaml.Node, what string, lo, hi time.Duration, dst *time.Duration) {
	d, err := ParseDuration(n.Value)
	if n.Kind != yaml.ScalarNode || err != nil || d < lo || d > hi {
		p.problem(n.Line, "%s %q is not a duration from %s to %s; write a number with a unit, such as 500ms, 10s, 2m, 72h or 14d", what, n.Value,
			lo, humanDuration(hi))
		return
	}
	*dst = d
}

// ParseDuration reads a duration as time.ParseDuration does, and also a
// whole number of days ("14d").
func ParseDuration(s string) (time.Duration, error) { return messages.ParseDuration(s) }

// humanDuration writes whole days as days (366d, not 8784h0m0s).
func humanDuration(d time.Duration) string {
	if d >= 24*time.Hour && d%(24*time.Hour) == 0 {
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
	return d.String()
}

// schema reads a payload schema: any YAML mapping, as JSON, compiled as
// JSON Schema (2020-12 unless its $schema says otherwise).
func (p *parser) schema(n *yaml.Node, what string) (json.RawMessage, *Schema) {
	var v any
	if err := n.Decode(&v); err != nil {
		p.problem(n.Line, "%s cannot be read: %v; write a JSON Schema as YAML", what, err)
		return nil, nil
	}
	if _, ok := v.(map[string]any); !ok {
		p.problem(n.Line, "%s must be a mapping (a JSON Schema object); write for example \"%s: {type: object}\"", what, what)
		return nil, nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		p.problem(n.Line, "%s cannot be written as JSON: %v; use only strings, numbers, lists and mappings", what, err)
		return nil, nil
	}
	sch, err := CompileSchema(raw)
	if err != nil {
		p.problem(n.Line, "%s is not a valid JSON Schema: %s; fix it by the JSON Schema 2020-12 rules", what, oneLine(err.Error()))
		return nil, nil
	}
	return raw, sch
}

func compileSchema(raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(noLoader{})
	const url = "sas:payload-schema.json"
	if err := c.AddResource(url, doc); err != nil {
		return nil, err
	}
	return c.Compile(url)
}

// noLoader refuses every external $ref: a workflow's schema is one
// self-contained document.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("$ref to %s: only references within the schema are allowed", url)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

var yamlLine = regexp.MustCompile(`line (\d+)`)

var yamlPrefix = regexp.MustCompile(`^yaml: (line \d+: )?`)

func yamlErrorLine(err error) int {
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n
	}
	return 1 // the parser names no line for a problem on the first
}

func yamlErrorText(err error) string {
	return oneLine(yamlPrefix.ReplaceAllString(err.Error(), ""))
}
