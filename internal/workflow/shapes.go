package workflow

import "strings"

// The shapes of a step, declared once: what each is in a workflows file,
// the states its row passes through, and the moves between them. The
// state store holds the same moves in its tables step_moves and
// order_moves (migration 0034), which its doors (the triggers
// steps_moved and orders_moved) check every change against; a test keeps
// the two the same, another that every move is on some shape's path and
// every path made of declared moves.

// A step's states (the steps table's process_state).
const (
	StateWaiting    = "waiting"    // its needs (or the step before) have not ended
	StateDelayed    = "delayed"    // runnable once its delay ends (due_at)
	StatePending    = "pending"    // runnable: a scheduler may claim it
	StateProcessing = "processing" // claimed: an attempt runs until complete_by
	StateAwaiting   = "awaiting"   // waits for a signal or a child order (due_at)
	StateExpanded   = "expanded"   // a for_each step whose instances run
	StateProcessed  = "processed"  // ended well
	StateSkipped    = "skipped"    // ended doing nothing (when false, a wait's skip)
	StateError      = "error"      // failed for good
	StateCancelled  = "cancelled"  // will not run (the order is undone, or its action never ran)
)

// StepMove is a move a step may make. Via, when set, is the state a move
// made in one write passes through (the history tells it as two moves:
// From to Via, for ViaWhy, then Via to To). By says who makes it. Event
// is the step event it tells subscribers (StepEvent), "" for none.
type StepMove struct {
	From, To    string
	Via, ViaWhy string
	By          string
	Event       string
}

// The step events a move tells subscribers (messages.StepEvent): on the
// status exchange, routing key step.EVENT.
const (
	EventClaimed   = "claimed"   // an attempt was claimed and sent to its agent
	EventAwaiting  = "awaiting"  // it waits for a signal, or for its child order
	EventProcessed = "processed" // it ended well ("compensated" for a compensation)
	EventFailed    = "failed"    // it failed for good
	EventSkipped   = "skipped"   // it ended doing nothing
	EventCancelled = "cancelled" // it will not run
)

// StepEvent is the step event a move from one state to another tells,
// "" for none: a claim, a wait that begins, and every end.
func StepEvent(from, to string) string {
	switch {
	case to == StateProcessing && from != StateProcessing:
		return EventClaimed
	case to == StateAwaiting:
		return EventAwaiting
	case to == StateProcessed:
		return EventProcessed
	case to == StateError:
		return EventFailed
	case to == StateSkipped:
		return EventSkipped
	case to == StateCancelled:
		return EventCancelled
	}
	return ""
}

// StepMoves are the moves a step may make, as step_moves holds them,
// each with the step event it tells (StepEvent).
func StepMoves() []StepMove {
	moves := stepMoves()
	for i := range moves {
		moves[i].Event = StepEvent(moves[i].From, moves[i].To)
	}
	return moves
}

