package console

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"sas/internal/harness/badinput"
	"sas/internal/messages"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

func TestUsersFile(t *testing.T) {
	t.Parallel()
	hash, err := HashPassword("s3cret: any / char #", bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	data, replaced := AddUser(nil, "alice", Operator, hash, nil)
	if replaced {
		t.Fatal("a new user was said to replace one")
	}
	data, _ = AddUser(append([]byte("# console users\n"), data...), "bob", Viewer, hash, nil)
	data, replaced = AddUser(data, "alice", Viewer, hash, nil)
	if !replaced || strings.Count(string(data), "alice:") != 1 || !strings.HasPrefix(string(data), "# console users\n") {
		t.Fatalf("replacing alice:\n%s", data)
	}
	users, err := ParseUsers("users", data)
	if err != nil {
		t.Fatal(err)
	}
	if users["alice"].Role != Viewer || users["bob"].Role != Viewer || len(users) != 2 {
		t.Fatalf("users %v", users)
	}
	// The same entries from the environment, separated by ';'.
	env := strings.ReplaceAll(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[1]), "\n", ";")
	if u, err := ParseUsers("SAS_CONSOLE_USERS", []byte(env)); err != nil || len(u) != 2 {
		t.Fatalf("from the environment: %v %v", u, err)
	}
	for _, bad := range []string{
		"alice:operator",                                    // no hash
		"alice:admin:" + hash,                               // no such role
		"al ice:operator:" + hash,                           // a name with a space
		"alice:operator:plaintext",                          // not a hash
		"alice:operator:" + hash + "\nalice:viewer:" + hash, // twice
		"alice:operator:" + hash + ":",                      // no namespace after the colon
		"alice:operator:" + hash + ":Team_A",                // not a namespace's name
		"alice:operator:" + hash + ":team-a,",               // an empty one
		"alice:operator:" + hash + ":team-a:x",              // a colon in one
	} {
		if _, err := ParseUsers("users", []byte(bad)); err == nil {
			t.Errorf("users file %q accepted", bad)
		}
	}
	if _, err := HashPassword("", bcrypt.MinCost); err == nil {
		t.Error("an empty password is hashed")
	}
	if _, err := HashPassword(strings.Repeat("x", 73), bcrypt.MinCost); err == nil {
		t.Error("a password longer than bcrypt reads is hashed")
	}
}

