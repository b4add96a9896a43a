// Package chaos is sas's fault-run harness: it records a history of what
// was submitted and what happened, and checks the invariants of
// shared/RELIABILITY.md over the whole of it (check.go).
package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"sas/internal/remote"
	"sas/internal/statestore"
)

// History is what the harness itself saw.
type History struct {
	// Confirmed are the ids of valid orders the broker confirmed.
	Confirmed map[string]bool
	// Malformed maps the message id of every malformed message published
	// to the dead-letter reason it must get.
	Malformed map[string]string
	// DeadLettered maps message ids found in dead-letter queues to their
	// x-error-reason.
	DeadLettered map[string]string
}

// Violation is one broken invariant.
type Violation struct {
	Invariant int // numbered as in shared/RELIABILITY.md
	Detail    string
}

func (v Violation) String() string { return fmt.Sprintf("invariant %d: %s", v.Invariant, v.Detail) }

// Result is what Check found.
type Result struct {
	Confirmed                    int
	Completed, Failed, HeldError int
	// Spared are the completed orders an N-of-M join let end without a
	// branch that failed for good.
	Spared                  int
	Keys, Effects, Requests int // remote ledger: action keys applied, all effects, requests for those keys
	UndoEffects             int
	Violations              []Violation
}

// OK reports whether no invariant was broken.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// DuplicateAttemptRate is the share of remote requests beyond the first
// per applied key (retries, replays): allowed, and worth watching.
func (r Result) DuplicateAttemptRate() float64 {
	if r.Keys == 0 {
		return 0
	}
	return float64(r.Requests-r.Keys) / float64(r.Keys)
}

// Check checks the invariants over the harness's history, the state
// store's audit and the remote service's ledger, after the run healed and
// went quiet.
func Check(h History, a statestore.Audit, ledger []remote.Entry) Result {
	var r Result
	add := func(inv int, format string, args ...any) {
		r.Violations = append(r.Violations, Violation{inv, fmt.Sprintf(format, args...)})
	}
	r.Confirmed = len(h.Confirmed)
	orders := map[string]*statestore.AuditOrder{}
	for i := range a.Orders {
		orders[a.Orders[i].OrderID] = &a.Orders[i]
	}

	// 1. No lost order.
	for id := range h.Confirmed {
		if orders[id] == nil {
			add(1, "order %s was confirmed by the broker but is not in the store", id)
		}
	}
	// 7. No phantom orders: each was submitted, or started by sas
	// itself, as a sub-process's child or by a schedule.
	for id, o := range orders {
		if !h.Confirmed[id] && !startedBySAS(o, orders) {
			add(7, "order %s is in the store but was never submitted", id)
		}
	}
	checkTime(orders, add)

	applied := map[string]remote.Entry{}
	undone := map[string]int{}
	called := map[string]int{} // requests that reached the service, by key
	for _, e := range ledger {
		called[e.Key] += e.Calls
		// 3. At most one effect per key.
		if e.Effects > 1 {
			add(3, "key %s applied %d times", e.Key, e.Effects)
		}
		if e.Voided && e.Effects > 0 {
			add(3, "key %s applied although its undo voided it", e.Key)
		}
		if e.Effects == 0 {
			continue
		}
		r.Effects += e.Effects
		if orders[e.OrderID] == nil {
			add(7, "effect %s for order %s that is not in the store", e.Key, e.OrderID)
		}
		if e.Undoes != "" {
			undone[e.Undoes]++
			r.UndoEffects++
			continue
		}
		r.Keys++
		r.Requests += e.Calls
		applied[e.Key] = e
	}

	// Orders sas started itself (children) are checked as submitted ones
	// are; the counts are of the submitted.
	heldChild := map[string]bool{} // orders with a child held in error
	for _, o := range orders {
		if o.ParentOrder != "" && o.Status == statestore.OrderError {
			heldChild[o.ParentOrder] = true
		}
	}
	for id, o := range orders {
		if !h.Confirmed[id] && startedBySAS(o, orders) {
			checkOrder(o, heldChild[id], applied, undone, add)
			checkNeverRan(o, called, add)
		}
	}
	for id := range h.Confirmed {
		o := orders[id]
		if o == nil {
			continue
		}
		checkOrder(o, heldChild[id], applied, undone, add)
		checkNeverRan(o, called, add)
		switch o.Status {
		case statestore.OrderCompleted:
			r.Completed++
			if slices.ContainsFunc(o.Steps, func(s statestore.AuditStep) bool {
				return s.Kind == statestore.KindAction && s.ProcessState == statestore.StepCancelled
			}) {
				r.Spared++
			}
		case statestore.OrderFailed:
			r.Failed++
		case statestore.OrderError:
			r.HeldError++
		}
	}

	// 8. Poison is contained.
	for id, reason := range h.Malformed {
		got, ok := h.DeadLettered[id]
		switch {
		case !ok:
			add(8, "malformed message %s is in no dead-letter queue", id)
		case got != reason:
			add(8, "malformed message %s dead-lettered as %s, want %s", id, got, reason)
		}
	}
	// 9. Every outbox message published.
	if a.Unpublished > 0 {
		add(9, "%d outbox messages were never published", a.Unpublished)
	}
	sort.Slice(r.Violations, func(i, j int) bool {
		if r.Violations[i].Invariant != r.Violations[j].Invariant {
			return r.Violations[i].Invariant < r.Violations[j].Invariant
		}
		return r.Violations[i].Detail < r.Violations[j].Detail
	})
	return r
}

