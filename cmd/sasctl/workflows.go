package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"sas/internal/harness/sample"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// workflowsFile is the workflows file a command reads: --workflows FILE,
// else SAS_WORKFLOWS_FILE, else the built-in one.
func workflowsFile(flagValue string) (*workflow.Registry, error) {
	if flagValue == "" {
		flagValue = os.Getenv("SAS_WORKFLOWS_FILE")
	}
	return workflow.LoadOrBuiltin(flagValue)
}

func knownWorkflow(reg *workflow.Registry, name string) error {
	if _, ok := reg.Lookup(name); !ok {
		return fmt.Errorf("unknown workflow %q: the workflows of %s are %s; %s", name, sourceName(reg), strings.Join(reg.Names(), ", "), nameAnother)
	}
	return nil
}

// nameAnother says how a command is told which workflows file to read.
const nameAnother = "name another file with --workflows FILE or SAS_WORKFLOWS_FILE"

// sourceName says which workflows file reg was read from.
func sourceName(reg *workflow.Registry) string {
	if reg.Source == workflow.BuiltinSource {
		return "the built-in file (neither --workflows nor SAS_WORKFLOWS_FILE names one)"
	}
	return reg.Source
}

// workflowsCheck reads a workflows file and lists every problem in it.
func (a *app) workflowsCheck(_ context.Context, args []string) error {
	fs := a.flags()
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the workflows file to check")
	}
	reg, err := workflow.Load(rest[0])
	if ps, ok := workflow.AsProblems(err); ok {
		for _, p := range ps {
			fmt.Fprintln(a.stdout, p)
		}
		return fmt.Errorf("%s: %d problem(s)", rest[0], len(ps))
	}
	if err != nil {
		return err
	}
	for _, wf := range reg.All() {
		fmt.Fprintf(a.stdout, "%s: workflow %s version %s: %d steps, policy %s, agent kinds %s\n",
			rest[0], wf.Name, wf.Version(), len(wf.Steps), wf.Policy, strings.Join(kindsOf(wf), ","))
		if wf.Graph {
			printGraph(a.stdout, wf)
		}
	}
	fmt.Fprintf(a.stdout, "%s: ok\n", rest[0])
	return nil
}

func kindsOf(wf workflow.Workflow) []string {
	var out []string
	for _, r := range wf.Rows() {
		if r.Agent != "" && !slices.Contains(out, r.Agent) { // a wait, a timer or a sub-process calls none
			out = append(out, r.Agent)
		}
	}
	return out
}

