package chaos

import (
	"fmt"
	"testing"
	"time"

	"sas/internal/remote"
	"sas/internal/statestore"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func ip(i int) *int { return &i }

// world is a small, correct history: order "c" completed its three
// actions; order "f" failed at the payment and had its reservation undone.
func world() (History, statestore.Audit, []remote.Entry) {
	key := func(o string, s int) string { return fmt.Sprintf("%s/%d", o, s) }
	steps := func(o string, states ...string) []statestore.AuditStep {
		names := []string{"reserve", "charge", "ship", "cancel_ship", "refund", "release"}
		var out []statestore.AuditStep
		for i, s := range states {
			st := statestore.AuditStep{Step: i + 1, Name: names[i], Kind: statestore.KindAction, ProcessState: s,
				MaxFailures: 5, IdempotencyKey: key(o, i+1)}
			if i >= 3 {
				st.Kind, st.Compensates = statestore.KindCompensation, 6-i
			}
			if s != statestore.StepWaiting && s != statestore.StepCancelled {
				st.Attempt = 1
			}
			out = append(out, st)
		}
		return out
	}
	created := func(o string, states ...string) []statestore.Transition {
		var out []statestore.Transition
		for i, s := range states {
			out = append(out, statestore.Transition{Step: ip(i + 1), To: s, Actor: "submitter"})
		}
		return out
	}
	claimAnd := func(step int, to string) []statestore.Transition {
		return []statestore.Transition{
			{Step: ip(step), From: "pending", To: "processing", Attempt: 1, Actor: "scheduler:a"},
			{Step: ip(step), From: "processing", To: to, Attempt: 1, Actor: "scheduler:a"},
		}
	}
	next := func(step int) statestore.Transition {
		return statestore.Transition{Step: ip(step), From: "waiting", To: "pending", Actor: "scheduler:a"}
	}
	cancel := func(step int) statestore.Transition {
		return statestore.Transition{Step: ip(step), From: "waiting", To: "cancelled", Actor: "scheduler:a"}
	}
	var ch []statestore.Transition
	ch = append(ch, statestore.Transition{To: "received", Actor: "submitter"})
	// Steps created waiting have no creation row (the store writes none).
	ch = append(ch, created("c", "pending")...)
	for s := 1; s <= 3; s++ {
		if s > 1 {
			ch = append(ch, next(s))
		}
		ch = append(ch, claimAnd(s, "processed")...)
	}
	ch = append(ch, statestore.Transition{From: "processing", To: "completed", Actor: "scheduler:a"})
	var fh []statestore.Transition
	fh = append(fh, statestore.Transition{To: "received", Actor: "submitter"})
	fh = append(fh, created("f", "pending")...)
	fh = append(fh, claimAnd(1, "processed")...)
	fh = append(fh, next(2))
	fh = append(fh, claimAnd(2, "error")...)
	fh = append(fh, cancel(3), cancel(4), next(5))
	fh = append(fh, statestore.Transition{From: "processing", To: "compensating", Actor: "scheduler:a"})
	fh = append(fh, claimAnd(5, "processed")...)
	fh = append(fh, next(6))
	fh = append(fh, claimAnd(6, "processed")...)
	fh = append(fh, statestore.Transition{From: "compensating", To: "failed", Actor: "scheduler:a"})

	h := History{Confirmed: map[string]bool{"c": true, "f": true},
		Malformed: map[string]string{"bad-1": "not_json"}, DeadLettered: map[string]string{"bad-1": "not_json"}}
	a := statestore.Audit{Orders: []statestore.AuditOrder{
		{OrderID: "c", Status: "completed", UpdatedAt: t0, Steps: steps("c", "processed", "processed", "processed", "waiting", "waiting", "waiting"), History: ch},
		{OrderID: "f", Status: "failed", UpdatedAt: t0, Steps: steps("f", "processed", "error", "cancelled", "cancelled", "processed", "processed"), History: fh},
	}}
	l := []remote.Entry{
		{Key: key("c", 1), OrderID: "c", Effects: 1, Calls: 1, At: t0.Add(-time.Second)},
		{Key: key("c", 2), OrderID: "c", Effects: 1, Calls: 2, At: t0.Add(-time.Second)},
		{Key: key("c", 3), OrderID: "c", Effects: 1, Calls: 1, At: t0.Add(-time.Second)},
		{Key: key("f", 1), OrderID: "f", Effects: 1, Calls: 1, At: t0.Add(-time.Second)},
		{Key: key("f", 5), OrderID: "f", Calls: 1, Undoes: key("f", 2)},
		{Key: key("f", 2), OrderID: "f", Voided: true},
		{Key: key("f", 6), OrderID: "f", Effects: 1, Calls: 1, Undoes: key("f", 1), At: t0.Add(-time.Second)},
	}
	return h, a, l
}

func TestCheckPassesACorrectHistory(t *testing.T) {
	t.Parallel()
	h, a, l := world()
	r := Check(h, a, l)
	if !r.OK() {
		t.Fatalf("violations in a correct history: %v", r.Violations)
	}
	if r.Completed != 1 || r.Failed != 1 || r.Keys != 4 || r.UndoEffects != 1 || r.Requests != 5 {
		t.Fatalf("result %+v", r)
	}
	if rate := r.DuplicateAttemptRate(); rate != 0.25 {
		t.Fatalf("duplicate attempt rate %v", rate)
	}
}

func TestCheckCatchesEachViolation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		desc      string
		invariant int
		breakIt   func(h *History, a *statestore.Audit, l *[]remote.Entry)
	}{
		{"lost order", 1, func(h *History, a *statestore.Audit, l *[]remote.Entry) { h.Confirmed["gone"] = true }},
		{"phantom order", 7, func(h *History, a *statestore.Audit, l *[]remote.Entry) { delete(h.Confirmed, "c") }},
		{"effect twice", 3, func(h *History, a *statestore.Audit, l *[]remote.Entry) { (*l)[0].Effects = 2 }},
		{"held without alert", 2, func(h *History, a *statestore.Audit, l *[]remote.Entry) { a.Orders[1].Status = "error" }},
		{"not terminal", 2, func(h *History, a *statestore.Audit, l *[]remote.Entry) { a.Orders[0].Status = "processing" }},
		{"stale reply applied", 4, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			// A second claim, then the first attempt's reply wins.
			o.History = append(o.History[:3], append([]statestore.Transition{
				{Step: ip(1), From: "processing", To: "pending", Attempt: 1, Actor: "supervisor:s"},
				{Step: ip(1), From: "pending", To: "processing", Attempt: 2, Actor: "scheduler:b"},
				{Step: ip(1), From: "processing", To: "processed", Attempt: 1, Actor: "scheduler:a"},
			}, o.History[4:]...)...)
			o.Steps[0].Attempt = 2
		}},
		{"late reply on a step no longer processing", 4, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			// Reset by the supervisor, then the old reply lands anyway.
			o.History = append(o.History[:3], append([]statestore.Transition{
				{Step: ip(1), From: "processing", To: "pending", Attempt: 1, Actor: "supervisor:s"},
				{Step: ip(1), From: "processing", To: "processed", Attempt: 1, Actor: "scheduler:a"},
			}, o.History[4:]...)...)
		}},
		{"failed order not undone", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) { (*l)[6].Effects = 0 }},
		{"completed order undone", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			*l = append(*l, remote.Entry{Key: "x", OrderID: "c", Effects: 1, Undoes: "c/1"})
		}},
		{"completed order missing an effect", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) { (*l)[2].Effects = 0 }},
		{"too many failures", 6, func(h *History, a *statestore.Audit, l *[]remote.Entry) { a.Orders[0].Steps[0].FailureCount = 6 }},
		{"forward call after the end", 7, func(h *History, a *statestore.Audit, l *[]remote.Entry) { (*l)[1].At = t0.Add(time.Minute) }},
		{"effect for an unknown order", 7, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			*l = append(*l, remote.Entry{Key: "z", OrderID: "z", Effects: 1})
		}},
		{"poison not dead-lettered", 8, func(h *History, a *statestore.Audit, l *[]remote.Entry) { delete(h.DeadLettered, "bad-1") }},
		{"poison with the wrong reason", 8, func(h *History, a *statestore.Audit, l *[]remote.Entry) { h.DeadLettered["bad-1"] = "too_large" }},
		{"unpublished outbox", 9, func(h *History, a *statestore.Audit, l *[]remote.Entry) { a.Unpublished = 3 }},
		{"step history with a gap", 4, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			// Step 1's creation row lost: its history starts in pending.
			o.History = append(o.History[:1], o.History[2:]...)
		}},
		{"step claimed while still waiting", 4, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			// Step 2's waiting -> pending row lost.
			for i, t := range o.History {
				if t.Step != nil && *t.Step == 2 && t.From == "waiting" {
					o.History = append(o.History[:i], o.History[i+1:]...)
					break
				}
			}
		}},
		{"terminal order moved again", 2, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			a.Orders[0].History = append(a.Orders[0].History, statestore.Transition{From: "completed", To: "processing", Actor: "scheduler:a"})
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			h, a, l := world()
			tc.breakIt(&h, &a, &l)
			r := Check(h, a, l)
			found := false
			for _, v := range r.Violations {
				if v.Invariant == tc.invariant {
					found = true
				}
			}
			if !found {
				t.Fatalf("no violation of invariant %d; got %v", tc.invariant, r.Violations)
			}
		})
	}
}

