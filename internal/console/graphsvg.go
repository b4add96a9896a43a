package console

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"

	"sas/internal/statestore"
	"sas/internal/workflow"
)

// A process drawn as a graph: a box a step, an arrow from each step to
// each that comes after it, laid out left to right by level (each step
// one level past the deepest it comes after), drawn on the server as SVG
// (no script). The order page colours each box by the state it is shown
// in; the Workflows page by what the step is.
const (
	nodeW, nodeH     = 170.0, 40.0
	levelGap, rowGap = 50.0, 14.0
	maxLabel         = 24
)

// gnode is one box before layout.
type gnode struct {
	key     string
	label   string
	sub     string   // under the label: a state, a kind, "×N"
	class   string   // the box's class: st-STATE, or kind-KIND
	after   []string // the keys of the boxes it comes after
	partial bool     // a join that runs before all of its needs end (an N-of-M join)
	href    string
	undo    bool // a compensation: its arrow comes from the action it undoes
}

type svgNode struct {
	X, Y, TextX, LabelY, SubY string
	Label, Sub, Class, Href   string
	Title                     string
}

type svgEdge struct {
	D     string // the path
	Class string // edge, or edge join-any
}

type graphSVG struct {
	Width, Height string
	Nodes         []svgNode
	Edges         []svgEdge
}

