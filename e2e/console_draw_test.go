package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// largeProcesses are a graph of 20 steps (one step, six branches of three,
// a join of the six) and a for_each of 100 items.
func largeProcesses() string {
	var b strings.Builder
	b.WriteString("workflows:\n  - name: wide\n    steps:\n      - {action: start, agent: work}\n")
	var last []string
	for i := 1; i <= 6; i++ {
		prev := "start"
		for _, layer := range []string{"check", "book", "confirm"} {
			id := fmt.Sprintf("%s_%d", layer, i)
			fmt.Fprintf(&b, "      - {id: %s, action: %s, agent: work, needs: [%s]}\n", id, layer, prev)
			prev = id
		}
		last = append(last, prev)
	}
	fmt.Fprintf(&b, "      - {action: finish, agent: work, needs: [%s]}\n", strings.Join(last, ", "))
	b.WriteString(`  - name: fan
    steps:
      - {action: prepare, agent: work}
      - {action: notify, agent: work, for_each: payload.people, max_parallel: 20, needs: [prepare]}
`)
	return b.String()
}

// TestConsoleDrawsLargeProcesses: in Chromium, a graph of 20 steps is
// drawn as 20 boxes with an arrow for each step needed, and a for_each
// of 100 items as one box counting them, with one timeline row; both are
// the README's screenshots (make console-screenshots).
func TestConsoleDrawsLargeProcesses(t *testing.T) {
	t.Parallel()
	g := runFile(t, "large.yaml", largeProcesses(), pipelineOpts{schedulers: 1, agents: 1})
	var people []string
	for i := range 100 {
		people = append(people, fmt.Sprintf("%q", fmt.Sprintf("person-%d", i)))
	}
	ids := append(g.submit(t, "wide", []string{`{}`}), g.submit(t, "fan", []string{`{"people": [` + strings.Join(people, ",") + `]}`})...)
	g.pipeline.waitTerminal(t, ids, 2*time.Minute)
	c := startConsole(t, g.stack, "SAS_WORKFLOWS_FILE="+g.file)
	ctx := browser(t)
	shots := newScreenshots(t)
	login(t, ctx, c.url, "alice", "alice's password")

	waitStatus(t, ctx, c.url, ids[0], "completed")
	boxes := eval[int](t, ctx, `document.querySelectorAll("#process a.gnode").length`)
	arrows := eval[int](t, ctx, `document.querySelectorAll("#process path.edge").length`)
	if boxes != 20 || arrows != 24 {
		t.Fatalf("the 20-step graph is drawn with %d boxes and %d arrows, want 20 and 24", boxes, arrows)
	}
	shots.takeOf(ctx, "graph-20", "#process")

	waitStatus(t, ctx, c.url, ids[1], "completed")
	drawing := eval[string](t, ctx, `document.querySelector("#process").textContent`)
	if boxes := eval[int](t, ctx, `document.querySelectorAll("#process a.gnode").length`); boxes != 2 || !strings.Contains(drawing, "×100, 100 done") {
		t.Fatalf("the for_each of 100 is drawn with %d boxes: %q", boxes, drawing)
	}
	if rows := eval[int](t, ctx, `document.querySelectorAll("#timeline g.row").length`); rows != 2 {
		t.Fatalf("the for_each's timeline has %d rows, want 2 (its instances on one)", rows)
	}
	shots.takeOf(ctx, "foreach-100", "#process")
}
