package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"sas/internal/intake"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// graphStore is what the scheduler needs of the state store to answer for
// a claimed step of a graph itself.
type graphStore interface {
	SkipStep(ctx context.Context, c statestore.ClaimedStep, actor, reason string) (statestore.GraphResult, error)
	ExpandStep(ctx context.Context, c statestore.ClaimedStep, items []json.RawMessage, actor string) (statestore.GraphResult, error)
	AwaitStep(ctx context.Context, c statestore.ClaimedStep, actor string) (statestore.GraphResult, error)
	StartChild(ctx context.Context, c statestore.ClaimedStep, child statestore.NewOrder, version statestore.WorkflowVersion,
		actor string) (statestore.GraphResult, error)
	UndoChild(ctx context.Context, c statestore.ClaimedStep, actor string) (statestore.GraphResult, error)
	FailUnsent(ctx context.Context, c statestore.ClaimedStep, actor, reason string) (statestore.GraphResult, error)
	ApplyReply(ctx context.Context, r statestore.Reply) (statestore.ApplyResult, error)
}

// graphSteps reads what a claimed step of a graph says beyond a list's
// keys, before its request is sent: a when that is false skips the step;
// a for_each runs it as one instance per item of its list; an input
// builds the request's input. An expression that fails (a missing key, a
// wrong type, a list past max_items) fails the step for good, with the
// expression's error as the reason.
type graphSteps struct {
	store graphStore
	exprs *workflow.Exprs
	me    string
	// workflows are the file's: a sub-process step starts a child of its
	// workflow's current version.
	workflows *workflow.Registry
}

// outcome of prepare: what became of a claimed step.
type outcome int

const (
	send     outcome = iota // its request is to be sent (with its input)
	answered                // skipped, expanded or failed here: nothing to send
	unsure                  // the store could not be told: the claim runs out and the supervisor retries it
)

// answer is what a claimed step needs of the store when nothing is to be
// sent for it: its skip, expansion, wait, child or failure, told to the
// store when called.
type answer func() (outcome, []byte, error)

// plan decides what a claimed step of a graph needs without a word to the
// store: its request's input, or (non-nil) the answer that tells the
// store what became of it, for the caller to run after the requests of
// its batch have left. A list's step (no spec, no item) is sent as it is.
func (g *graphSteps) plan(ctx context.Context, s *statestore.ClaimedStep) ([]byte, answer) {
	fail := func(why error) ([]byte, answer) {
		return nil, func() (outcome, []byte, error) { return g.fail(ctx, s, why) }
	}
	if s.Spec == nil && s.Index == nil {
		return nil, nil
	}
	var spec workflow.StepSpec
	if s.Spec != nil {
		if err := json.Unmarshal(s.Spec, &spec); err != nil {
			return fail(fmt.Errorf("the step's spec cannot be read: %w", err))
		}
	}
	vars := workflow.Vars{Payload: s.Payload, Results: s.Results, Item: s.Item}
	if s.Index != nil {
		vars.Index = *s.Index
	}
	if spec.When != "" && s.Index == nil {
		e, err := g.expr(spec.When, workflow.UseWhen)
		var ok bool
		if err == nil {
			ok, err = e.Bool(vars)
		}
		if err != nil {
			return fail(err)
		}
		if !ok {
			return nil, func() (outcome, []byte, error) {
				// In the trace, the span that would have sent the request.
				trace.SpanFromContext(ctx).SetName("skip " + s.Name)
				_, err := g.store.SkipStep(ctx, *s, g.me, "when "+strconv.Quote(spec.When)+" is false")
				return g.done(err)
			}
		}
	}
	if spec.ForEach != "" && s.Index == nil {
		e, err := g.expr(spec.ForEach, workflow.UseForEach)
		var items []json.RawMessage
		if err == nil {
			items, err = e.List(vars)
		}
		if err == nil && len(items) > max(spec.MaxItems, 1) {
			err = fmt.Errorf("for_each %q has %d items, more than its max_items %d", spec.ForEach, len(items), max(spec.MaxItems, 1))
		}
		if err != nil {
			return fail(err)
		}
		return nil, func() (outcome, []byte, error) {
			span := trace.SpanFromContext(ctx)
			span.SetName("expand " + s.Name)
			span.SetAttributes(attribute.Int("sas.instances", len(items)))
			_, err := g.store.ExpandStep(ctx, *s, items, g.me)
			return g.done(err)
		}
	}
	if spec.Workflow != "" && s.Index == nil {
		return nil, func() (outcome, []byte, error) { return g.child(ctx, s, spec, vars) }
	}
	if s.Agent == "" && s.Index == nil {
		// A step sas performs itself: a wait begins to wait (or ends at
		// once with a signal kept for it); a timer alone ended when its
		// delay did, and so does the step.
		return nil, func() (outcome, []byte, error) {
			span := trace.SpanFromContext(ctx)
			if spec.Wait != nil {
				span.SetName("await " + s.Name)
				_, err := g.store.AwaitStep(ctx, *s, g.me)
				return g.done(err)
			}
			span.SetName("timer " + s.Name)
			_, err := g.store.ApplyReply(ctx, statestore.Reply{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt, OK: true, Actor: g.me})
			return g.done(err)
		}
	}
	if spec.Input == "" {
		return nil, nil
	}
	use := workflow.UseInput
	if s.Index != nil {
		use = workflow.UseItemInput
	}
	e, err := g.expr(spec.Input, use)
	var input []byte
	if err == nil {
		input, err = e.JSON(vars)
	}
	if err != nil {
		return fail(err)
	}
	return input, nil
}

