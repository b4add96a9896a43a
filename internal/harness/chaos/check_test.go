package chaos

import (
	"fmt"
	"slices"
	"strings"
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
		{"compensation of an action that never ran", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			// The charge failed before its request left (its when failed),
			// yet its refund was called.
			a.Orders[1].Steps[1].UnsentAttempts = 1
		}},
		{"action recorded as never sent reached its service", 5, func(h *History, a *statestore.Audit, l *[]remote.Entry) {
			a.Orders[0].Steps[0].UnsentAttempts = 1
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

// TestCheckLearnsTheNOfMJoin: the graph world's join as one of any 1 of
// its two branches may be claimed once one ended, and a completed order
// may hold a branch it spared; each has a negative control.
func TestCheckLearnsTheNOfMJoin(t *testing.T) {
	t.Parallel()
	anyOne := func() (History, statestore.Audit, []remote.Entry) {
		h, a, l := graphWorld()
		a.Orders[0].Steps[2].Any = 1
		return h, a, l
	}
	// b's end (history row 9) after the join's claim (row 11).
	late := func(o *statestore.AuditOrder, row, to int) {
		tr := o.History[row]
		o.History = append(o.History[:row], o.History[row+1:]...)
		o.History = append(o.History[:to], append([]statestore.Transition{tr}, o.History[to:]...)...)
	}
	spare := func(o *statestore.AuditOrder, reason string) {
		o.Steps[1].ProcessState = "cancelled"
		o.History[9].To = "error"
		o.History = append(o.History[:10], append([]statestore.Transition{
			{Step: ip(2), From: "error", To: "cancelled", Attempt: 1, Actor: "scheduler:a", Reason: reason}}, o.History[10:]...)...)
	}
	for _, tc := range []struct {
		desc   string
		breaks string // what the violation of invariant 10 says ("": none)
		change func(a *statestore.Audit)
	}{
		{"claimed once one of two ended", "", func(a *statestore.Audit) { late(&a.Orders[0], 9, 11) }},
		{"claimed before any ended", "a join of any 1, was claimed when 0 of its needs had ended", func(a *statestore.Audit) {
			late(&a.Orders[0], 9, 11)
			late(&a.Orders[0], 5, 10)
		}},
		{"a spared branch in a completed order", "", func(a *statestore.Audit) {
			spare(&a.Orders[0], "failed for good; a join can do without it")
		}},
		{"a branch cancelled for another reason in a completed order", "step 2 (b) is cancelled", func(a *statestore.Audit) {
			spare(&a.Orders[0], "the order is undone")
		}},
		{"a spared branch where no join is of any N", "step 2 (b) is cancelled", func(a *statestore.Audit) {
			spare(&a.Orders[0], "failed for good; a join can do without it")
			a.Orders[0].Steps[2].Any = 0
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			h, a, l := anyOne()
			tc.change(&a)
			r := Check(h, a, l)
			if tc.breaks == "" && !r.OK() {
				t.Fatalf("violations: %v", r.Violations)
			}
			if spared := strings.HasPrefix(tc.desc, "a spared branch in"); tc.breaks == "" && (r.Spared == 1) != spared {
				t.Fatalf("%d orders counted as spared", r.Spared)
			}
			if tc.breaks != "" && !slices.ContainsFunc(r.Violations, func(v Violation) bool {
				return v.Invariant == 10 && strings.Contains(v.Detail, tc.breaks)
			}) {
				t.Fatalf("no violation of invariant 10 saying %q; got %v", tc.breaks, r.Violations)
			}
		})
	}
}

// timeWorld is a correct history of time and the outside world: an order
// whose wait ended with its signal, whose delayed step fired after its
// due time and whose sub-process step ended with its one child; that
// child; and an order a schedule started.
func timeWorld() (History, statestore.Audit, []remote.Entry) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	due := func(d time.Duration) *time.Time { v := at(d); return &v }
	chain := func(step int, states ...string) []statestore.Transition {
		out := []statestore.Transition{{Step: ip(step), To: states[0], Actor: "submitter", At: at(0)}}
		for i := 1; i < len(states); i++ {
			attempt := 1
			if states[i-1] == "delayed" || states[i-1] == "waiting" {
				attempt = 0
			}
			out = append(out, statestore.Transition{Step: ip(step), From: states[i-1], To: states[i], Attempt: attempt, Actor: "scheduler:a",
				At: at(time.Duration(i) * time.Second)})
		}
		return out
	}
	action := func(n int, name string) statestore.AuditStep {
		return statestore.AuditStep{Step: n, Name: name, Kind: statestore.KindAction, ProcessState: "processed", Attempt: 1, MaxFailures: 5,
			IdempotencyKey: fmt.Sprintf("w/%d/%s", n, name)}
	}
	wait := action(2, "approval")
	wait.InSystem, wait.Wait, wait.DueAt, wait.Signals = true, true, due(time.Hour), 1
	cool := action(3, "cool")
	cool.DueAt = due(10 * time.Second)
	kyc := action(4, "kyc")
	kyc.InSystem, kyc.Child = true, true
	undo := statestore.AuditStep{Step: 5, Name: "undo_kyc", Kind: statestore.KindCompensation, Compensates: 4, ProcessState: "waiting",
		MaxFailures: 5, IdempotencyKey: "w/5/undo_kyc", InSystem: true, Child: true}
	coolChain := chain(3, "delayed", "pending", "processing", "processed")
	coolChain[1].At = at(10*time.Second + 200*time.Millisecond)
	var wh []statestore.Transition
	wh = append(wh, statestore.Transition{To: "received", Actor: "submitter", At: at(0)})
	wh = append(wh, chain(1, "pending", "processing", "processed")...)
	wh = append(wh, chain(2, "pending", "processing", "awaiting", "processed")...)
	wh = append(wh, coolChain...)
	wh = append(wh, chain(4, "pending", "processing", "awaiting", "processed")...)
	wh = append(wh, statestore.Transition{From: "processing", To: "completed", Actor: "scheduler:a", At: at(time.Minute)})
	w := statestore.AuditOrder{OrderID: "w", Status: "completed", UpdatedAt: at(time.Minute), History: wh,
		Steps: []statestore.AuditStep{action(1, "score"), wait, cool, kyc, undo}}
	one := func(id, actor string) statestore.AuditOrder {
		st := statestore.AuditStep{Step: 1, Name: "note", Kind: statestore.KindAction, ProcessState: "processed", Attempt: 1, MaxFailures: 5,
			IdempotencyKey: id + "/1/note"}
		h := append([]statestore.Transition{{To: "received", Actor: actor, At: at(0)}}, chain(1, "pending", "processing", "processed")...)
		h = append(h, statestore.Transition{From: "processing", To: "completed", Actor: "scheduler:a", At: at(time.Minute)})
		return statestore.AuditOrder{OrderID: id, Status: "completed", UpdatedAt: at(time.Minute), History: h, Steps: []statestore.AuditStep{st}}
	}
	child := one("c", "scheduler:a")
	child.ParentOrder, child.ParentStep = "w", 4
	scheduled := one("s1", "schedule:nightly (tick 2026-01-01T00:00:00Z)")
	h := History{Confirmed: map[string]bool{"w": true}}
	a := statestore.Audit{Orders: []statestore.AuditOrder{w, child, scheduled}}
	var l []remote.Entry
	for _, k := range []struct{ key, order string }{{"w/1/score", "w"}, {"w/3/cool", "w"}, {"c/1/note", "c"}, {"s1/1/note", "s1"}} {
		l = append(l, remote.Entry{Key: k.key, OrderID: k.order, Effects: 1, Calls: 1, At: at(-time.Second)})
	}
	return h, a, l
}

// TestCheckLearnsTime: a correct history of waits, timers, children and
// schedules passes (a child and a scheduled order are not phantoms, and
// steps sas performs call no service); each part of invariant 11 has a
// negative control that makes it fail.
func TestCheckLearnsTime(t *testing.T) {
	t.Parallel()
	h, a, l := timeWorld()
	if r := Check(h, a, l); !r.OK() {
		t.Fatalf("violations in a correct history: %v", r.Violations)
	}
	order := func(a *statestore.Audit, id string) *statestore.AuditOrder {
		for i := range a.Orders {
			if a.Orders[i].OrderID == id {
				return &a.Orders[i]
			}
		}
		panic(id)
	}
	for _, tc := range []struct {
		desc    string
		breakIt func(a *statestore.Audit)
	}{
		{"a timer fired early", func(a *statestore.Audit) {
			w := order(a, "w")
			for i, tr := range w.History {
				if tr.From == "delayed" {
					w.History[i].At = t0.Add(9 * time.Second)
				}
			}
		}},
		{"a wait ended without its signal", func(a *statestore.Audit) { order(a, "w").Steps[1].Signals = 0 }},
		{"a wait timed out before its timeout", func(a *statestore.Audit) {
			w := order(a, "w")
			w.Steps[1].ProcessState = "skipped"
			for i, tr := range w.History {
				if tr.Step != nil && *tr.Step == 2 && tr.From == "awaiting" {
					w.History[i].To = "skipped"
				}
			}
		}},
		{"two children of one step", func(a *statestore.Audit) {
			c2 := *order(a, "c")
			c2.OrderID = "c2"
			a.Orders = append(a.Orders, c2)
		}},
		{"a completed parent with a failed child", func(a *statestore.Audit) { order(a, "c").Status = "failed" }},
		{"two orders for one tick", func(a *statestore.Audit) {
			s2 := *order(a, "s1")
			s2.OrderID = "s2"
			a.Orders = append(a.Orders, s2)
		}},
		{"an order nobody submitted nor started", func(a *statestore.Audit) {
			s := order(a, "s1")
			s.History = append([]statestore.Transition(nil), s.History...)
			s.History[0].Actor = "someone"
		}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			t.Parallel()
			h, a, l := timeWorld()
			tc.breakIt(&a)
			r := Check(h, a, l)
			for _, v := range r.Violations {
				if v.Invariant == 11 || (tc.desc == "an order nobody submitted nor started" && v.Invariant == 7) {
					return
				}
			}
			t.Fatalf("no violation of invariant 11; got %v", r.Violations)
		})
	}
}