func TestDirectoryAuthenticates(t *testing.T) {
	t.Parallel()
	hash, _ := HashPassword("right", bcrypt.MinCost)
	d, err := newDirectory("", UserLine("alice", Operator, hash, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if u, ok, err := d.authenticate(ctx, "alice", "right"); err != nil || !ok || u.Role != Operator {
		t.Fatalf("alice with her password: %v %v %v", u, ok, err)
	}
	for _, c := range [][2]string{{"alice", "wrong"}, {"alice", ""}, {"nobody", "right"}} {
		if _, ok, err := d.authenticate(ctx, c[0], c[1]); ok || err != nil {
			t.Errorf("%s with %q: in %v, %v", c[0], c[1], ok, err)
		}
	}
	if _, err := newDirectory("", "", false); err == nil {
		t.Error("a console with no user starts")
	}
}

// TestUnknownNameTakesAsLongAsAKnownOne: whatever a user's hash costs, a
// login for a name nobody has, and one for a user whose hash is cheaper
// than another's, take as long as a login for the user of the dearest
// hash; nobody learns from the time which names exist.
func TestUnknownNameTakesAsLongAsAKnownOne(t *testing.T) {
	t.Parallel()
	cheap, _ := HashPassword("alice's", bcrypt.MinCost)
	dear, _ := HashPassword("bob's", 7)
	d, err := newDirectory("", UserLine("alice", Operator, cheap, nil)+";"+UserLine("bob", Viewer, dear, nil), false)
	if err != nil {
		t.Fatal(err)
	}
	// The three interleaved, so that a busy machine slows them alike.
	names := []string{"bob", "nobody", "alice"}
	took := map[string][]time.Duration{}
	for range 7 {
		for _, name := range names {
			start := time.Now()
			if _, ok, err := d.authenticate(context.Background(), name, "a guess"); ok || err != nil {
				t.Fatalf("%s with a guess: %v %v", name, ok, err)
			}
			took[name] = append(took[name], time.Since(start))
		}
	}
	median := func(name string) time.Duration {
		slices.Sort(took[name])
		return took[name][len(took[name])/2]
	}
	bob := median("bob")
	for _, name := range names[1:] {
		if got := median(name); got < bob/2 || got > bob*2 {
			t.Errorf("a login for %s took %v, one for bob (cost 7) %v: time tells them apart", name, got, bob)
		}
	}
}

func TestLoginLimiter(t *testing.T) {
	t.Parallel()
	l := newLimiter(3, time.Minute)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 3 {
		at := now.Add(time.Duration(i) * time.Second)
		if w := l.attempt(at, "addr:a", "name:x"); w != 0 {
			t.Fatalf("try %d waits %v", i, w)
		}
		l.settle(at, true, "addr:a", "name:x")
	}
	if w := l.attempt(now.Add(10*time.Second), "addr:a"); w != 50*time.Second {
		t.Fatalf("after 3 failures: wait %v, want 50s", w)
	}
	if w := l.attempt(now.Add(10*time.Second), "addr:b", "name:x"); w == 0 {
		t.Fatal("the name is not held from another address")
	}
	if w := l.attempt(now.Add(61*time.Second), "addr:a", "name:x"); w != 0 {
		t.Fatalf("after the window: wait %v", w)
	}
}

// TestLoginLimiterCountsBeforeChecking: of 30 logins for one name from
// one address at the same moment, only the limit's are let through to
// have their password checked; a success gives its place back.
func TestLoginLimiterCountsBeforeChecking(t *testing.T) {
	t.Parallel()
	l := newLimiter(5, time.Minute)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var through atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 30 {
		wg.Go(func() {
			<-start
			if l.attempt(now, "addr:a", "name:x") == 0 {
				through.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := through.Load(); n != 5 {
		t.Fatalf("%d of 30 concurrent logins were let through, want 5", n)
	}
	l.settle(now, false, "addr:a", "name:x")
	if w := l.attempt(now, "addr:a", "name:x"); w != 0 {
		t.Fatal("a success did not give its place back")
	}
	if w := l.attempt(now, "addr:a", "name:x"); w == 0 {
		t.Fatal("a sixth failure was let through")
	}
}

func TestSafeNextStaysOnThisSite(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/orders?status=error":                         "/orders?status=error",
		"/orders/3fa85f64-5717-4562-b3fc-2c963f66afa6": "/orders/3fa85f64-5717-4562-b3fc-2c963f66afa6",
		"/orders?status=error&after=x":                 "/orders?after=x&status=error",
		// Escapes stay escapes: a browser never reads them as a slash.
		"/%09/evil.example/x":     "/%09/evil.example/x",
		"/%2F/evil.example/x":     "/%2F/evil.example/x",
		"/%5Cevil.example":        "/%5Cevil.example",
		"/x#frag":                 "/x",
		"/x?q=%0d%0aSet-Cookie:a": "/x?q=%0D%0ASet-Cookie%3Aa",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
	for _, in := range badinput.HostileNext("evil.example") {
		if got := safeNext(in); got != "/" {
			t.Errorf("safeNext(%q) = %q, want /", in, got)
		}
	}
}

func TestTimelineNamesEachEvent(t *testing.T) {
	t.Parallel()
	one, two := 1, 2
	st := statestore.Step{Step: 1, Agent: "payment", Kind: "action"}
	h := []statestore.Transition{
		{Step: &one, From: "pending", To: "processing", Attempt: 1, Actor: "scheduler-1"},
		{Step: &one, From: "processing", To: "pending", Attempt: 1, Actor: "supervisor", Reason: "complete_by passed"},
		{Step: &two, From: "pending", To: "processing", Attempt: 1, Actor: "scheduler-1"},
		{Step: &one, From: "pending", To: "processing", Attempt: 2, Actor: "scheduler-2"},
		{Step: &one, From: "processing", To: "error", Attempt: 2, Actor: "scheduler-2"},
		{Step: &one, From: "error", To: "pending", Actor: "operator:sas_console_login", ClaimedBy: "console:alice", DBUser: "sas_console_login"},
		{Step: &one, From: "processing", To: "processed", Attempt: 3, Actor: "scheduler-1"},
	}
	var classes []string
	events := timeline(st, h, true)
	for _, e := range events {
		classes = append(classes, e.Class)
	}
	want := "claimed expired claimed failed operator replied"
	if strings.Join(classes, " ") != want {
		t.Fatalf("timeline %v, want %s", classes, want)
	}
	if n := failures(events); n != 2 {
		t.Fatalf("%d failures counted, want 2 (an expiry and a failure, across the resubmit)", n)
	}
	// A failure is "held" only when the order is held; else it is undone.
	if held, undone := events[3].Label, timeline(st, h, false)[3].Label; !strings.Contains(held, "held for an operator") || !strings.Contains(undone, "undone") {
		t.Fatalf("a failure's labels: held %q, else %q", held, undone)
	}
	comp := statestore.Step{Step: 2, Kind: "compensation"}
	if ev := timeline(comp, []statestore.Transition{{Step: &two, From: "processing", To: "processed"}}, true); ev[0].Class != "compensated" {
		t.Fatalf("a compensation's reply: %v", ev)
	}
}

func TestOnlyWhatTheStoreAllowsIsResubmittable(t *testing.T) {
	t.Parallel()
	failedAction := statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepError}
	failedUndo := statestore.Step{Kind: statestore.KindCompensation, ProcessState: statestore.StepError}
	done := statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepProcessed}
	for _, c := range []struct {
		desc               string
		st                 statestore.Step
		compensationFailed bool
		want               bool
	}{
		{"a failed action", failedAction, false, true},
		{"a failed action once a compensation failed", failedAction, true, false},
		{"a failed compensation", failedUndo, true, true},
		{"a step done", done, false, false},
	} {
		if got := resubmittable(c.st, c.compensationFailed); got != c.want {
			t.Errorf("%s: resubmittable %v, want %v", c.desc, got, c.want)
		}
	}
}

func TestOnlyAnActionThatEndedMayRunAgain(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		desc string
		st   statestore.Step
		want bool
	}{
		{"an action processed", statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepProcessed}, true},
		{"an action skipped", statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepSkipped}, true},
		{"an action waiting", statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepWaiting}, false},
		{"an action in error", statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepError}, false},
		{"one instance of a for_each step", statestore.Step{Kind: statestore.KindAction, ProcessState: statestore.StepProcessed, Parent: 3}, false},
		{"a compensation processed", statestore.Step{Kind: statestore.KindCompensation, ProcessState: statestore.StepProcessed}, false},
	} {
		if got := mayRunAgain(c.st); got != c.want {
			t.Errorf("%s: mayRunAgain %v, want %v", c.desc, got, c.want)
		}
	}
}

