package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// fakeGraphStore records what prepare asked of the store, and answers
// err to every call.
type fakeGraphStore struct {
	calls []string
	items []json.RawMessage
	child statestore.NewOrder
	err   error
}

func (f *fakeGraphStore) record(call string) (statestore.GraphResult, error) {
	f.calls = append(f.calls, call)
	return statestore.GraphResult{}, f.err
}

func (f *fakeGraphStore) SkipStep(_ context.Context, _ statestore.ClaimedStep, _, reason string) (statestore.GraphResult, error) {
	return f.record("skip: " + reason)
}

func (f *fakeGraphStore) ExpandStep(_ context.Context, _ statestore.ClaimedStep, items []json.RawMessage, _ string) (statestore.GraphResult, error) {
	f.items = items
	return f.record(fmt.Sprintf("expand: %d", len(items)))
}

func (f *fakeGraphStore) AwaitStep(context.Context, statestore.ClaimedStep, string) (statestore.GraphResult, error) {
	return f.record("await")
}

func (f *fakeGraphStore) StartChild(_ context.Context, _ statestore.ClaimedStep, child statestore.NewOrder, v statestore.WorkflowVersion, _ string) (statestore.GraphResult, error) {
	f.child = child
	return f.record("start child: " + v.Name)
}

func (f *fakeGraphStore) UndoChild(context.Context, statestore.ClaimedStep, string) (statestore.GraphResult, error) {
	return f.record("undo child")
}

func (f *fakeGraphStore) FailUnsent(_ context.Context, _ statestore.ClaimedStep, _, reason string) (statestore.GraphResult, error) {
	return f.record("fail: " + reason)
}

func (f *fakeGraphStore) ApplyReply(_ context.Context, r statestore.Reply) (statestore.ApplyResult, error) {
	f.calls = append(f.calls, fmt.Sprintf("reply ok=%v", r.OK))
	return statestore.ApplyResult{}, f.err
}

const graphTestFile = `
workflows:
  - name: shipping
    steps:
      - {action: pack, agent: warehouse}
  - name: strict
    payload_schema: {type: object, required: [parcel]}
    steps:
      - {action: pack, agent: warehouse}
`