// child answers for a claimed sub-process step: it starts the step's
// child order, its payload the step's input (a JSON object), else the
// order's; the step's compensation undoes the child. A payload the
// child's workflow refuses, or a child past the deepest nesting, fails
// the step for good with the reason.
func (g *graphSteps) child(ctx context.Context, s *statestore.ClaimedStep, spec workflow.StepSpec, vars workflow.Vars) (outcome, []byte, error) {
	span := trace.SpanFromContext(ctx)
	if s.Kind == statestore.KindCompensation {
		span.SetName("undo child " + s.Name)
		_, err := g.store.UndoChild(ctx, *s, g.me)
		return g.done(err)
	}
	wf, ok := g.workflows.Lookup(spec.Workflow)
	if !ok {
		return g.fail(ctx, s, fmt.Errorf("workflow %q of the sub-process is not in the workflows file (%s)", spec.Workflow, g.workflows.Source))
	}
	payload := []byte(s.Payload)
	if spec.Input != "" {
		e, err := g.expr(spec.Input, workflow.UseInput)
		if err == nil {
			payload, err = e.JSON(vars)
		}
		if err == nil && (len(payload) == 0 || payload[0] != '{') {
			err = fmt.Errorf("the input %q of a sub-process is its child's payload: it must be a JSON object", spec.Input)
		}
		if err != nil {
			return g.fail(ctx, s, err)
		}
	}
	value, err := messages.PayloadValue(payload)
	if err == nil {
		err = wf.CheckPayloadValue(value)
	}
	if err == nil {
		err = wf.CheckForEach(payload)
	}
	if err != nil {
		return g.fail(ctx, s, fmt.Errorf("workflow %s refuses the child's payload: %w", wf.Name, err))
	}
	child := statestore.NewOrder{OrderID: messages.DerivedID("child:" + s.IdempotencyKey), Workflow: wf.Name, WorkflowVersion: wf.Version(),
		Payload: payload, Priority: s.Priority, PayloadHash: statestore.DerivedHash(wf.Name, payload), FailurePolicy: wf.Policy,
		Steps: statestore.StepsOf(wf, 0), Actor: g.me, Traceparent: s.Traceparent, Attributes: intake.Attributes(wf, payload), Key: intake.Key(wf, payload)}
	child.Deadline, child.OnDeadline = wf.Deadline(0)
	version := statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: g.me}
	span.SetName("start child " + s.Name)
	span.SetAttributes(attribute.String("sas.child_order_id", child.OrderID), attribute.String("sas.child_workflow", wf.Name))
	_, err = g.store.StartChild(ctx, *s, child, version, g.me)
	if errors.Is(err, statestore.ErrTooDeep) {
		return g.fail(ctx, s, fmt.Errorf("its child (workflow %s) would be more than %d levels of sub-processes deep", wf.Name, workflow.MaxDepth))
	}
	return g.done(err)
}

// expr is text compiled for use (the file was checked when it was read:
// a failure here is a definition stored by another version).
func (g *graphSteps) expr(text, use string) (*workflow.Expr, error) {
	e, err := g.exprs.Get(text, use)
	if err != nil {
		return nil, fmt.Errorf("%s %q does not compile: %w", use, text, err)
	}
	return e, nil
}

// fail fails the step for good with why, fenced as an agent's failed
// reply is; no request for this attempt left, so the step's compensation
// will not run unless an earlier attempt's did (FailUnsent).
func (g *graphSteps) fail(ctx context.Context, s *statestore.ClaimedStep, why error) (outcome, []byte, error) {
	reason := messages.BoundText(why.Error(), messages.MaxReasonBytes)
	trace.SpanFromContext(ctx).SetName("fail " + s.Name)
	_, err := g.store.FailUnsent(ctx, *s, g.me, reason)
	return g.done(err)
}

func (g *graphSteps) done(err error) (outcome, []byte, error) {
	switch {
	case err == nil, errors.Is(err, statestore.ErrStale):
		return answered, nil, nil
	default:
		return unsure, nil, err
	}
}