// checkOrder checks invariants 2, 4, 5, 6, 10 and the forward-call part
// of 7 for one confirmed order.
func checkOrder(o *statestore.AuditOrder, heldChild bool, applied map[string]remote.Entry, undone map[string]int, add func(int, string, ...any)) {
	// 2. One terminal outcome; a held order raised an alert; an order
	// awaiting a child held in error waits with it.
	switch o.Status {
	case statestore.OrderCompleted, statestore.OrderFailed:
	case statestore.OrderError:
		if o.Alerts == 0 {
			add(2, "order %s is held in error without an operator alert", o.OrderID)
		}
	case statestore.OrderProcessing:
		if !heldChild {
			add(2, "order %s ended %s, not completed, failed or error", o.OrderID, o.Status)
		}
	default:
		add(2, "order %s ended %s, not completed, failed or error", o.OrderID, o.Status)
	}
	// 2. Terminal states never change (without an operator), but for a
	// sub-process that completed and is undone by its parent's undoing
	// (saga atomicity, invariant 5: what the child did is the parent's).
	ended := false
	for _, t := range o.History {
		if t.Step != nil {
			continue
		}
		undoneByParent := o.ParentOrder != "" && t.From == statestore.OrderCompleted && t.To == statestore.OrderCompensating &&
			t.Reason == "its parent order "+o.ParentOrder+" is undone"
		if ended && !strings.HasPrefix(t.Actor, "operator:") && !undoneByParent {
			add(2, "order %s left a terminal state: %s -> %s by %s", o.OrderID, t.From, t.To, t.Actor)
		}
		ended = t.To == statestore.OrderCompleted || t.To == statestore.OrderFailed || t.To == statestore.OrderError
	}

	checkGraph(o, add)
	for _, st := range o.Steps {
		checkFencing(o, st, add)
		// 6. Bounded attempts.
		if st.FailureCount > st.MaxFailures {
			add(6, "order %s step %d failed %d times, threshold %d", o.OrderID, st.Step, st.FailureCount, st.MaxFailures)
		}
		if st.Kind != statestore.KindAction || st.ProcessState == statestore.StepSkipped || st.ForEach || st.InSystem {
			continue // a skipped step, a for_each step itself and a step sas performs call no service
		}
		e, isApplied := applied[st.IdempotencyKey]
		// 5. Saga atomicity.
		switch o.Status {
		case statestore.OrderCompleted:
			if st.ProcessState == statestore.StepCancelled && undone[st.IdempotencyKey] == 0 {
				break // a branch an N-of-M join spared (checkGraph): applied or not, never undone
			}
			if !isApplied || undone[st.IdempotencyKey] != 0 {
				add(5, "completed order %s: action %s applied %v, undone %d times", o.OrderID, st.Name, isApplied, undone[st.IdempotencyKey])
			}
		case statestore.OrderFailed:
			want := 0
			if isApplied {
				want = 1
			}
			if undone[st.IdempotencyKey] != want {
				add(5, "failed order %s: action %s applied %v, undone %d times", o.OrderID, st.Name, isApplied, undone[st.IdempotencyKey])
			}
		}
		// 7. No forward call after the order ended.
		if isApplied && (o.Status == statestore.OrderCompleted || o.Status == statestore.OrderFailed) && e.At.After(o.UpdatedAt.Add(time.Second)) {
			add(7, "order %s: action %s applied at %s, after the order ended at %s", o.OrderID, st.Name, e.At.Format(time.RFC3339Nano), o.UpdatedAt.Format(time.RFC3339Nano))
		}
	}
}

