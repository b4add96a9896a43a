package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"sas/internal/harness/testenv"
	"sas/internal/proctest"
	"sas/internal/statestore"
)

// tripFile is a process with what the cases' virtual clock stands in for:
// branches at once, a when, a timer (a second, real or virtual), a step
// per item, compensations in order, a refusal. (Its compensable steps
// follow one another: the undoing of branches that ran at once may end
// in either order on a real stack.)
const tripFile = `
workflows:
  - name: trip
    policy: compensate
    steps:
      - {action: book_flight, agent: inventory, compensation: {action: cancel_flight}}
      - {action: book_hotel, agent: inventory, needs: [book_flight], compensation: {action: cancel_hotel}}
      - {action: insure, agent: payment, needs: [book_flight], when: payload.insure}
      - {action: settle, delay: 1s, needs: [book_hotel, insure]}
      - {action: tell_guest, agent: shipping, for_each: payload.guests, needs: [settle], compensation: {action: untell_guest}}
      - {action: charge, agent: payment, needs: [tell_guest], compensation: {action: refund}}
      - {action: confirm, agent: shipping, needs: [charge]}
`

const tripCases = `
cases:
  - name: a trip booked
    workflow: trip
    payload: {insure: true, guests: [ann, bob, cy]}
    services:
      book_flight: {result: {action: book_flight}}
      charge: {result: {action: charge}}
  - name: a trip whose charge is refused
    workflow: trip
    payload: {insure: false, guests: [ann, bob], refuse_charge: true}
    services:
      charge: {refuse: card declined}
`

// TestACaseEndsAsTheSameOrderOnARealStack: each case of a process, run
// with its scripted services and virtual time, and the same order run on
// the whole system in real time (the demo remote service answering, a
// refusal where the case refuses) end the same: every step, the steps
// undone in the same order, the same status and reason, and the results
// the case scripts found in the real run's. So the virtual clock and the
// scripted agent cannot drift from the real ones unseen.
func TestACaseEndsAsTheSameOrderOnARealStack(t *testing.T) {
	t.Parallel()
	g := runFile(t, "trip.yaml", tripFile, pipelineOpts{schedulers: 1, agents: 1, supervisors: 1,
		faults: `{"charge": {"refuse_if": "refuse_charge"}}`})
	suite, err := proctest.Parse("trip.cases.yaml", []byte(tripCases), g.file)
	if err != nil {
		t.Fatal(err)
	}
	if err := suite.Check(g.reg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := proctest.Open(ctx, statestore.Options{URL: testenv.DatabaseURL()}, g.reg)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	store := statestore.New(g.pipeline.pool)
	for _, c := range suite.Cases {
		virtual := env.Run(ctx, c)
		if virtual.Err != nil {
			t.Fatalf("case %q: %v", c.Name, virtual.Err)
		}
		ids := g.submit(t, c.Workflow, []string{string(c.Payload)})
		g.pipeline.waitTerminal(t, ids, 2*time.Minute)
		real, err := proctest.Read(ctx, store, g.reg, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if v, r := virtual.Shape(), real.Shape(); !slices.Equal(v, r) {
			t.Errorf("case %q and the real order end differently:\n case:\n  %s\n real:\n  %s",
				c.Name, strings.Join(v, "\n  "), strings.Join(r, "\n  "))
		}
		if virtual.Took < time.Second || real.Took < time.Second {
			t.Errorf("case %q: the 1 s timer: the case took %s, the real order %s", c.Name, virtual.Took, real.Took)
		}
		// What the case's services answered is what the real one did, in
		// part: the results flowed the same way.
		if !strings.Contains(string(real.Results), `"book_flight": {"action": "book_flight"`) &&
			!strings.Contains(string(real.Results), `"book_flight":{"action":"book_flight"`) {
			t.Errorf("case %q: the real order's results %s", c.Name, real.Results)
		}
		t.Logf("case %q: %s in %s virtual, %s real", c.Name, strings.Join(virtual.Shape()[len(virtual.Shape())-2:], "; "), virtual.Took, real.Took)
	}
}