// graphWorld is a correct history of a graph order "g": a and b at once,
// the join j after both, a skipped step s after a, a for_each step e
// after j with one instance (step 7).
func graphWorld() (History, statestore.Audit, []remote.Entry) {
	st := func(n int, name, state string, needs ...int) statestore.AuditStep {
		s := statestore.AuditStep{Step: n, Name: name, Kind: statestore.KindAction, ProcessState: state, Attempt: 1,
			MaxFailures: 5, IdempotencyKey: fmt.Sprintf("g/%d", n), Needs: append([]int{}, needs...)}
		return s
	}
	steps := []statestore.AuditStep{
		st(1, "a", "processed"), st(2, "b", "processed"), st(3, "j", "processed", 1, 2),
		st(4, "s", "skipped", 1), st(5, "e", "processed", 3),
		{Step: 6, Name: "undo_a", Kind: statestore.KindCompensation, Compensates: 1, ProcessState: "waiting", MaxFailures: 5,
			IdempotencyKey: "g/6", Needs: []int{}},
		{Step: 7, Name: "e", Kind: statestore.KindAction, ProcessState: "processed", Attempt: 1, MaxFailures: 5,
			IdempotencyKey: "g/5/0", Needs: []int{}, Parent: 5},
	}
	steps[4].ForEach = true
	tr := func(step int, from, to string, attempt int) statestore.Transition {
		return statestore.Transition{Step: ip(step), From: from, To: to, Attempt: attempt, Actor: "scheduler:a"}
	}
	gh := []statestore.Transition{
		{To: "received", Actor: "submitter"},
		{Step: ip(1), To: "pending", Actor: "submitter"}, {Step: ip(2), To: "pending", Actor: "submitter"},
		tr(1, "pending", "processing", 1), tr(2, "pending", "processing", 1),
		tr(1, "processing", "processed", 1), tr(4, "waiting", "pending", 0), tr(4, "pending", "processing", 1), tr(4, "processing", "skipped", 1),
		tr(2, "processing", "processed", 1), tr(3, "waiting", "pending", 0),
		tr(3, "pending", "processing", 1), tr(3, "processing", "processed", 1),
		tr(5, "waiting", "pending", 0), tr(5, "pending", "processing", 1), tr(5, "processing", "expanded", 1),
		tr(7, "waiting", "pending", 0), tr(7, "pending", "processing", 1), tr(7, "processing", "processed", 1),
		tr(5, "expanded", "processed", 1),
		{From: "processing", To: "completed", Actor: "scheduler:a"},
	}
	h := History{Confirmed: map[string]bool{"g": true}}
	a := statestore.Audit{Orders: []statestore.AuditOrder{{OrderID: "g", Status: "completed", UpdatedAt: t0, Steps: steps, History: gh}}}
	var l []remote.Entry
	for _, k := range []string{"g/1", "g/2", "g/3", "g/5/0"} {
		l = append(l, remote.Entry{Key: k, OrderID: "g", Effects: 1, Calls: 1, At: t0.Add(-time.Second)})
	}
	return h, a, l
}

