package statestore

import (
	"context"
	"encoding/json"
	"fmt"
)

// A step of a graph workflow may end without its agent: a scheduler that
// claimed it reads its when (false: SkipStep) or its for_each list
// (ExpandStep) and answers for it, fenced by the attempt as a reply is.
// What runs next is the graph_advance function's to decide
// (sql/20_steps.sql).

// GraphResult says what a scheduler's answer for a claimed step changed.
type GraphResult struct {
	// NextStep is the lowest step made pending, or 0.
	NextStep int
	// OrderStatus is the order's status when the answer ended it
	// (completed, failed), or "".
	OrderStatus string
}

// SkipStep skips a claimed step whose when was false: it does nothing, is
// not undone, and counts as ended for the steps that need it. reason goes
// in the history. A claim that is no longer the step's gives a
// *StaleReplyError.
func (s *Store) SkipStep(ctx context.Context, c ClaimedStep, actor, reason string) (GraphResult, error) {
	return s.answerFor(ctx, c, "skip", `step_skip($1, $2, $3, $4, $5)`, actor, reason)
}

// ExpandStep runs a claimed for_each step as one instance per item (each a
// step of its own, with its item and index), up to its max_parallel at
// once; the step is processed when they all are, its result the list of
// theirs. A claim that is no longer the step's gives a *StaleReplyError.
func (s *Store) ExpandStep(ctx context.Context, c ClaimedStep, items []json.RawMessage, actor string) (GraphResult, error) {
	if items == nil {
		items = []json.RawMessage{}
	}
	list, err := json.Marshal(items)
	if err != nil {
		return GraphResult{}, fmt.Errorf("expand order %s step %d: %w", c.OrderID, c.Step, err)
	}
	return s.answerFor(ctx, c, "expand", `step_expand($1, $2, $3, $4, $5)`, string(list), actor)
}

// FailUnsent fails a claimed step for good before any request for it
// left (its when, for_each list or input failed; its child was refused),
// with reason, as a failed reply fails it; its attempt counts as unsent,
// so that its compensation does not run for an action that never ran. A
// claim that is no longer the step's gives a *StaleReplyError.
func (s *Store) FailUnsent(ctx context.Context, c ClaimedStep, actor, reason string) (GraphResult, error) {
	return s.answerFor(ctx, c, "fail", `step_fail_unsent($1, $2, $3, $4, $5)`, actor, reason)
}

// AwaitStep begins a claimed wait step's wait: a signal its order kept
// for it ends it at once, else it awaits one until its timeout. A claim
// that is no longer the step's gives a *StaleReplyError.
func (s *Store) AwaitStep(ctx context.Context, c ClaimedStep, actor string) (GraphResult, error) {
	return s.answerFor(ctx, c, "await", `step_await($1, $2, $3, $4)`, actor)
}

// answerFor runs fn, a function answering for the claimed step c (its
// order, step and attempt are $1 to $3, args follow), and reads what it
// changed; a claim that is no longer the step's gives its stale reason.
func (s *Store) answerFor(ctx context.Context, c ClaimedStep, what, fn string, args ...any) (GraphResult, error) {
	var res GraphResult
	var applied bool
	err := s.pool.QueryRow(ctx, `SELECT applied, next_step, order_status FROM `+fn,
		append([]any{c.OrderID, c.Step, c.Attempt}, args...)...).Scan(&applied, &res.NextStep, &res.OrderStatus)
	if err != nil {
		return GraphResult{}, fmt.Errorf("%s order %s step %d: %w", what, c.OrderID, c.Step, classify(err))
	}
	if !applied {
		return GraphResult{}, s.staleReason(ctx, Reply{OrderID: c.OrderID, Step: c.Step, Attempt: c.Attempt})
	}
	return res, nil
}