// TestCheckLetsAParentUndoItsCompletedChild: invariant 2 lets a
// sub-process's order leave completed only for its parent's undoing
// (its own reason names that parent); any other move out of a terminal
// state, or one of an order with no parent, is a violation.
func TestCheckLetsAParentUndoItsCompletedChild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		parent, reason string
		flagged        bool
	}{
		{"p", "its parent order p is undone", false},
		{"", "its parent order p is undone", true},
		{"p", "its parent order q is undone", true},
		{"p", "a late reply", true},
	} {
		o := &statestore.AuditOrder{OrderID: "k", Status: statestore.OrderFailed, ParentOrder: tc.parent, History: []statestore.Transition{
			{To: "received", Actor: "scheduler:a"},
			{From: "received", To: "processing", Actor: "scheduler:a"},
			{From: "processing", To: "completed", Actor: "scheduler:a"},
			{From: "completed", To: "compensating", Actor: "scheduler:a", Reason: tc.reason},
			{From: "compensating", To: "failed", Actor: "scheduler:a"},
		}}
		var got []string
		checkOrder(o, false, map[string]remote.Entry{}, map[string]int{}, func(inv int, format string, args ...any) {
			if inv == 2 {
				got = append(got, fmt.Sprintf(format, args...))
			}
		})
		if flagged := slices.ContainsFunc(got, func(v string) bool { return strings.Contains(v, "left a terminal state") }); flagged != tc.flagged {
			t.Errorf("parent %q, reason %q: flagged %v, want %v (%v)", tc.parent, tc.reason, flagged, tc.flagged, got)
		}
	}
}