func TestConsoleAnswersOnlyForItsOrigins(t *testing.T) {
	t.Parallel()
	type req struct{ host, origin string }
	for _, c := range []struct {
		desc, public string
		forUs, notUs []string
		sameOrigin   []req
		crossOrigin  []req
	}{{
		desc:        "none stated: loopback names and addresses",
		forUs:       []string{"localhost", "localhost:8080", "LOCALHOST:8080", "app.localhost:8080", "127.0.0.1:8080", "[::1]:8080", "10.0.0.7"},
		notUs:       []string{"evil.example", "evil.example:8080", "localhost.evil.example:8080", "127.0.0.1.nip.io:8080", ""},
		sameOrigin:  []req{{"localhost:8080", "http://localhost:8080"}, {"127.0.0.1:8080", ""}},
		crossOrigin: []req{{"localhost:8080", "http://evil.example"}, {"localhost:8080", "http://localhost:9999"}, {"localhost:8080", "null"}},
	}, {
		desc:   "stated",
		public: "https://Console.Example.com, http://localhost:8080",
		forUs:  []string{"console.example.com", "console.example.com:443", "localhost:8080"},
		notUs:  []string{"evil.example", "127.0.0.1:8080", "console.example.com:8443", "localhost:9999", "localhost"},
		sameOrigin: []req{{"console.example.com", "https://console.example.com"}, {"console.example.com", "https://console.example.com:443"},
			{"localhost:8080", "http://localhost:8080"}},
		crossOrigin: []req{{"console.example.com", "http://console.example.com"}, {"console.example.com", "https://evil.example"},
			{"evil.example", "http://evil.example"}, {"localhost:8080", "http://localhost:8081"}},
	}} {
		t.Run(c.desc, func(t *testing.T) {
			o, err := parseOrigins(c.public)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range c.forUs {
				if !o.forUs(&http.Request{Host: h}) {
					t.Errorf("host %q refused", h)
				}
			}
			for _, h := range c.notUs {
				if o.forUs(&http.Request{Host: h}) {
					t.Errorf("host %q answered", h)
				}
			}
			for _, rq := range c.sameOrigin {
				if !o.sameOrigin(&http.Request{Host: rq.host, Header: http.Header{"Origin": {rq.origin}}}) {
					t.Errorf("origin %q for host %q refused", rq.origin, rq.host)
				}
			}
			for _, rq := range c.crossOrigin {
				if o.sameOrigin(&http.Request{Host: rq.host, Header: http.Header{"Origin": {rq.origin}}}) {
					t.Errorf("origin %q for host %q taken as the console's", rq.origin, rq.host)
				}
			}
		})
	}
	for _, bad := range []string{"console.example.com", "ftp://x", "https://x/path", "https://u:p@x", "https://x?q", " , "} {
		if _, err := parseOrigins(bad); err == nil {
			t.Errorf("SAS_CONSOLE_PUBLIC_URL=%q accepted", bad)
		}
	}
}