// TestCheckLearnsTheGraph: a correct graph history passes (a skipped
// step and a for_each step itself call no service); each graph invariant
// has a negative control that makes it fail.
func TestCheckLearnsTheGraph(t *testing.T) {
	t.Parallel()
	h, a, l := graphWorld()
	if r := Check(h, a, l); !r.OK() {
		t.Fatalf("violations in a correct graph history: %v", r.Violations)
	}
	move := func(o *statestore.AuditOrder, from, to int) {
		tr := o.History[from]
		o.History = append(o.History[:from], o.History[from+1:]...)
		o.History = append(o.History[:to], append([]statestore.Transition{tr}, o.History[to:]...)...)
	}
	for _, tc := range []struct {
		desc      string
		invariant int
		breakIt   func(h *History, a *statestore.Audit, l *[]remote.Entry)
	}{
		{"join claimed before a branch ended", 10, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			// b's processed row after the join's claim.
			move(&a.Orders[0], 9, 11)
		}},
		{"join made pending twice", 10, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			o.History = append(o.History[:11], append([]statestore.Transition{
				{Step: ip(3), From: "pending", To: "waiting", Actor: "scheduler:b"},
				{Step: ip(3), From: "waiting", To: "pending", Actor: "scheduler:b"}}, o.History[11:]...)...)
		}},
		{"instance claimed before its step expanded", 10, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			move(&a.Orders[0], 15, 18)
		}},
		{"join lost in a completed order", 10, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			o := &a.Orders[0]
			o.Steps[2].ProcessState = "waiting"
			o.History = o.History[:10]
			o.History = append(o.History, statestore.Transition{From: "processing", To: "completed", Actor: "scheduler:a"})
			*l = (*l)[:2]
			o.Steps[4].ProcessState, o.Steps[6].ProcessState = "waiting", "waiting"
		}},
		{"a failed graph order leaves a branch applied", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			a.Orders[0].Status = "failed"
		}},
		{"an instance applied twice", 3, func(h *History, a *statestore.Audit, l *[]remote.Entry) { (*l)[3].Effects = 2 }},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			h, a, l := graphWorld()
			tc.breakIt(&h, &a, &l)
			r := Check(h, a, l)
			for _, v := range r.Violations {
				if v.Invariant == tc.invariant {
					return
				}
			}
			t.Fatalf("no violation of invariant %d; got %v", tc.invariant, r.Violations)
		})
	}
}
