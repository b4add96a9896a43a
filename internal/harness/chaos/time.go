package chaos

import (
	"strings"

	"sas/internal/statestore"
)

// scheduleLabel is the actor of the history row that wrote an order a
// schedule started: "schedule:NAME (tick T)".
const scheduleLabel = "schedule:"

// startedBySAS reports whether sas itself started o: a sub-process's
// child whose parent is in the store, or a schedule's order.
func startedBySAS(o *statestore.AuditOrder, orders map[string]*statestore.AuditOrder) bool {
	if o.ParentOrder != "" {
		return orders[o.ParentOrder] != nil
	}
	return scheduledAs(o) != ""
}

// scheduledAs is the schedule and tick that started o ("" for none).
func scheduledAs(o *statestore.AuditOrder) string {
	for _, t := range o.History {
		if t.Step == nil && t.To == statestore.OrderReceived && strings.HasPrefix(t.Actor, scheduleLabel) {
			return t.Actor
		}
	}
	return ""
}

// checkTime checks invariant 11, time and the outside world: no timer
// fired before its due time; no wait ended without its signal or before
// its timeout; one child per sub-process step (a step run again with a
// new key may start another), a completed order's children completed
// and a step failed by its child's failure has no completed child; one
// order per schedule tick.
func checkTime(orders map[string]*statestore.AuditOrder, add func(int, string, ...any)) {
	ticks := map[string]string{}
	children := map[string]map[int][]*statestore.AuditOrder{}
	for _, o := range orders {
		if label := scheduledAs(o); label != "" {
			if other, dup := ticks[label]; dup {
				add(11, "orders %s and %s were both started by %s", other, o.OrderID, label)
			}
			ticks[label] = o.OrderID
		}
		if o.ParentOrder != "" {
			if children[o.ParentOrder] == nil {
				children[o.ParentOrder] = map[int][]*statestore.AuditOrder{}
			}
			children[o.ParentOrder][o.ParentStep] = append(children[o.ParentOrder][o.ParentStep], o)
		}
	}
	for _, o := range orders {
		steps := map[int]statestore.AuditStep{}
		for _, st := range o.Steps {
			steps[st.Step] = st
		}
		for _, t := range o.History {
			if t.Step == nil {
				continue
			}
			st := steps[*t.Step]
			switch {
			case t.From == statestore.StepDelayed && t.To == statestore.StepPending && st.DueAt != nil && t.At.Before(*st.DueAt):
				add(11, "order %s step %d: its timer fired at %s, before it was due at %s", o.OrderID, st.Step, t.At, *st.DueAt)
			case t.From == "awaiting" && st.Wait && (t.To == statestore.StepSkipped || t.To == statestore.StepError) && st.DueAt != nil &&
				t.At.Before(*st.DueAt):
				add(11, "order %s step %d: its wait timed out at %s, before its timeout at %s", o.OrderID, st.Step, t.At, *st.DueAt)
			}
		}
		for _, st := range o.Steps {
			if st.Wait && st.ProcessState == statestore.StepProcessed && st.Signals != 1 {
				add(11, "order %s step %d: a wait processed with %d signals, want its one", o.OrderID, st.Step, st.Signals)
			}
			if !st.Child || st.Kind != statestore.KindAction {
				continue
			}
			kids := children[o.OrderID][st.Step]
			if len(kids) > 1 && !strings.Contains(st.IdempotencyKey, "/rerun-") {
				add(11, "order %s step %d started %d children", o.OrderID, st.Step, len(kids))
			}
			if len(kids) == 0 {
				continue
			}
			last := kids[len(kids)-1]
			switch {
			case o.Status == statestore.OrderCompleted && len(kids) == 1 && last.Status != statestore.OrderCompleted:
				add(11, "order %s completed, its step %d's child %s is %s", o.OrderID, st.Step, last.OrderID, last.Status)
			case st.ProcessState == statestore.StepError && len(kids) == 1 && last.Status == statestore.OrderCompleted:
				add(11, "order %s step %d failed, its child %s completed", o.OrderID, st.Step, last.OrderID)
			}
		}
	}
}
