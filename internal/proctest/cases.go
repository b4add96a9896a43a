// Package proctest runs a workflows file's test cases (`sasctl workflows
// test`): each case's order goes through the real state machine (the
// store's functions on a schema of its own, the scheduler's decisions for
// each claimed step, the supervisor's sweeps, timers and deadlines), its
// services answered by script, its time virtual: whenever nothing else
// can happen, the schema's clock jumps to the next moment something falls
// due, so a 14-day timer takes milliseconds.
package proctest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"sas/internal/messages"
	"sas/internal/workflow"
)

// Suite is a cases file: the workflows file it tests and its cases.
type Suite struct {
	// Path is the cases file's; Workflows the workflows file's (the
	// cases file's `workflows`, relative to it, unless the command line
	// named one).
	Path      string
	Workflows string
	Cases     []Case
}

// Case is one order and what should become of it.
type Case struct {
	Name     string
	Line     int
	Workflow string
	Payload  json.RawMessage
	// Deadline is the order's own deadline, as a submit may bring one.
	Deadline string
	// Services are the scripted answers by action name (compensations'
	// too); an action not named answers ok with an empty result.
	Services map[string][]Answer
	Signals  []SignalAt
	Expect   Expect
}

// Answer is what a service does with one attempt of a step (the last
// one given answers every later attempt).
type Answer struct {
	// Result: it answers 200 with this JSON object.
	Result json.RawMessage
	// Refuse: it answers 422 with this error, a failure for good.
	Refuse string
	// Transient: it first fails that many times (503), each try retried
	// by the agent with its backoff, then answers as the rest says.
	Transient int
	// Silent: it never answers (each try times out).
	Silent bool
	// Takes is how long each try takes before its answer.
	Takes time.Duration
	// Accept: it answers 202 and calls back later as Accept says.
	Accept *Callback
}

// Callback is what a service that answered 202 does afterwards.
type Callback struct {
	// After is when it calls back, from its 202; Never: it does not.
	After  time.Duration
	Never  bool
	Result json.RawMessage
	Fail   string
}

// SignalAt is a signal sent to the order at a moment of the case.
type SignalAt struct {
	At      time.Duration
	Name    string
	Payload json.RawMessage
}

// Expect is what a case asserts; what it leaves out is not checked.
type Expect struct {
	// Status is the order's status at the end: completed, failed, error
	// (held for an operator) or a running status when it waits forever.
	Status string
	// Ran, Skipped and Failed are the steps (by id or action) that ended
	// so: each list, when given, is the whole set.
	Ran, Skipped, Failed []string
	// Compensated are the actions undone, in the order their
	// compensations ended.
	Compensated []string
	// Sequence is steps in the order they ended (others may come between).
	Sequence []string
	// Reason and Detail are the ending event's (Detail: a part of it).
	Reason, Detail string
	// Results are some of the order's results, each a JSON value matched
	// as a part of the actual one (an object's keys not given are not
	// checked).
	Results map[string]json.RawMessage
	// Took bounds the order's virtual time from its submit to its end.
	TookAtLeast, TookAtMost time.Duration
}

// Load reads a cases file. workflows, when set, is the workflows file
// the cases test, in place of the file's own `workflows`.
func Load(path, workflows string) (*Suite, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cases file: %w", err)
	}
	return Parse(path, data, workflows)
}