// workflowsList lists the workflow versions the state store keeps (every
// version an order was submitted with), or with --file those of a file.
func (a *app) workflowsList(ctx context.Context, args []string) error {
	fs := a.flags()
	file := fs.String("file", "", "list the workflows of this file instead of the versions in the state store")
	asJSON := fs.Bool("json", false, "print the definitions as JSON")
	if err := a.parseNoArgs(fs, args); err != nil {
		return err
	}
	if *file != "" {
		reg, err := workflow.Load(*file)
		if err != nil {
			return err
		}
		if *asJSON {
			var defs []json.RawMessage
			for _, wf := range reg.All() {
				defs = append(defs, wf.Definition())
			}
			return a.printJSON(defs)
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKFLOW\tVERSION\tPOLICY\tSCHEMA\tSTEPS")
		for _, wf := range reg.All() {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", wf.Name, wf.Version(), wf.Policy, wf.HasSchema(), stepList(wf))
		}
		return tw.Flush()
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	vs, err := store.WorkflowVersions(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return a.printJSON(vs)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKFLOW\tVERSION\tIN_FLIGHT\tFIRST_USED\tBY\tSTEPS")
	for _, v := range vs {
		var wf workflow.Workflow
		steps := "?"
		if json.Unmarshal(v.Definition, &wf) == nil {
			steps = stepList(wf)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", v.Name, v.Version, v.Active, v.CreatedAt.Local().Format(time.DateTime), v.CreatedBy, steps)
	}
	return tw.Flush()
}

// stepList writes a workflow's steps on one line: a list as a chain (a →
// b), a graph as each step with the steps it waits for (c ← a, b).
func stepList(wf workflow.Workflow) string {
	graph := slices.ContainsFunc(wf.Steps, func(st workflow.Step) bool { return len(st.Needs) > 0 })
	var parts []string
	for _, st := range wf.Steps {
		p := st.Ref() + "@" + performer(st)
		if st.Compensation != nil {
			p += "(undo " + st.Compensation.Name + ")"
		}
		if after := st.After(); graph && after != "" {
			p += " ← " + after
		}
		parts = append(parts, p)
	}
	if graph {
		return strings.Join(parts, "; ")
	}
	return strings.Join(parts, " → ")
}

// performer is who performs a step: its agent kind, or what sas does
// itself, with how long it waits.
func performer(st workflow.Step) string {
	switch st.Kind() {
	case "action":
		return st.Agent
	case "sub-process":
		return "workflow:" + st.Workflow
	case "wait":
		return "signal:" + st.Wait.Signal + "(" + workflow.DurationText(st.Wait.Timeout) + ")"
	}
	return "timer(" + workflow.DurationText(st.Delay) + ")"
}

// orderSampler makes sample orders of a workflow: the payload given (a JSON
// object file), or a plausible demo order.
type orderSampler struct {
	workflow string
	payload  []byte
}

// payloadFlagHelp is what every --payload flag takes.
const payloadFlagHelp = `a JSON object inline ('{"plan":"team"}') or @FILE holding one (a bare file name still works)`

// payloadArg reads a --payload value the same way in every command: a
// JSON object written inline, or @FILE (as curl writes it); a value that
// is neither JSON nor @ is taken for a file name, as it always was in
// dev and submit. The payload is checked as the submitter checks one.
func payloadArg(v string) ([]byte, error) {
	var raw []byte
	trimmed := strings.TrimSpace(v)
	switch {
	case strings.HasPrefix(trimmed, "{") || strings.HasPrefix(trimmed, "["):
		raw = []byte(trimmed)
	default:
		file := strings.TrimPrefix(v, "@")
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--payload %s: %w (write a JSON object inline, or @FILE)", v, err)
		}
		raw = b
	}
	if err := messages.CheckPayload(raw); err != nil {
		return nil, fmt.Errorf("--payload %s: %w", clip(v, 60), err)
	}
	return raw, nil
}

func newOrderSampler(reg *workflow.Registry, name, payload string) (*orderSampler, error) {
	if err := knownWorkflow(reg, name); err != nil {
		return nil, err
	}
	wf, _ := reg.Lookup(name)
	s := &orderSampler{workflow: wf.Name}
	if payload != "" {
		raw, err := payloadArg(payload)
		if err != nil {
			return nil, err
		}
		s.payload = raw
	}
	if err := sample.Check(reg, name, s.payload); err != nil {
		if errors.Is(err, sample.ErrDemoPayload) {
			return nil, fmt.Errorf("%v: give one with --payload '{…}' or --payload @FILE", err)
		}
		return nil, err
	}
	return s, nil
}

func (s *orderSampler) order(priority int, replyTo string) messages.SubmitOrder {
	payload := s.payload
	if payload == nil {
		payload = sample.DemoPayload()
	}
	now := time.Now().UTC()
	return messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: s.workflow,
		Payload: payload, Priority: priority, ReplyTo: replyTo, PlacedAt: &now}
}

// printGraph prints a graph workflow level by level: the steps of a level
// may run at once, each after the steps it needs; a step that needs more
// than one is a join (of any N of them, for an N-of-M join).
func printGraph(w io.Writer, wf workflow.Workflow) {
	for i, level := range wf.Levels() {
		var parts []string
		for _, j := range level {
			st := wf.Steps[j]
			p := st.Ref()
			var notes []string
			switch {
			case st.Quorum() != "":
				notes = append(notes, "joins "+st.Quorum()+" of "+strings.Join(st.Needs, " + "))
			case len(st.Needs) > 1:
				notes = append(notes, "joins "+strings.Join(st.Needs, " + "))
			case len(st.Needs) == 1:
				notes = append(notes, "after "+st.Needs[0])
			}
			if st.When != "" {
				notes = append(notes, "when "+st.When)
			}
			if st.ForEach != "" {
				notes = append(notes, fmt.Sprintf("for each of %s, %d at once, at most %d", st.ForEach, st.MaxParallel, st.MaxItems))
			}
			if st.Compensation != nil {
				notes = append(notes, "undo "+st.Compensation.Name)
			}
			if len(notes) > 0 {
				p += " (" + strings.Join(notes, "; ") + ")"
			}
			parts = append(parts, p)
		}
		fmt.Fprintf(w, "  level %d: %s\n", i, strings.Join(parts, ", "))
	}
}
