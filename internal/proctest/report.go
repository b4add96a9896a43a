package proctest

import (
	"encoding/xml"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"sas/internal/workflow"
)

// Result is a case's run: its outcome, the differences from what it
// expects, and how long it took on the wall clock.
type Result struct {
	Suite   string
	Case    Case
	Outcome Outcome
	Diffs   []string
	Wall    time.Duration
}

// Passed reports whether the case got what it expects.
func (r Result) Passed() bool { return len(r.Diffs) == 0 }

// Print writes a result as `go test -v` does: a line per case, and for a
// failure the differences, the path its order took and what happened.
func Print(w io.Writer, r Result, verbose bool) {
	status := "PASS"
	if !r.Passed() {
		status = "FAIL"
	}
	fmt.Fprintf(w, "--- %s: %s (%.2fs, virtual %s)\n", status, r.Case.Name, r.Wall.Seconds(), short(r.Outcome.Took))
	if r.Passed() && !verbose {
		return
	}
	for _, d := range r.Diffs {
		fmt.Fprintf(w, "    %s\n", d)
	}
	if r.Outcome.Err != nil && r.Outcome.OrderID == "" {
		return
	}
	fmt.Fprintf(w, "    path of order %s:\n", r.Outcome.OrderID)
	for _, l := range r.Outcome.Path() {
		fmt.Fprintf(w, "        %s\n", l)
	}
	if verbose || !r.Passed() {
		fmt.Fprintf(w, "    what happened (virtual time):\n")
		for _, l := range r.Outcome.Trace {
			fmt.Fprintf(w, "        %s\n", l)
		}
	}
}

// JUnit writes the results as JUnit XML, a test suite per cases file.
func JUnit(w io.Writer, results []Result) error {
	type failure struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	}
	type testcase struct {
		Name      string   `xml:"name,attr"`
		Classname string   `xml:"classname,attr"`
		Time      string   `xml:"time,attr"`
		Failure   *failure `xml:"failure,omitempty"`
	}
	type testsuite struct {
		Name     string     `xml:"name,attr"`
		Tests    int        `xml:"tests,attr"`
		Failures int        `xml:"failures,attr"`
		Time     string     `xml:"time,attr"`
		Cases    []testcase `xml:"testcase"`
	}
	type testsuites struct {
		XMLName xml.Name    `xml:"testsuites"`
		Suites  []testsuite `xml:"testsuite"`
	}
	var doc testsuites
	index := map[string]int{}
	var wall = map[string]time.Duration{}
	for _, r := range results {
		i, ok := index[r.Suite]
		if !ok {
			i = len(doc.Suites)
			index[r.Suite] = i
			doc.Suites = append(doc.Suites, testsuite{Name: r.Suite})
		}
		s := &doc.Suites[i]
		tc := testcase{Name: r.Case.Name, Classname: r.Case.Workflow, Time: fmt.Sprintf("%.3f", r.Wall.Seconds())}
		if !r.Passed() {
			var b strings.Builder
			Print(&b, r, false)
			tc.Failure = &failure{Message: strings.SplitN(r.Diffs[0], "\n", 2)[0], Text: b.String()}
			s.Failures++
		}
		s.Tests++
		wall[r.Suite] += r.Wall
		s.Cases = append(s.Cases, tc)
	}
	for i := range doc.Suites {
		doc.Suites[i].Time = fmt.Sprintf("%.3f", wall[doc.Suites[i].Name].Seconds())
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// Item is one thing of a process the cases may exercise: a step that
// ran, a when true or false, a failure, a compensation, a wait's signal
// or its timeout.
type Item struct {
	Workflow, What string
	// By names the first case that exercised it ("": none).
	By string
}

// Coverage lists, for every workflow the cases reach (theirs and their
// sub-processes), what a process can do and which case did it.
func Coverage(reg *workflow.Registry, results []Result) []Item {
	type key struct{ wf, what string }
	by := map[key]string{}
	seen := func(wf, what, c string) {
		k := key{wf, what}
		if _, ok := by[k]; !ok {
			by[k] = c
		}
	}
	reached := map[string]bool{}
	for _, wf := range reg.All() {
		reached[wf.Name] = true // a workflow no case reaches is all not covered
	}
	for _, r := range results {
		for _, s := range r.Outcome.Steps {
			reached[s.Workflow] = true
			name := r.Case.Name
			switch s.State {
			case "processed":
				if s.Wait {
					seen(s.Workflow, "wait "+s.Ref+" got its signal", name)
				} else {
					seen(s.Workflow, "step "+s.Ref+" ran", name)
				}
				if s.HasWhen {
					seen(s.Workflow, "step "+s.Ref+": when true", name)
				}
			case "skipped":
				if strings.HasPrefix(s.Why, "when ") {
					seen(s.Workflow, "step "+s.Ref+": when false", name)
				} else if s.Wait {
					seen(s.Workflow, "wait "+s.Ref+" timed out", name)
				}
			case "error":
				if s.Wait {
					seen(s.Workflow, "wait "+s.Ref+" timed out", name)
				} else {
					seen(s.Workflow, "step "+s.Ref+" failed", name)
				}
				if s.HasWhen {
					seen(s.Workflow, "step "+s.Ref+": when true", name)
				}
			}
			if s.Compensated {
				seen(s.Workflow, "compensation of "+s.Ref+" ran", name)
			}
		}
	}
	var items []Item
	names := make([]string, 0, len(reached))
	for wf := range reached {
		names = append(names, wf)
	}
	slices.Sort(names)
	for _, name := range names {
		wf, ok := reg.Lookup(name)
		if !ok {
			continue
		}
		for _, st := range wf.Steps {
			ref := st.Ref()
			var whats []string
			switch {
			case st.Wait != nil:
				whats = append(whats, "wait "+ref+" got its signal", "wait "+ref+" timed out")
			case st.Workflow != "":
				whats = append(whats, "step "+ref+" ran", "step "+ref+" failed")
			case st.InSystem():
				whats = append(whats, "step "+ref+" ran")
			default:
				whats = append(whats, "step "+ref+" ran", "step "+ref+" failed")
			}
			if st.When != "" {
				whats = append(whats, "step "+ref+": when true", "step "+ref+": when false")
			}
			if st.Compensation != nil || st.Workflow != "" {
				whats = append(whats, "compensation of "+ref+" ran")
			}
			for _, w := range whats {
				items = append(items, Item{Workflow: name, What: w, By: by[key{name, w}]})
			}
		}
	}
	return items
}

// PrintCoverage writes the coverage, a workflow at a time: the share
// exercised, then each item with the case that did it or "none".
func PrintCoverage(w io.Writer, items []Item) {
	var cur string
	for i, it := range items {
		if it.Workflow != cur {
			cur = it.Workflow
			n, done := 0, 0
			for _, x := range items[i:] {
				if x.Workflow != cur {
					break
				}
				n++
				if x.By != "" {
					done++
				}
			}
			fmt.Fprintf(w, "coverage of workflow %s: %d of %d (%d%%)\n", cur, done, n, 100*done/max(n, 1))
		}
		if it.By != "" {
			fmt.Fprintf(w, "    covered      %-40s by %q\n", it.What, it.By)
		} else {
			fmt.Fprintf(w, "    NOT COVERED  %s\n", it.What)
		}
	}
}
