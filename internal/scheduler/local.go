package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/steptoken"
	"sas/internal/workflow"
)

// Local is a scheduler's handling of steps with the broker taken out: its
// claim, its decisions for each claimed step (a when, a for_each, a wait,
// a timer alone, a sub-process, an input, a request too large to send)
// and its application of replies, each through the same code and store
// functions as a running scheduler's. `sasctl workflows test` runs a
// process's cases through it, the requests answered by scripted services
// instead of agents.
type Local struct {
	store     *statestore.Store
	graph     *graphSteps
	tokens    steptoken.Key
	me        string
	kinds     []string
	workflows *workflow.Registry
}

// NewLocal is a Local for the workflows' agent kinds, named me in the
// store's history, minting step tokens with tokens.
func NewLocal(store *statestore.Store, workflows *workflow.Registry, me string, tokens steptoken.Key) *Local {
	return &Local{store: store, tokens: tokens, me: me, kinds: workflows.Agents(), workflows: workflows,
		graph: &graphSteps{store: store, exprs: workflow.NewExprs(1000), me: me, workflows: workflows}}
}

// StoreLimits keeps the workflows' limits in the store, as a scheduler
// does at its start.
func (l *Local) StoreLimits(ctx context.Context) error {
	return storeLimits(ctx, l.store, l.workflows, l.kinds, 1, slog.New(slog.DiscardHandler))
}

// Claim claims up to room pending steps of each agent kind and of the
// steps sas performs itself, as the claimer does (the kinds whose limits
// hold every step in claims of their own, under their limits), and
// dispatches them: the requests to send are returned, with how many
// steps it claimed.
func (l *Local) Claim(ctx context.Context, room int) ([]messages.StepRequest, int, error) {
	managed, err := l.store.ManagedKinds(ctx)
	if err != nil {
		return nil, 0, err
	}
	for _, k := range l.workflows.KeyedKinds() {
		if _, ok := managed[k]; !ok {
			managed[k] = false
		}
	}
	rooms := make(map[string]int, len(l.kinds)+1)
	for _, k := range l.kinds {
		if !managed[k] {
			rooms[k] = room
		}
	}
	rooms[""] = room
	steps, err := l.store.ClaimKinds(ctx, l.me, rooms)
	if err != nil {
		return nil, 0, err
	}
	for _, k := range l.kinds {
		if _, ok := managed[k]; !ok {
			continue
		}
		lc, err := l.store.ClaimLimited(ctx, l.me, k, room)
		if err != nil {
			return nil, 0, err
		}
		steps = append(steps, lc.Steps...)
	}
	reqs, err := l.Dispatch(ctx, steps)
	return reqs, len(steps), err
}

// Dispatch decides every claimed step as the claimer's dispatch does: the
// steps answered here are told to the store after the requests are made,
// and the requests to send are returned.
func (l *Local) Dispatch(ctx context.Context, steps []statestore.ClaimedStep) ([]messages.StepRequest, error) {
	var reqs []messages.StepRequest
	var answers []answer
	for _, s := range steps {
		input, ans := l.graph.plan(ctx, &s)
		if ans != nil {
			answers = append(answers, ans)
			continue
		}
		req := stepRequest(s, input, l.tokens.Mint(steptoken.Ref{OrderID: s.OrderID, Step: s.Step, Attempt: s.Attempt}))
		if _, err := request(s, input, req.Token); err != nil {
			reason := messages.BoundText("sas could not send the step's request: "+err.Error(), messages.MaxReasonBytes)
			if _, err := l.store.FailUnsent(ctx, s, l.me, reason); err != nil {
				return nil, err
			}
			continue
		}
		reqs = append(reqs, req)
	}
	for _, ans := range answers {
		if _, _, err := ans(); err != nil {
			return nil, err
		}
	}
	return reqs, nil
}

// Reply applies an agent's reply as the replier does (an accepted call
// holds its attempt open, an abandoned one keeps its last answer, the
// others are applied through the fence) and dispatches the next step
// claimed with it (in the same statement, as a replier's is). A stale reply changes nothing and is no error.
func (l *Local) Reply(ctx context.Context, rep messages.StepReply) ([]messages.StepRequest, error) {
	switch rep.Outcome {
	case messages.OutcomeAbandoned:
		_, err := l.store.NoteAnswer(ctx, rep.OrderID, rep.Step, rep.Attempt, rep.LastAnswer)
		return nil, err
	case messages.OutcomeAccepted:
		h := statestore.Hold{OrderID: rep.OrderID, Step: rep.Step, Attempt: rep.Attempt,
			For: time.Duration(rep.HoldMS) * time.Millisecond, Answer: rep.LastAnswer, Actor: l.me}
		if h.Answer == "" {
			h.Answer = "202 Accepted"
		}
		_, err := l.store.HoldStep(ctx, h)
		if errors.Is(err, statestore.ErrStale) {
			err = nil
		}
		return nil, err
	case messages.OutcomeOK, messages.OutcomeFailed:
	default:
		return nil, fmt.Errorf("a reply's outcome %q is not one an agent sends", rep.Outcome)
	}
	// As a replier whose agents' queues have room: the next step of the
	// order is claimed in the reply's statement.
	results, errs := l.store.ApplyRepliesClaiming(ctx, []statestore.Reply{{OrderID: rep.OrderID, Step: rep.Step, Attempt: rep.Attempt,
		OK: rep.Outcome == messages.OutcomeOK, Result: rep.Result, Error: rep.Error, LastAnswer: rep.LastAnswer, Actor: l.me}}, l.kinds)
	res, err := results[0], errs[0]
	switch {
	case errors.Is(err, statestore.ErrStale):
		return nil, nil
	case err != nil:
		return nil, err
	case res.Claimed == nil:
		return nil, nil
	}
	return l.Dispatch(ctx, []statestore.ClaimedStep{*res.Claimed})
}