func stepMoves() []StepMove {
	return []StepMove{
		{From: StateWaiting, To: StatePending, By: "the step before, or every step it needs, ended (reply, signal, timer, operator)"},
		{From: StateWaiting, To: StateDelayed, By: "as waiting to pending, for a step with a delay"},
		{From: StateDelayed, To: StatePending, By: "the supervisor: its delay ended"},
		{From: StateWaiting, To: StateAwaiting, By: "as waiting to pending, for a wait (no claim: it begins to wait)"},
		{From: StateDelayed, To: StateAwaiting, By: "the supervisor: a wait's delay ended (no claim: it begins to wait)"},
		{From: StateDelayed, To: StateProcessed, By: "the supervisor: a timer alone ended (no claim)"},
		{From: StateWaiting, To: StateProcessing, Via: StatePending, ViaWhy: "previous step processed",
			By: "a scheduler: the reply that ended the step before claims it at once"},
		{From: StatePending, To: StateProcessing, By: "a scheduler's claim"},
		{From: StateProcessing, To: StatePending, By: "the supervisor (complete_by passed) or a scheduler handing it back"},
		{From: StateProcessing, To: StateProcessed, By: "a reply ok; a signal that came before the wait; nothing to undo"},
		{From: StateProcessing, To: StateError, By: "a reply failed for good; the supervisor at the threshold"},
		{From: StatePending, To: StateError, By: "the supervisor: its order's deadline passed under on_deadline: hold"},
		{From: StateProcessing, To: StateSkipped, By: "a scheduler: its when is false"},
		{From: StateProcessing, To: StateExpanded, By: "a scheduler: its for_each list was read"},
		{From: StateProcessing, To: StateAwaiting, By: "a scheduler: a wait begins, or a child order is started or undone"},
		{From: StateProcessing, To: StateProcessing, By: "the service's 202 or first heartbeat holds the attempt open"},
		{From: StateAwaiting, To: StateProcessed, By: "its signal came; its child order ended (completed, or undone)"},
		{From: StateAwaiting, To: StateError, By: "its wait timed out; its child order failed"},
		{From: StateAwaiting, To: StateSkipped, By: "its wait timed out with on_timeout: skip"},
		{From: StateExpanded, To: StateProcessed, By: "its last instance ended"},
		{From: StateWaiting, To: StateCancelled, By: "the order is undone; a compensation whose action never ran"},
		{From: StateDelayed, To: StateCancelled, By: "the order is undone"},
		{From: StatePending, To: StateCancelled, By: "the order is undone"},
		{From: StateProcessing, To: StateCancelled, By: "the order is undone (a list's step in flight, a claim of an order no longer running)"},
		{From: StateAwaiting, To: StateCancelled, By: "the order is undone"},
		{From: StateExpanded, To: StateCancelled, By: "the order is undone"},
		{From: StateError, To: StateCancelled, By: "a branch failed for good that an N-of-M join can do without (joins_spare)"},
		{From: StateError, To: StatePending, By: "an operator's resubmit"},
		{From: StateProcessed, To: StatePending, By: "an operator runs an ended action again"},
		{From: StateSkipped, To: StatePending, By: "an operator runs an ended action again"},
		{From: StateWaiting, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateDelayed, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateAwaiting, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateProcessed, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateSkipped, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateExpanded, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateError, To: StateWaiting, By: "an operator runs again a step it depends on"},
		{From: StateCancelled, To: StateWaiting, By: "an operator runs a for_each step again: its compensation comes back"},
	}
}

// OrderMove is a move an order may make.
type OrderMove struct {
	From, To string
	By       string
}

// OrderMoves are the moves an order may make, as order_moves holds them
// (its first status, received, is written with the order).
func OrderMoves() []OrderMove {
	return []OrderMove{
		{From: "received", To: "processing", By: "its first step claimed"},
		{From: "received", To: "completed", By: "every step ended before any was claimed (skipped, timers)"},
		{From: "received", To: "compensating", By: "a step failed before any was claimed; an operator's cancel"},
		{From: "received", To: "failed", By: "undone with nothing to undo"},
		{From: "received", To: "error", By: "a step failed for good under hold"},
		{From: "processing", To: "completed", By: "its last step ended"},
		{From: "processing", To: "compensating", By: "a step failed for good; an operator's cancel"},
		{From: "processing", To: "failed", By: "undone with nothing to undo"},
		{From: "processing", To: "error", By: "a step failed for good under hold"},
		{From: "completed", To: "compensating", By: "a sub-process's parent undone after the child completed"},
		{From: "compensating", To: "failed", By: "its last compensation ended"},
		{From: "compensating", To: "error", By: "a compensation failed for good"},
		{From: "error", To: "processing", By: "an operator's resubmit"},
		{From: "error", To: "compensating", By: "an operator's resubmit of a compensation; an operator's cancel"},
		{From: "error", To: "failed", By: "an operator's cancel with nothing to undo"},
	}
}

// Shape is one shape of step: how a workflows file says it and the ways
// its life can go, each a path of states, every two in a row a StepMove.
type Shape struct {
	Name  string
	Says  string
	Paths []string
}