// checkNeverRan checks the part of invariant 5 that holds for every
// shape: no compensation of an action that never ran. An action sas
// answered for before any request of it left, on every attempt (its when
// false or failing, its for_each list or input failing, its child
// refused, its claim cancelled: Attempt <= UnsentAttempts), had its
// compensation never claimed and never called; and the service saw no
// request of it, so that the store's word for "never ran" is true.
func checkNeverRan(o *statestore.AuditOrder, called map[string]int, add func(int, string, ...any)) {
	neverRan := map[int]statestore.AuditStep{}
	for _, st := range o.Steps {
		if st.Kind == statestore.KindAction && !st.ForEach && st.Attempt <= st.UnsentAttempts {
			neverRan[st.Step] = st
			if !st.InSystem && called[st.IdempotencyKey] > 0 {
				add(5, "order %s: action %s (step %d) reached its service %d times, yet every attempt of it is recorded as never sent",
					o.OrderID, st.Name, st.Step, called[st.IdempotencyKey])
			}
		}
	}
	for _, c := range o.Steps {
		a, ok := neverRan[c.Compensates]
		if c.Kind != statestore.KindCompensation || !ok {
			continue
		}
		if c.Attempt > 0 || c.ProcessState == statestore.StepProcessed {
			add(5, "order %s: compensation %s (step %d) ran (%s, attempt %d) for action %s (step %d), which never ran",
				o.OrderID, c.Name, c.Step, c.ProcessState, c.Attempt, a.Name, a.Step)
		}
		if !c.InSystem && called[c.IdempotencyKey] > 0 {
			add(5, "order %s: compensation %s (step %d) reached its service for action %s (step %d), which never ran",
				o.OrderID, c.Name, c.Step, a.Name, a.Step)
		}
	}
}

