package workflow

import (
	"reflect"
	"slices"
	"testing"
)

// TestEveryPathIsMadeOfDeclaredMoves: each shape's paths go only by moves
// StepMoves declares, and every move declared is on some shape's path (a
// move no shape makes has no place in the table of moves).
func TestEveryPathIsMadeOfDeclaredMoves(t *testing.T) {
	declared := map[[2]string]bool{}
	for _, m := range StepMoves() {
		k := [2]string{m.From, m.To}
		if declared[k] {
			t.Errorf("move %s to %s declared twice", m.From, m.To)
		}
		declared[k] = true
		if m.By == "" {
			t.Errorf("move %s to %s says nobody makes it", m.From, m.To)
		}
	}
	used := map[[2]string]bool{}
	names := map[string]bool{}
	for _, sh := range Shapes() {
		if names[sh.Name] {
			t.Errorf("shape %q declared twice", sh.Name)
		}
		names[sh.Name] = true
		if len(sh.Paths) == 0 {
			t.Errorf("shape %q has no path", sh.Name)
		}
		for _, p := range sh.Paths {
			moves := PathMoves(p)
			if len(moves) == 0 {
				t.Errorf("shape %q: path %q makes no move", sh.Name, p)
			}
			for _, mv := range moves {
				if !declared[mv] {
					t.Errorf("shape %q: path %q moves %s to %s, which StepMoves does not declare", sh.Name, p, mv[0], mv[1])
				}
				used[mv] = true
			}
		}
	}
	for k := range declared {
		if !used[k] {
			t.Errorf("move %s to %s is on no shape's path", k[0], k[1])
		}
	}
	states := map[string]bool{}
	for _, m := range OrderMoves() {
		if m.From == m.To || m.By == "" {
			t.Errorf("order move %+v", m)
		}
		states[m.From], states[m.To] = true, true
	}
	for _, s := range []string{"received", "processing", "compensating", "completed", "failed", "error"} {
		if !states[s] {
			t.Errorf("no order move reaches or leaves %s", s)
		}
	}
}

// TestEveryShapeIsNamedByItsRow: Row.Shape names a declared shape for each
// way a file says a step, and every field of Step is declared as deciding
// a row's shape or not, so that a field added for a new shape cannot go
// without its entry.
func TestEveryShapeIsNamedByItsRow(t *testing.T) {
	for _, tc := range []struct {
		row  Row
		want string
	}{
		{Row{Step: Step{Name: "charge", Agent: "payments"}}, "action"},
		{Row{Step: Step{Name: "refund", Agent: "payments"}, Compensates: 1}, "compensation"},
		{Row{Step: Step{Name: "cool_off"}}, "timer"},
		{Row{Step: Step{Name: "approve", Wait: &Wait{Signal: "approved"}}}, "wait"},
		{Row{Step: Step{Name: "ship", Workflow: "shipping"}}, "sub-process"},
		{Row{Step: Step{Name: "ship", Workflow: "shipping"}, Compensates: 2}, "sub-process undo"},
		{Row{Step: Step{Name: "notify", Agent: "mail", ForEach: "payload.items"}}, "for_each"},
	} {
		got := tc.row.Shape()
		if got != tc.want {
			t.Errorf("%+v: shape %q, want %q", tc.row.Step, got, tc.want)
		}
		if !slices.ContainsFunc(Shapes(), func(s Shape) bool { return s.Name == got }) {
			t.Errorf("shape %q is not declared", got)
		}
	}
	st := reflect.TypeFor[Step]()
	for i := range st.NumField() {
		name := st.Field(i).Name
		if slices.Contains(shapeFields(), name) == slices.Contains(commonFields(), name) {
			t.Errorf("Step.%s must be declared in exactly one of shapeFields and commonFields (shapes.go)", name)
		}
	}
}