// layoutGraph places nodes by level and draws their edges; nil for none.
func layoutGraph(nodes []gnode) *graphSVG {
	if len(nodes) == 0 {
		return nil
	}
	index := map[string]int{}
	for i, n := range nodes {
		index[n.key] = i
	}
	level := make([]int, len(nodes))
	// Levels in the nodes' order: a step comes after steps before it (a
	// list's, a graph's rows as the parser numbers them), so one pass is
	// enough; a need that points forward is given its own pass.
	for pass := 0; pass < 2; pass++ {
		for i, n := range nodes {
			for _, a := range n.after {
				if j, ok := index[a]; ok && j != i {
					level[i] = max(level[i], level[j]+1)
				}
			}
		}
	}
	rows := map[int]int{}
	pos := make([][2]float64, len(nodes))
	depth := 0
	for i := range nodes {
		l := level[i]
		pos[i] = [2]float64{float64(l) * (nodeW + levelGap), float64(rows[l]) * (nodeH + rowGap)}
		rows[l]++
		depth = max(depth, rows[l])
	}
	g := &graphSVG{}
	width := 0.0
	for i, n := range nodes {
		x, y := pos[i][0], pos[i][1]
		width = max(width, x+nodeW)
		label := n.label
		if r := []rune(label); len(r) > maxLabel {
			label = string(r[:maxLabel-1]) + "…"
		}
		g.Nodes = append(g.Nodes, svgNode{X: f1(x), Y: f1(y), TextX: f1(x + 8), LabelY: f1(y + 16), SubY: f1(y + 32),
			Label: label, Sub: n.sub, Class: n.class, Href: n.href, Title: n.label + ": " + n.sub})
		for _, a := range n.after {
			j, ok := index[a]
			if !ok {
				continue
			}
			x0, y0 := pos[j][0]+nodeW, pos[j][1]+nodeH/2
			x1, y1 := x, y+nodeH/2
			mid := (x0 + x1) / 2
			class := "edge"
			switch {
			case n.undo:
				class = "edge undo"
			case n.partial:
				class = "edge join-any"
			}
			g.Edges = append(g.Edges, svgEdge{D: fmt.Sprintf("M%s %s C%s %s, %s %s, %s %s", f1(x0), f1(y0), f1(mid), f1(y0), f1(mid), f1(y1), f1(x1-4), f1(y1)),
				Class: class})
		}
	}
	g.Width = f1(width + 4)
	g.Height = f1(float64(depth)*(nodeH+rowGap) + 4)
	return g
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// orderGraph draws an order's actions (a list's as the chain it is), each
// in the state it is shown in (shown), a join's N, a for_each step's
// instances counted, a sub-process linked to its child order; and, once
// the order is being undone, each compensation made to run, after the
// action it undoes.
func orderGraph(d statestore.OrderDetail, shown map[int]string) *graphSVG {
	instances, done := map[int]int{}, map[int]int{}
	for _, st := range d.Steps {
		if st.Kind == statestore.KindAction && st.Parent > 0 {
			instances[st.Parent]++
			if st.ProcessState == statestore.StepProcessed || st.ProcessState == statestore.StepSkipped {
				done[st.Parent]++
			}
		}
	}
	children := map[int]string{}
	for _, c := range d.Children {
		children[c.Step] = c.OrderID
	}
	var nodes []gnode
	prev := ""
	for _, st := range d.Steps {
		if st.Kind != statestore.KindAction || st.Parent > 0 {
			continue
		}
		key := strconv.Itoa(st.Step)
		n := gnode{key: key, label: fmt.Sprintf("%d. %s", st.Step, cmp.Or(st.ID, st.Name)), partial: st.Quorum() != "", href: "#step-" + key}
		state := cmp.Or(shown[st.Step], st.ProcessState)
		n.class, n.sub = "st-"+state, state+" · "+st.Sort()
		if c, ok := instances[st.Step]; ok {
			n.sub = fmt.Sprintf("%s · ×%d, %d done", state, c, done[st.Step])
		}
		if q := st.Quorum(); q != "" {
			n.sub = fmt.Sprintf("%s · %s of %d", state, q, len(st.Needs))
		}
		if child, ok := children[st.Step]; ok {
			n.href = "/orders/" + child
		}
		switch {
		case st.Needs != nil:
			for _, need := range st.Needs {
				n.after = append(n.after, strconv.Itoa(need))
			}
		case prev != "":
			n.after = []string{prev}
		}
		prev = key
		nodes = append(nodes, n)
	}
	// The compensation path, once one runs: each compensation that was
	// made to run, after the action it undoes.
	for _, st := range d.Steps {
		if st.Kind != statestore.KindCompensation || st.Parent > 0 {
			continue
		}
		switch st.ProcessState {
		case statestore.StepPending, statestore.StepProcessing, statestore.StepProcessed, statestore.StepError:
		default:
			continue
		}
		state := cmp.Or(shown[st.Step], st.ProcessState)
		nodes = append(nodes, gnode{key: "c" + strconv.Itoa(st.Step), label: fmt.Sprintf("↺ %d. %s", st.Step, st.Name),
			sub: state + " · undoes " + strconv.Itoa(st.Compensates), class: "st-" + state, after: []string{strconv.Itoa(st.Compensates)},
			href: "#step-" + strconv.Itoa(st.Step), undo: true})
	}
	return layoutGraph(nodes)
}

// workflowGraph draws a workflow as the Workflows page shows it: each
// step coloured by what it is, after the steps it needs (a list's after
// the one before it).
func workflowGraph(wf workflow.Workflow) *graphSVG {
	var nodes []gnode
	for i, st := range wf.Steps {
		n := gnode{key: st.Ref(), label: fmt.Sprintf("%d. %s", i+1, st.Ref()), class: "kind-" + st.Kind(), partial: st.Quorum() != ""}
		n.sub = st.Kind()
		switch st.Kind() {
		case "action":
			n.sub = st.Agent
		case "wait":
			n.sub = "wait " + st.Wait.Signal + " · " + workflow.DurationText(st.Wait.Timeout)
		case "timer":
			n.sub = "timer · " + workflow.DurationText(st.Delay)
		case "sub-process":
			n.sub = "runs " + st.Workflow
		}
		if st.ForEach != "" {
			n.sub += " · for each"
		}
		if q := st.Quorum(); q != "" {
			n.sub += fmt.Sprintf(" · %s of %d", q, len(st.Needs))
		}
		if wf.Graph {
			n.after = slices.Clone(st.Needs)
		} else if i > 0 {
			n.after = []string{wf.Steps[i-1].Ref()}
		}
		nodes = append(nodes, n)
	}
	return layoutGraph(nodes)
}