// checkGraph checks invariant 10 for an order of a graph workflow: no
// step was claimed before every step it needs had ended (an action's
// needs processed or skipped, a compensation's processed, cancelled or
// skipped; for an N-of-M join, that many of them), no instance of a
// for_each step before that step expanded; no step was made pending from
// waiting twice (a join runs once); and a completed order ended every
// action (no join was lost) but those an N-of-M join spared, each
// cancelled for that reason.
func checkGraph(o *statestore.AuditOrder, add func(int, string, ...any)) {
	steps := map[int]statestore.AuditStep{}
	graph := false
	for _, st := range o.Steps {
		steps[st.Step] = st
		graph = graph || st.Needs != nil
	}
	if !graph {
		return
	}
	ended := map[int]int{}   // step -> place in the history of its first end
	claimed := map[int]int{} // step -> place in the history of its first claim
	readied := map[int]int{} // step -> waiting -> pending transitions
	for i, t := range o.History {
		if t.Step == nil {
			continue
		}
		n := *t.Step
		switch t.To {
		case statestore.StepProcessing:
			if _, ok := claimed[n]; !ok {
				claimed[n] = i
			}
		case statestore.StepProcessed, statestore.StepSkipped, statestore.StepCancelled, statestore.StepExpanded:
			if _, ok := ended[n]; !ok && (t.To != statestore.StepCancelled || steps[n].Kind == statestore.KindCompensation) {
				ended[n] = i
			}
		}
		if t.From == statestore.StepWaiting && t.To == statestore.StepPending {
			readied[n]++
		}
	}
	for _, st := range o.Steps {
		if readied[st.Step] > 1 {
			add(10, "order %s step %d was made pending from waiting %d times", o.OrderID, st.Step, readied[st.Step])
		}
		c, ok := claimed[st.Step]
		if !ok {
			continue
		}
		needs := st.Needs
		if st.Parent > 0 && st.Kind == statestore.KindAction {
			needs = []int{st.Parent} // an instance runs once its step expanded
		}
		if q := st.Quorum(); q != "" {
			before := 0
			for _, n := range needs {
				if e, ok := ended[n]; ok && e < c {
					before++
				}
			}
			if before < st.Required(len(needs)) {
				add(10, "order %s step %d (%s), a join of %s, was claimed when %d of its needs had ended", o.OrderID, st.Step, st.Name, q, before)
			}
			continue
		}
		for _, n := range needs {
			if e, ok := ended[n]; !ok || e > c {
				add(10, "order %s step %d (%s) was claimed before step %d, which it needs, ended", o.OrderID, st.Step, st.Name, n)
			}
		}
	}
	if o.Status == statestore.OrderCompleted {
		spared := map[int]bool{}
		for _, t := range o.History {
			if t.Step != nil && t.To == statestore.StepCancelled &&
				(t.Reason == "failed for good; a join can do without it" || t.Reason == "a join no longer needs it") {
				spared[*t.Step] = true
			}
		}
		joins := slices.ContainsFunc(o.Steps, func(s statestore.AuditStep) bool { return s.Quorum() != "" })
		for _, st := range o.Steps {
			if st.Kind == statestore.KindAction && st.ProcessState != statestore.StepProcessed && st.ProcessState != statestore.StepSkipped &&
				(st.ProcessState != statestore.StepCancelled || !spared[st.Step] || !joins) {
				add(10, "completed order %s: step %d (%s) is %s", o.OrderID, st.Step, st.Name, st.ProcessState)
			}
		}
	}
}

// checkFencing checks invariant 4 for a step: its history is continuous
// (each change starts from the state the one before ended in), and every
// change out of processing was made for the attempt that held the step
// then (the latest claim), so no stale reply or sweep changed anything.
func checkFencing(o *statestore.AuditOrder, st statestore.AuditStep, add func(int, string, ...any)) {
	current := 0
	state := ""
	for _, t := range o.History {
		if t.Step == nil || *t.Step != st.Step {
			continue
		}
		if state == "" && t.From == statestore.StepWaiting {
			// A step created waiting has no creation row.
			state = statestore.StepWaiting
		}
		if t.From != state {
			add(4, "order %s step %d: %s -> %s (attempt %d, by %s) although the step was %s", o.OrderID, st.Step, t.From, t.To, t.Attempt, t.Actor, state)
		}
		state = t.To
		switch {
		case t.To == statestore.StepProcessing:
			if t.Attempt <= current {
				add(4, "order %s step %d claimed for attempt %d after attempt %d", o.OrderID, st.Step, t.Attempt, current)
			}
			current = t.Attempt
		case t.From == statestore.StepProcessing && t.Attempt != current:
			add(4, "order %s step %d: %s -> %s written for attempt %d while attempt %d held it", o.OrderID, st.Step, t.From, t.To, t.Attempt, current)
		}
	}
	if st.Attempt != current {
		add(4, "order %s step %d is at attempt %d but its last claim was attempt %d", o.OrderID, st.Step, st.Attempt, current)
	}
	if state == "" && st.ProcessState == statestore.StepWaiting {
		state = statestore.StepWaiting
	}
	if state != st.ProcessState {
		add(4, "order %s step %d is %s but its history ends in %s", o.OrderID, st.Step, st.ProcessState, state)
	}
}