// Parse reads a cases file's text; every problem is reported with its
// line.
func Parse(path string, data []byte, workflows string) (*Suite, error) {
	var doc struct {
		Workflows string    `yaml:"workflows"`
		Cases     []rawCase `yaml:"cases"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: %s", path, yamlText(err))
	}
	s := &Suite{Path: path, Workflows: workflows}
	if s.Workflows == "" {
		if doc.Workflows == "" {
			return nil, fmt.Errorf("%s: no workflows file: write \"workflows: FILE\" (relative to the cases file) or name it on the command line", path)
		}
		s.Workflows = filepath.Join(filepath.Dir(path), doc.Workflows)
	}
	if len(doc.Cases) == 0 {
		return nil, fmt.Errorf("%s: no cases: write a \"cases:\" list", path)
	}
	var problems []string
	names := map[string]int{}
	for _, rc := range doc.Cases {
		c, errs := rc.build()
		for _, e := range errs {
			problems = append(problems, fmt.Sprintf("%s:%d: %s", path, e.line, e.msg))
		}
		if first, dup := names[c.Name]; dup && c.Name != "" {
			problems = append(problems, fmt.Sprintf("%s:%d: case %q is named twice (first at line %d)", path, c.Line, c.Name, first))
		}
		names[c.Name] = c.Line
		s.Cases = append(s.Cases, c)
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "\n"))
	}
	return s, nil
}

// Check reports, with their lines, the cases that name what the
// workflows do not have: a workflow, an action, a signal, a step.
func (s *Suite) Check(reg *workflow.Registry) error {
	var problems []string
	for _, c := range s.Cases {
		bad := func(format string, args ...any) {
			problems = append(problems, fmt.Sprintf("%s:%d: case %q: %s", s.Path, c.Line, c.Name, fmt.Sprintf(format, args...)))
		}
		wf, ok := reg.Lookup(c.Workflow)
		if !ok {
			bad("workflow %q is not in %s (it has %s)", c.Workflow, s.Workflows, strings.Join(reg.Names(), ", "))
			continue
		}
		actions, steps, waits := names(reg, wf, map[string]bool{})
		for name := range c.Services {
			if !actions[name] {
				bad("service %q answers no action of workflow %s or its sub-processes (their actions: %s)", name, wf.Name, sortedSet(actions))
			}
		}
		for _, sg := range c.Signals {
			if !waits[sg.Name] {
				bad("signal %q is waited for by no step of workflow %s (the waits: %s)", sg.Name, wf.Name, sortedSet(waits))
			}
		}
		e := c.Expect
		for _, list := range [][]string{e.Ran, e.Skipped, e.Failed, e.Sequence} {
			for _, n := range list {
				if !steps[n] {
					bad("expect names step %q, which workflow %s does not have (its steps: %s)", n, wf.Name, sortedSet(steps))
				}
			}
		}
		for _, n := range e.Compensated {
			if !steps[n] {
				bad("expect.compensated names step %q, which workflow %s does not have (its steps: %s)", n, wf.Name, sortedSet(steps))
			}
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// names are a workflow's actions (with its sub-processes' and every
// compensation's), its own steps' names and the signals its waits take.
func names(reg *workflow.Registry, wf workflow.Workflow, seen map[string]bool) (actions, steps, waits map[string]bool) {
	actions, steps, waits = map[string]bool{}, map[string]bool{}, map[string]bool{}
	seen[wf.Name] = true
	for _, st := range wf.Steps {
		steps[st.Ref()] = true
		if st.Wait != nil {
			waits[st.Wait.Signal] = true
			continue
		}
		if st.Workflow != "" {
			if child, ok := reg.Lookup(st.Workflow); ok && !seen[child.Name] {
				a, _, _ := names(reg, child, seen)
				for n := range a {
					actions[n] = true
				}
			}
			continue
		}
		actions[st.Name] = true
		if st.Compensation != nil {
			actions[st.Compensation.Name] = true
		}
	}
	return actions, steps, waits
}

func sortedSet(m map[string]bool) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ", ")
}

type problem struct {
	line int
	msg  string
}

// rawCase is a case as written.
type rawCase struct {
	Name     string               `yaml:"name"`
	Workflow string               `yaml:"workflow"`
	Payload  yaml.Node            `yaml:"payload"`
	Deadline string               `yaml:"deadline"`
	Services map[string]yaml.Node `yaml:"services"`
	Signals  []struct {
		At      string    `yaml:"at"`
		Name    string    `yaml:"name"`
		Payload yaml.Node `yaml:"payload"`
	} `yaml:"signals"`
	Expect struct {
		Status      string               `yaml:"status"`
		Ran         []string             `yaml:"ran"`
		Skipped     []string             `yaml:"skipped"`
		Failed      []string             `yaml:"failed"`
		Compensated []string             `yaml:"compensated"`
		Sequence    []string             `yaml:"sequence"`
		Reason      string               `yaml:"reason"`
		Detail      string               `yaml:"detail"`
		Results     map[string]yaml.Node `yaml:"results"`
		TookAtLeast string               `yaml:"took_at_least"`
		TookAtMost  string               `yaml:"took_at_most"`
	} `yaml:"expect"`
	line int
}

func (rc *rawCase) UnmarshalYAML(n *yaml.Node) error {
	type plain rawCase
	var p plain
	if err := knownKeys(n, reflect.TypeFor[plain](), "a case"); err != nil {
		return err
	}
	if err := n.Decode(&p); err != nil {
		return err
	}
	*rc = rawCase(p)
	rc.line = n.Line
	return nil
}

// rawAnswer is an answer as written.
type rawAnswer struct {
	Result    yaml.Node `yaml:"result"`
	Refuse    string    `yaml:"refuse"`
	Transient int       `yaml:"transient"`
	Silent    bool      `yaml:"silent"`
	Takes     string    `yaml:"takes"`
	Accept    *struct {
		After  string    `yaml:"after"`
		Never  bool      `yaml:"never"`
		Result yaml.Node `yaml:"result"`
		Fail   string    `yaml:"fail"`
	} `yaml:"accept"`
}

// statuses are the order statuses a case may expect.
func statuses() []string {
	return []string{"completed", "failed", "error", "received", "processing", "compensating"}
}

// reasons are the ending event's reasons a case may expect.
func reasons() []string {
	return []string{messages.EndRefused, messages.EndTimedOut, messages.EndCancelled, messages.EndDeadline}
}

func (rc rawCase) build() (Case, []problem) {
	var ps []problem
	bad := func(line int, format string, args ...any) {
		ps = append(ps, problem{line, fmt.Sprintf(format, args...)})
	}
	c := Case{Name: rc.Name, Line: rc.line, Workflow: rc.Workflow, Deadline: rc.Deadline, Services: map[string][]Answer{}}
	if c.Name == "" {
		bad(rc.line, "a case has no name; write \"name: ...\"")
	}
	if c.Workflow == "" {
		bad(rc.line, "case %q has no workflow; write \"workflow: NAME\"", c.Name)
	}
	if c.Deadline != "" {
		if _, err := messages.ParseDuration(c.Deadline); err != nil {
			bad(rc.line, "case %q: deadline: %v", c.Name, err)
		}
	}
	c.Payload = json.RawMessage("{}")
	if rc.Payload.Kind != 0 {
		p, err := nodeJSON(&rc.Payload)
		switch {
		case err != nil:
			bad(rc.Payload.Line, "payload: %v", err)
		case len(p) == 0 || p[0] != '{':
			bad(rc.Payload.Line, "payload must be a mapping (a JSON object)")
		default:
			c.Payload = p
		}
	}
	for name, n := range rc.Services {
		var raws []rawAnswer
		err := knownKeys(&n, reflect.TypeFor[rawAnswer](), "an answer")
		if n.Kind == yaml.SequenceNode {
			err = cmp.Or(knownKeys(&n, reflect.TypeFor[[]rawAnswer](), "an answer"), err)
		}
		switch {
		case err != nil:
		case n.Kind == yaml.SequenceNode:
			err = n.Decode(&raws)
		default:
			var one rawAnswer
			err = n.Decode(&one)
			raws = []rawAnswer{one}
		}
		if err != nil {
			bad(n.Line, "service %q: %s", name, yamlText(err))
			continue
		}
		if len(raws) == 0 {
			bad(n.Line, "service %q has no answer", name)
		}
		for _, ra := range raws {
			a, msg := ra.build()
			if msg != "" {
				bad(n.Line, "service %q: %s", name, msg)
			}
			c.Services[name] = append(c.Services[name], a)
		}
	}
	for _, sg := range rc.Signals {
		at, err := messages.ParseDuration(sg.At)
		if sg.At == "" || sg.At == "0" {
			at, err = 0, nil
		}
		if err != nil {
			bad(rc.line, "case %q: signal %q: at: %v", c.Name, sg.Name, err)
		}
		if sg.Name == "" {
			bad(rc.line, "case %q: a signal has no name", c.Name)
		}
		p := json.RawMessage("{}")
		if sg.Payload.Kind != 0 {
			if p, err = nodeJSON(&sg.Payload); err != nil {
				bad(sg.Payload.Line, "signal %q: payload: %v", sg.Name, err)
			}
		}
		c.Signals = append(c.Signals, SignalAt{At: at, Name: sg.Name, Payload: p})
	}
	slices.SortStableFunc(c.Signals, func(a, b SignalAt) int { return int(a.At - b.At) })
	e := rc.Expect
	c.Expect = Expect{Status: e.Status, Ran: e.Ran, Skipped: e.Skipped, Failed: e.Failed, Compensated: e.Compensated,
		Sequence: e.Sequence, Reason: e.Reason, Detail: e.Detail}
	if e.Status != "" && !slices.Contains(statuses(), e.Status) {
		bad(rc.line, "case %q: expect.status %q is not one of %s", c.Name, e.Status, strings.Join(statuses(), ", "))
	}
	if e.Reason != "" && !slices.Contains(reasons(), e.Reason) {
		bad(rc.line, "case %q: expect.reason %q is not one of %s", c.Name, e.Reason, strings.Join(reasons(), ", "))
	}
	for which, text := range map[string]string{"took_at_least": e.TookAtLeast, "took_at_most": e.TookAtMost} {
		if text == "" {
			continue
		}
		d, err := messages.ParseDuration(text)
		if err != nil {
			bad(rc.line, "case %q: expect.%s: %v", c.Name, which, err)
		}
		if which == "took_at_least" {
			c.Expect.TookAtLeast = d
		} else {
			c.Expect.TookAtMost = d
		}
	}
	if len(e.Results) > 0 {
		c.Expect.Results = map[string]json.RawMessage{}
		for k, n := range e.Results {
			v, err := nodeJSON(&n)
			if err != nil {
				bad(n.Line, "expect.results.%s: %v", k, err)
			}
			c.Expect.Results[k] = v
		}
	}
	return c, ps
}

func (ra rawAnswer) build() (Answer, string) {
	a := Answer{Refuse: ra.Refuse, Transient: ra.Transient, Silent: ra.Silent}
	var err error
	if ra.Takes != "" {
		if a.Takes, err = messages.ParseDuration(ra.Takes); err != nil {
			return a, "takes: " + err.Error()
		}
	}
	if ra.Result.Kind != 0 {
		if a.Result, err = nodeJSON(&ra.Result); err != nil {
			return a, "result: " + err.Error()
		}
		if a.Result[0] != '{' {
			return a, "result must be a mapping (a service answers a JSON object)"
		}
	}
	if ra.Transient < 0 {
		return a, "transient must be 0 or more"
	}
	if ra.Accept != nil {
		a.Accept = &Callback{Never: ra.Accept.Never, Fail: ra.Accept.Fail}
		if ra.Accept.After != "" {
			if a.Accept.After, err = messages.ParseDuration(ra.Accept.After); err != nil {
				return a, "accept.after: " + err.Error()
			}
		}
		if ra.Accept.Result.Kind != 0 {
			if a.Accept.Result, err = nodeJSON(&ra.Accept.Result); err != nil {
				return a, "accept.result: " + err.Error()
			}
		}
		if !a.Accept.Never && ra.Accept.After == "" {
			return a, "accept needs after (when the callback comes) or never: true"
		}
	}
	ends := 0
	for _, set := range []bool{a.Result != nil, a.Refuse != "", a.Silent, a.Accept != nil} {
		if set {
			ends++
		}
	}
	if ends > 1 {
		return a, "an answer is one of result, refuse, silent or accept"
	}
	return a, ""
}

// knownKeys refuses, with its line, a key of a mapping in n that the
// type t it is decoded into has no field for (a yaml.Node field takes
// anything), as the whole file's decoder does for what it decodes itself.
func knownKeys(n *yaml.Node, t reflect.Type, what string) error {
	n = deref(n)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n == nil || t == reflect.TypeFor[yaml.Node]() {
		return nil
	}
	switch t.Kind() {
	case reflect.Slice:
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				if err := knownKeys(c, t.Elem(), what); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 1; i < len(n.Content); i += 2 {
				if err := knownKeys(n.Content[i], t.Elem(), what); err != nil {
					return err
				}
			}
		}
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := map[string]reflect.Type{}
		var names []string
		for f := range t.Fields() {
			tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if tag == "" || tag == "-" {
				continue
			}
			fields[tag] = f.Type
			names = append(names, tag)
		}
		slices.Sort(names)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			ft, ok := fields[k.Value]
			if !ok {
				return fmt.Errorf("line %d: unknown field %q in %s; the keys are %s", k.Line, k.Value, what, strings.Join(names, ", "))
			}
			if err := knownKeys(n.Content[i+1], ft, "\""+k.Value+"\""); err != nil {
				return err
			}
		}
	}
	return nil
}

func deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// nodeJSON is a YAML value as JSON.
func nodeJSON(n *yaml.Node) (json.RawMessage, error) {
	var v any
	if err := n.Decode(&v); err != nil {
		return nil, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("not a JSON value: %w", err)
	}
	return b, nil
}

// yamlText is a YAML error without the library's prefix.
func yamlText(err error) string {
	s := strings.TrimPrefix(err.Error(), "yaml: ")
	s = strings.ReplaceAll(s, "unmarshal errors:\n  ", "")
	s = strings.ReplaceAll(s, "\n  ", "; ")
	return strings.ReplaceAll(s, " in type proctest.", " in ")
}