// TestEndedOrdersShowWhatBecameOfEachStep: in an order that ended, a step
// that never ran is shown not run (not waiting), an action whose
// compensation ran is undone (not processed, in the graph too), and a
// failed order says why at once: its failed step, its error and its
// service's last answer (a compensation's first).
func TestEndedOrdersShowWhatBecameOfEachStep(t *testing.T) {
	t.Parallel()
	steps := []statestore.Step{
		{Step: 1, Name: "reserve", Kind: statestore.KindAction, Agent: "inv", ProcessState: statestore.StepProcessed, Needs: []int{}},
		{Step: 2, Name: "charge", Kind: statestore.KindAction, Agent: "pay", ProcessState: statestore.StepError, Needs: []int{1},
			LastError: "card declined", LastAnswer: "402"},
		{Step: 3, Name: "unreserve", Kind: statestore.KindCompensation, Compensates: 1, Agent: "inv", ProcessState: statestore.StepProcessed},
		{Step: 4, Name: "refund", Kind: statestore.KindCompensation, Compensates: 2, Agent: "pay", ProcessState: statestore.StepWaiting},
	}
	shown := statestore.OrderDetail{Order: statestore.Order{Status: statestore.OrderFailed}, Steps: steps}.ShownStates()
	for i, want := range []string{statestore.StateUndone, statestore.StepError, statestore.StepProcessed, statestore.StateNotRun} {
		if got := shown[i+1]; got != want {
			t.Errorf("step %d of a failed order shown %s, want %s", i+1, got, want)
		}
	}
	if got := (statestore.OrderDetail{Order: statestore.Order{Status: statestore.OrderCompensating}, Steps: steps}).ShownStates()[4]; got != statestore.StepWaiting {
		t.Errorf("a compensation of an order being undone shown %s, want waiting", got)
	}
	levels := graphLevels(steps, shown)
	if len(levels) != 2 || levels[0][0].State != statestore.StateUndone || levels[1][0].State != statestore.StepError {
		t.Fatalf("the graph: %+v", levels)
	}
	why := whyEnded(statestore.Order{Status: statestore.OrderFailed}, steps)
	if why != "step 2 (charge) failed: card declined; the service's last answer: 402" {
		t.Fatalf("why: %q", why)
	}
	if whyEnded(statestore.Order{Status: statestore.OrderCompleted}, steps) != "" {
		t.Fatal("a completed order says why it failed")
	}
	for want, st := range map[string]statestore.Step{
		"action · agent.inv":                              steps[0],
		"compensation of step 1 · agent.inv":              steps[2],
		"wait for signal approved":                        {Kind: statestore.KindAction, Wait: "approved"},
		"sub-process kyc_check":                           {Kind: statestore.KindAction, Workflow: "kyc_check"},
		"timer":                                           {Kind: statestore.KindAction},
		"compensation of step 5 · undoes its child order": {Kind: statestore.KindCompensation, Compensates: 5, Workflow: "kyc_check"},
	} {
		if got := st.What(); got != want {
			t.Errorf("%+v reads %q, want %q", st, got, want)
		}
	}
}