func specOf(t *testing.T, sp workflow.StepSpec) []byte {
	t.Helper()
	b, err := json.Marshal(sp)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prepare plans a claimed step and runs its answer at once, as dispatch
// does for a batch of one: its outcome and its request's input.
func (g *graphSteps) prepare(ctx context.Context, s *statestore.ClaimedStep) (outcome, []byte, error) {
	input, ans := g.plan(ctx, s)
	if ans == nil {
		return send, input, nil
	}
	return ans()
}

// TestPrepareAnswersForWhatAStepSays: what prepare (plan, then its answer)
// does with each shape of
// claimed step, and with the store's answers: a list's step is sent as it
// is; a when false skips, true sends; a for_each expands (or fails past
// max_items); an input builds the request (an instance's from its item);
// a wait awaits, a timer alone ends; a sub-process starts its child (or
// fails with the child workflow's reason), its compensation undoes it;
// an expression that fails, or a spec that cannot be read, fails the step
// for good, with the reason.
func TestPrepareAnswersForWhatAStepSays(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("graph_test.yaml", []byte(graphTestFile))
	if err != nil {
		t.Fatal(err)
	}
	one := 1
	payload := []byte(`{"amount": 200, "parcels": [{"sku": "A"}, {"sku": "B"}], "big": [1, 2, 3]}`)
	for _, tc := range []struct {
		name      string
		step      statestore.ClaimedStep
		spec      *workflow.StepSpec
		rawSpec   []byte
		want      outcome
		wantCalls string
		wantInput string
	}{
		{name: "a list's step", step: statestore.ClaimedStep{Agent: "risk"}, want: send},
		{name: "when false", step: statestore.ClaimedStep{Agent: "risk"}, spec: &workflow.StepSpec{When: "payload.amount > 1000"},
			want: answered, wantCalls: `skip: when "payload.amount > 1000" is false`},
		{name: "when true", step: statestore.ClaimedStep{Agent: "risk"}, spec: &workflow.StepSpec{When: "payload.amount > 100"}, want: send},
		{name: "when on a missing key", step: statestore.ClaimedStep{Agent: "risk"}, spec: &workflow.StepSpec{When: "payload.nothing > 1"},
			want: answered, wantCalls: `fail: when "payload.nothing > 1": no such key: nothing`},
		{name: "for_each", step: statestore.ClaimedStep{Agent: "mail"}, spec: &workflow.StepSpec{ForEach: "payload.parcels", MaxItems: 5},
			want: answered, wantCalls: "expand: 2"},
		{name: "for_each past max_items", step: statestore.ClaimedStep{Agent: "mail"}, spec: &workflow.StepSpec{ForEach: "payload.big", MaxItems: 2},
			want: answered, wantCalls: "fail: for_each \"payload.big\" has 3 items, more than its max_items 2"},
		{name: "input", step: statestore.ClaimedStep{Agent: "risk"}, spec: &workflow.StepSpec{Input: "{'n': payload.amount}"},
			want: send, wantInput: `{"n":200}`},
		{name: "an instance's input", step: statestore.ClaimedStep{Agent: "mail", Item: []byte(`{"sku": "B"}`), Index: &one},
			spec: &workflow.StepSpec{Input: "{'sku': item.sku, 'i': index}"}, want: send, wantInput: `{"i":1,"sku":"B"}`},
		{name: "input that fails", step: statestore.ClaimedStep{Agent: "risk"}, spec: &workflow.StepSpec{Input: "payload.nothing"},
			want: answered, wantCalls: `fail: input "payload.nothing": no such key: nothing`},
		{name: "a wait", step: statestore.ClaimedStep{}, spec: &workflow.StepSpec{Wait: &workflow.SpecWait{Signal: "ok", TimeoutMS: 1000}, When: "true"},
			want: answered, wantCalls: "await"},
		{name: "a timer alone", step: statestore.ClaimedStep{}, spec: &workflow.StepSpec{DelayMS: 1000, When: "true"},
			want: answered, wantCalls: "reply ok=true"},
		{name: "a sub-process", step: statestore.ClaimedStep{IdempotencyKey: "o/3"}, spec: &workflow.StepSpec{Workflow: "shipping"},
			want: answered, wantCalls: "start child: shipping"},
		{name: "a sub-process of no workflow", step: statestore.ClaimedStep{}, spec: &workflow.StepSpec{Workflow: "nowhere"},
			want: answered, wantCalls: `fail: workflow "nowhere" of the sub-process is not in the workflows file`},
		{name: "a child's payload refused", step: statestore.ClaimedStep{}, spec: &workflow.StepSpec{Workflow: "strict"},
			want: answered, wantCalls: "fail: workflow strict refuses the child's payload"},
		{name: "a child's input not an object", step: statestore.ClaimedStep{}, spec: &workflow.StepSpec{Workflow: "shipping", Input: "payload.amount"},
			want: answered, wantCalls: "fail: the input \"payload.amount\" of a sub-process is its child's payload: it must be a JSON object"},
		{name: "a sub-process undone", step: statestore.ClaimedStep{Kind: statestore.KindCompensation}, spec: &workflow.StepSpec{Workflow: "shipping"},
			want: answered, wantCalls: "undo child"},
		{name: "a spec that cannot be read", step: statestore.ClaimedStep{Agent: "risk"}, rawSpec: []byte(`{"when": 7}`),
			want: answered, wantCalls: "fail: the step's spec cannot be read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &fakeGraphStore{}
			g := &graphSteps{store: st, exprs: workflow.NewExprs(100), me: "scheduler:test", workflows: reg}
			s := tc.step
			s.Payload = payload
			s.Spec = tc.rawSpec
			if tc.spec != nil {
				s.Spec = specOf(t, *tc.spec)
			}
			// plan decides without a word to the store: the claimer
			// answers for a batch's steps after its requests have left.
			if _, ans := g.plan(context.Background(), &s); len(st.calls) != 0 || (ans == nil) != (tc.want == send) {
				t.Fatalf("plan asked the store %q, answer given %v, for a step whose outcome is %v", st.calls, ans != nil, tc.want)
			}
			got, input, err := g.prepare(context.Background(), &s)
			if err != nil || got != tc.want {
				t.Fatalf("outcome %v (%v), want %v", got, err, tc.want)
			}
			calls := strings.Join(st.calls, "; ")
			if tc.wantCalls == "" && calls != "" || !strings.HasPrefix(calls, tc.wantCalls) {
				t.Fatalf("store calls %q, want %q", calls, tc.wantCalls)
			}
			var compact bytes.Buffer
			if len(input) > 0 {
				if err := json.Compact(&compact, input); err != nil {
					t.Fatalf("input %s is not JSON: %v", input, err)
				}
			}
			if compact.String() != tc.wantInput {
				t.Fatalf("input %s, want %s", input, tc.wantInput)
			}
		})
	}
}