// Shapes are every shape of step there is. Row.Shape names a row's.
func Shapes() []Shape {
	return []Shape{
		{Name: "action", Says: "action: and agent: (a list's step, or a graph's with needs:)", Paths: []string{
			"waiting pending processing processed",
			"waiting processing processed",                    // claimed by the reply before it
			"waiting pending processing error pending",        // failed for good, resubmitted
			"waiting pending error pending",                   // held at its order's deadline, resubmitted
			"pending processing pending processing processed", // complete_by passed, or handed back
			"waiting processing processing processed",         // a service's 202, then its callback
			"pending processing skipped",                      // when: false
			"waiting delayed pending processing processed",    // delay:
			"processed pending processing processed",          // run again by an operator
			"skipped pending processing processed",
			"processed waiting pending processing processed", // run again: it depends on a step run again
			"skipped waiting pending processing processed",   // run again: it depends on a step run again
			"waiting cancelled", "delayed cancelled", "pending cancelled", "processing cancelled",
			"pending processing error cancelled", // a branch an N-of-M join spared (needs: {any: N, of: [...]})
			"error waiting", "waiting waiting", "delayed waiting",
		}},
		{Name: "compensation", Says: "compensation: under an action", Paths: []string{
			"waiting pending processing processed",
			"waiting processing processed",
			"waiting cancelled", // its action never ran
			"waiting pending processing error pending processing processed",
		}},
		{Name: "timer", Says: "delay: with no agent", Paths: []string{
			"waiting delayed processed",                    // ends where its delay does, with no claim
			"waiting delayed pending processing processed", // with a when: read at its claim
		}},
		{Name: "wait", Says: "wait: {signal:, timeout:}", Paths: []string{
			"waiting awaiting processed", // begins to wait as it becomes runnable; its signal came (first, or then)
			"waiting awaiting skipped",   // on_timeout: skip
			"waiting awaiting error",
			"delayed awaiting processed",                    // after its delay
			"waiting pending processing awaiting processed", // with a when: read at its claim
			"waiting pending processing processed",          // its signal came first
			"pending processing awaiting skipped",
			"awaiting cancelled", "awaiting waiting",
		}},
		{Name: "sub-process", Says: "workflow: (a child order)", Paths: []string{
			"waiting pending processing awaiting processed",
			"pending processing awaiting error",
		}},
		{Name: "sub-process undo", Says: "the compensation of a sub-process step", Paths: []string{
			"waiting pending processing awaiting processed", // its child order undone
			"waiting pending processing processed",          // no child to undo
		}},
		{Name: "for_each", Says: "for_each: (one instance per item)", Paths: []string{
			"waiting pending processing expanded processed",
			"processing expanded cancelled",
			"expanded waiting",
		}},
		{Name: "instance", Says: "one item of a for_each step", Paths: []string{
			"waiting pending processing processed",
			"waiting pending processing error",
		}},
		{Name: "instance undo", Says: "a for_each step's compensation, one per instance", Paths: []string{
			"waiting pending processing processed",
			"waiting cancelled", // the step's own, replaced by the instances'
			"cancelled waiting", // back when the for_each step runs again
			"waiting cancelled waiting",
		}},
	}
}

// Shape names the shape of a row (of Rows), as Shapes declares it: a
// for_each step's instances and their compensations are made by the state
// store, not by Rows.
func (r Row) Shape() string {
	switch {
	case r.Compensates > 0 && r.Workflow != "":
		return "sub-process undo"
	case r.Compensates > 0:
		return "compensation"
	case r.Workflow != "":
		return "sub-process"
	case r.Wait != nil:
		return "wait"
	case r.ForEach != "":
		return "for_each"
	case r.Agent == "":
		return "timer"
	}
	return "action"
}

// shapeFields are the fields of Step that decide a row's shape (Row.Shape
// reads them); commonFields every other field of Step. A field added to
// Step is in neither until it is declared, and a test fails.
func shapeFields() []string { return []string{"Compensation", "Workflow", "Wait", "ForEach", "Agent"} }

func commonFields() []string {
	return []string{"Name", "Timeout", "MaxFailures", "BackoffBase", "BackoffMax", "ID", "Needs", "Join", "When",
		"MaxParallel", "MaxItems", "Input", "Delay", "MaxDuration"}
}

// PathMoves splits a path of states into its moves.
func PathMoves(path string) [][2]string {
	states := strings.Fields(path)
	out := make([][2]string, 0, len(states))
	for i := 1; i < len(states); i++ {
		out = append(out, [2]string{states[i-1], states[i]})
	}
	return out
}