// TestTheTimelineDrawsEachSpan: a step's attempts (one that ran out, one
// that ended well), a wait and a timer are each a bar of their own, from
// the move that began it to the one that ended it; a 202 holding an
// attempt open begins none; a span still open runs to now; the
// instances of a for_each step are one bar on its row, with their count.
func TestTheTimelineDrawsEachSpan(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	one, two, three, four, five, six := 1, 2, 3, 4, 5, 6
	mv := func(step *int, from, to string, s, attempt int) statestore.Transition {
		return statestore.Transition{Step: step, From: from, To: to, At: at(s), Attempt: attempt}
	}
	d := statestore.OrderDetail{
		Order: statestore.Order{CreatedAt: t0},
		Steps: []statestore.Step{
			{Step: 1, Name: "charge", Kind: statestore.KindAction},
			{Step: 2, Name: "approval", Kind: statestore.KindAction, Wait: "approved"},
			{Step: 3, Name: "cooling_off", Kind: statestore.KindAction},
			{Step: 4, Name: "notify", Kind: statestore.KindAction},
			{Step: 5, Name: "notify", Kind: statestore.KindAction, Parent: 4},
			{Step: 6, Name: "notify", Kind: statestore.KindAction, Parent: 4},
		},
		History: []statestore.Transition{
			mv(&one, "pending", "processing", 0, 1), mv(&one, "processing", "processing", 1, 1), mv(&one, "processing", "pending", 10, 1),
			mv(&one, "pending", "processing", 12, 2), mv(&one, "processing", "processed", 14, 2),
			mv(&two, "waiting", "awaiting", 14, 0), mv(&two, "awaiting", "processed", 20, 0),
			mv(&three, "waiting", "delayed", 20, 0), mv(&three, "delayed", "processed", 30, 0),
			mv(&four, "pending", "processing", 30, 1), mv(&four, "processing", "expanded", 30, 1),
			mv(&five, "pending", "processing", 31, 1), mv(&five, "processing", "processed", 33, 1),
			mv(&six, "pending", "processing", 31, 1),
		},
	}
	g := buildGantt(d, at(40))
	if g == nil || len(g.Rows) != 4 {
		t.Fatalf("rows %+v", g)
	}
	var classes [][]string
	for _, r := range g.Rows {
		var cs []string
		for _, b := range r.Bars {
			cs = append(cs, b.Class)
		}
		classes = append(classes, cs)
	}
	want := [][]string{{"attempt failed", "attempt ok"}, {"wait ok"}, {"timer ok"}, {"attempt ok", "attempt running"}}
	if fmt.Sprint(classes) != fmt.Sprint(want) {
		t.Fatalf("bars %v, want %v", classes, want)
	}
	if g.Rows[3].Label != "4. notify ×2" || !strings.Contains(g.Rows[3].Bars[1].Title, "2 instances") {
		t.Fatalf("the for_each row: %+v", g.Rows[3])
	}
	// charge's first attempt: 0 s to 10 s of 40, past the labels.
	if b := g.Rows[0].Bars[0]; b.X != fmt.Sprintf("%.1f", ganttLabel) || b.W != fmt.Sprintf("%.1f", 10.0/40*(ganttW-ganttLabel)) {
		t.Fatalf("the first bar at %s, %s wide", b.X, b.W)
	}
	if g.Span != "40s" && !strings.HasPrefix(g.Span, "40") {
		t.Fatalf("span %q", g.Span)
	}
}