// TestPrepareStartsAChildOnceByItsStepsKey: a sub-process's child order
// is named by its step's idempotency key (a claim run again starts the
// same child, which the store writes once), carries the order's priority
// and trace, and its workflow's version.
func TestPrepareStartsAChildOnceByItsStepsKey(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("graph_test.yaml", []byte(graphTestFile))
	if err != nil {
		t.Fatal(err)
	}
	st := &fakeGraphStore{}
	g := &graphSteps{store: st, exprs: workflow.NewExprs(100), me: "scheduler:test", workflows: reg}
	s := statestore.ClaimedStep{IdempotencyKey: "order-1/2", Priority: 7, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Payload: []byte(`{"parcel": "x"}`), Spec: specOf(t, workflow.StepSpec{Workflow: "shipping"})}
	if got, _, err := g.prepare(context.Background(), &s); got != answered || err != nil {
		t.Fatalf("%v %v", got, err)
	}
	first := st.child
	if first.OrderID != messages.DerivedID("child:order-1/2") || first.Workflow != "shipping" || first.Priority != 7 ||
		first.Traceparent != s.Traceparent || string(first.Payload) != `{"parcel": "x"}` || len(first.Steps) != 1 {
		t.Fatalf("child %+v", first)
	}
	if _, _, err := g.prepare(context.Background(), &s); err != nil || st.child.OrderID != first.OrderID {
		t.Fatalf("the claim run again named another child: %s, %s (%v)", st.child.OrderID, first.OrderID, err)
	}
}

// TestPrepareSaysWhenTheStoreCouldNotBeTold: a stale answer (the attempt
// ended meanwhile) is answered; any other error leaves the step unsure,
// for its claim to run out and the supervisor to retry it; a child too
// deep fails the step for good.
func TestPrepareSaysWhenTheStoreCouldNotBeTold(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("graph_test.yaml", []byte(graphTestFile))
	if err != nil {
		t.Fatal(err)
	}
	when := specOf(t, workflow.StepSpec{When: "false"})
	for _, tc := range []struct {
		err  error
		want outcome
	}{
		{&statestore.StaleReplyError{Reason: "the step is no longer processing"}, answered},
		{errors.New("connection reset"), unsure},
	} {
		st := &fakeGraphStore{err: tc.err}
		g := &graphSteps{store: st, exprs: workflow.NewExprs(100), me: "scheduler:test", workflows: reg}
		s := statestore.ClaimedStep{Agent: "risk", Spec: when, Payload: []byte(`{}`)}
		got, _, gotErr := g.prepare(context.Background(), &s)
		if got != tc.want || (tc.want == unsure) != (gotErr != nil) {
			t.Fatalf("store error %v: outcome %v (%v), want %v", tc.err, got, gotErr, tc.want)
		}
	}
	st := &fakeGraphStore{}
	deep := &tooDeepStore{fakeGraphStore: st}
	g := &graphSteps{store: deep, exprs: workflow.NewExprs(100), me: "scheduler:test", workflows: reg}
	s := statestore.ClaimedStep{Payload: []byte(`{}`), Spec: specOf(t, workflow.StepSpec{Workflow: "shipping"})}
	if got, _, err := g.prepare(context.Background(), &s); got != answered || err != nil {
		t.Fatalf("%v %v", got, err)
	}
	if calls := strings.Join(st.calls, "; "); !strings.Contains(calls, "fail: its child (workflow shipping) would be more than") {
		t.Fatalf("a child too deep: store calls %q", calls)
	}
}

// tooDeepStore refuses every child as too deep.
type tooDeepStore struct{ *fakeGraphStore }

func (d *tooDeepStore) StartChild(context.Context, statestore.ClaimedStep, statestore.NewOrder, statestore.WorkflowVersion, string) (statestore.GraphResult, error) {
	return statestore.GraphResult{}, statestore.ErrTooDeep
}