// TestProcessesAreDrawnWithTheirEdges: a workflow is drawn a box a step
// with an arrow from each step it needs (a list's from the step before),
// every arrow pointing right; an N-of-M join's arrows are marked; an
// order's for_each step is one box counting its instances (100 items
// draw one box), its sub-process box links to the child order.
func TestProcessesAreDrawnWithTheirEdges(t *testing.T) {
	t.Parallel()
	reg, err := workflow.Parse("draw.yaml", []byte(`
workflows:
  - name: loan
    steps:
      - {action: score, agent: risk}
      - {id: kyc, workflow: kyc_check, needs: []}
      - {id: approval, wait: {signal: approved, timeout: 10m}, needs: [score]}
      - {action: open, agent: core, needs: {any: 2, of: [score, kyc, approval]}}
  - name: kyc_check
    steps:
      - {action: check_id, agent: kyc}
      - {action: check_address, agent: kyc}
`))
	if err != nil {
		t.Fatal(err)
	}
	loan, _ := reg.Lookup("loan")
	g := workflowGraph(loan)
	if len(g.Nodes) != 4 || len(g.Edges) != 4 {
		t.Fatalf("loan: %d boxes, %d arrows", len(g.Nodes), len(g.Edges))
	}
	joins := 0
	for _, e := range g.Edges {
		var x0, y0, x1, y1, a, b, c, d float64
		if _, err := fmt.Sscanf(e.D, "M%f %f C%f %f, %f %f, %f %f", &x0, &y0, &a, &b, &c, &d, &x1, &y1); err != nil || x1 <= x0 {
			t.Fatalf("an arrow that does not point right: %q (%v)", e.D, err)
		}
		if e.Class == "edge join-any" {
			joins++
		}
	}
	if joins != 3 || g.Nodes[3].Sub != "core · any 2 of 3" || g.Nodes[2].Class != "kind-wait" || !strings.Contains(g.Nodes[2].Sub, "10m") {
		t.Fatalf("the join and the wait: %+v", g.Nodes)
	}
	kyc, _ := reg.Lookup("kyc_check")
	if list := workflowGraph(kyc); len(list.Edges) != 1 || list.Nodes[1].X <= list.Nodes[0].X {
		t.Fatalf("a list as a chain: %+v", list)
	}

	child := messages.NewID()
	d := statestore.OrderDetail{Steps: []statestore.Step{
		{Step: 1, Name: "score", Kind: statestore.KindAction, Agent: "risk", ProcessState: statestore.StepProcessed, Needs: []int{}},
		{Step: 2, Name: "kyc", Kind: statestore.KindAction, Workflow: "kyc_check", ProcessState: statestore.StepAwaiting, Needs: []int{}},
		{Step: 3, Name: "notify", Kind: statestore.KindAction, Agent: "mail", ProcessState: statestore.StepExpanded, Needs: []int{1}},
	}, Children: []statestore.ChildRef{{OrderID: child, Step: 2}}}
	for i := range 100 {
		state := statestore.StepPending
		if i < 40 {
			state = statestore.StepProcessed
		}
		d.Steps = append(d.Steps, statestore.Step{Step: 4 + i, Name: "notify", Kind: statestore.KindAction, Parent: 3, ProcessState: state})
	}
	o := orderGraph(d, d.ShownStates())
	if len(o.Nodes) != 3 || len(o.Edges) != 1 || o.Nodes[2].Sub != "expanded · ×100, 40 done" || o.Nodes[1].Href != "/orders/"+child ||
		o.Nodes[0].Class != "st-processed" {
		t.Fatalf("the order's drawing: %+v", o.Nodes)
	}
	// Once a compensation runs, the path of undoing is drawn.
	d.Steps = append(d.Steps, statestore.Step{Step: 200, Name: "unscore", Kind: statestore.KindCompensation, Compensates: 1,
		ProcessState: statestore.StepProcessed}, statestore.Step{Step: 201, Name: "unnotify", Kind: statestore.KindCompensation, Compensates: 3,
		ProcessState: statestore.StepWaiting})
	o = orderGraph(d, d.ShownStates())
	if len(o.Nodes) != 4 || o.Nodes[3].Label != "↺ 200. unscore" || o.Nodes[0].Class != "st-undone" || o.Edges[len(o.Edges)-1].Class != "edge undo" {
		t.Fatalf("the undoing drawn: %+v %+v", o.Nodes, o.Edges)
	}
}
