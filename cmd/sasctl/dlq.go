package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// inputs are the unprefixed names of the queues sas consumes, each with
// its dead-letter queue (messages.Inputs), the agent kinds those of the
// workflows.
func inputs(reg *workflow.Registry) []string { return messages.Inputs(reg.Agents()) }

// workflowsFlag adds --workflows to a command that needs the agent kinds:
// the file the services read (SAS_WORKFLOWS_FILE), the same default.
func workflowsFlag(fs *flag.FlagSet) *string {
	return fs.String("workflows", "", "the workflows file whose agent kinds name the queues (default: SAS_WORKFLOWS_FILE, else the built-in one)")
}

// deadLetterQueues names the dead-letter queues a command looks at: the
// one of queue (an input's name, with or without the prefix and .dlq), or
// every input's, the agent kinds read from the workflows file as the
// services read it.
func (a *app) deadLetterQueues(queue, workflows string) ([]string, error) {
	reg, err := workflowsFile(workflows)
	if err != nil {
		return nil, err
	}
	// In a partitioned deployment, every partition's queues (a queue
	// named with a partition's prefix: that partition's alone).
	prefixes := []string{a.cfg.QueuePrefix}
	l, err := a.layout()
	if err != nil {
		return nil, err
	}
	if l != nil {
		prefixes = prefixes[:0]
		for _, p := range l.Partitions {
			prefixes = append(prefixes, p.QueuePrefix)
		}
	}
	all := inputs(reg)
	if queue == "" {
		var out []string
		for _, prefix := range prefixes {
			for _, in := range all {
				out = append(out, broker.Topology{Prefix: prefix}.DeadLetterQueue(in))
			}
		}
		return out, nil
	}
	var out []string
	for _, prefix := range prefixes {
		name := strings.TrimSuffix(queue, ".dlq")
		if l != nil && !strings.HasPrefix(name, prefix) && slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue // another partition's
		}
		name = strings.TrimPrefix(name, prefix)
		if slices.Contains(all, name) {
			out = append(out, broker.Topology{Prefix: prefix}.DeadLetterQueue(name))
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	return nil, fmt.Errorf("no input queue %q: the queues of %s are %s (with or without the prefix %q and .dlq); %s",
		queue, sourceName(reg), strings.Join(all, ", "), a.cfg.QueuePrefix, nameAnother)
}

// scan runs ScanDLQ over each queue with decide and returns what it saw.
func (a *app) scan(ctx context.Context, queues []string, limit int, decide func(broker.DeadLetter) broker.DLQAction) ([]broker.DeadLetter, []broker.DLQAction, error) {
	conn, pub, _, err := a.openBroker(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	defer pub.Close()
	var seen []broker.DeadLetter
	var done []broker.DLQAction
	for _, q := range queues {
		s, d, err := conn.ScanDLQ(ctx, pub, q, limit, decide)
		seen, done = append(seen, s...), append(done, d...)
		if err != nil {
			return seen, done, err
		}
	}
	return seen, done, nil
}

func (a *app) dlqList(ctx context.Context, args []string) error {
	fs := a.flags()
	reason := fs.String("reason", "", "only dead letters with this reason (e.g. not_json, expired)")
	limit := fs.Int("limit", 1000, "look at most at this many messages per queue")
	asJSON := fs.Bool("json", false, "print JSON, bodies included")
	workflows := workflowsFlag(fs)
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 1 {
		return a.usageError(fs, "give at most one queue")
	}
	in, err := a.deadLettersIn(fs, *namespace)
	if err != nil {
		return err
	}
	if err := a.positive(fs, "limit", *limit); err != nil {
		return err
	}
	queues, err := a.deadLetterQueues(strings.Join(rest, ""), *workflows)
	if err != nil {
		return err
	}
	seen, _, err := a.scan(ctx, queues, *limit, func(broker.DeadLetter) broker.DLQAction { return broker.Keep })
	if err != nil {
		return err
	}
	var shown []broker.DeadLetter
	for _, d := range seen {
		if (*reason == "" || d.Reason == *reason) && in(d) {
			shown = append(shown, d)
		}
	}
	if *asJSON {
		return a.printJSON(deadLettersJSON(shown))
	}
	// In a partitioned deployment FROM keeps the partition's prefix.
	from := func(q string) string { return strings.TrimPrefix(q, a.cfg.QueuePrefix) }
	if l, err := a.layout(); err == nil && l != nil {
		from = func(q string) string { return q }
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MESSAGE_ID\tREASON\tFROM\tAGE\tDETAIL\tBODY")
	for _, d := range shown {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", clip(d.MessageID, 36), d.Reason, from(d.OriginalQueue),
			age(d.At), preview([]byte(d.Detail), 28), preview(d.Body, 20))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "%d dead letters in %s\n", len(shown), strings.Join(queues, ", "))
	return nil
}

func (a *app) dlqShow(ctx context.Context, args []string) error {
	fs := a.flags()
	queue := fs.String("queue", "", "look only in this queue's dead letters")
	workflows := workflowsFlag(fs)
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give one message id")
	}
	in, err := a.deadLettersIn(fs, *namespace)
	if err != nil {
		return err
	}
	queues, err := a.deadLetterQueues(*queue, *workflows)
	if err != nil {
		return err
	}
	seen, _, err := a.scan(ctx, queues, 0, func(broker.DeadLetter) broker.DLQAction { return broker.Keep })
	if err != nil {
		return err
	}
	found := 0
	for _, d := range seen {
		if d.MessageID != rest[0] || !in(d) {
			continue
		}
		found++
		fmt.Fprintf(a.stdout, "message   %s\nqueue     %s\nnamespace %s\nfrom      %s\nreason    %s\ndetail    %s\nat        %s (%s ago)\ntype      %s\ncontent   %s\n\n%s\n\n",
			d.MessageID, d.DLQ, dash(d.Namespace), dash(d.OriginalQueue), d.Reason, wrap(d.Detail, showWidth, strings.Repeat(" ", 10)),
			stamp(d.At), age(d.At), dash(d.Type), dash(d.ContentType), d.Body)
	}
	if found == 0 {
		return fmt.Errorf("no dead letter with message id %q in %s", rest[0], strings.Join(queues, ", "))
	}
	return nil
}

// dlqMove requeues or discards dead letters: one by id, those with a
// reason, or all.
func (a *app) dlqMove(ctx context.Context, args []string, action broker.DLQAction) error {
	fs := a.flags()
	queue := fs.String("queue", "", "only this queue's dead letters")
	workflows := workflowsFlag(fs)
	reason := fs.String("reason", "", "every dead letter with this reason")
	all := fs.Bool("all", false, "every dead letter")
	namespace := namespaceFlag(fs)
	var yes *bool
	if action == broker.Drop {
		yes = fs.Bool("yes", false, "do not ask for confirmation")
	}
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	chosen := 0
	for _, b := range []bool{len(rest) > 0, *reason != "", *all} {
		if b {
			chosen++
		}
	}
	if chosen != 1 || len(rest) > 1 {
		return a.usageError(fs, "give one message id, --reason R or --all")
	}
	in, err := a.deadLettersIn(fs, *namespace)
	if err != nil {
		return err
	}
	id := strings.Join(rest, "")
	match := func(d broker.DeadLetter) bool {
		return in(d) && (*all || (id != "" && d.MessageID == id) || (*reason != "" && d.Reason == *reason))
	}
	queues, err := a.deadLetterQueues(*queue, *workflows)
	if err != nil {
		return err
	}
	if action == broker.Drop && !*yes {
		if err := a.confirmDiscard(ctx, queues, match); err != nil {
			return err
		}
	}
	seen, done, err := a.scan(ctx, queues, 0, func(d broker.DeadLetter) broker.DLQAction {
		if match(d) {
			return action
		}
		return broker.Keep
	})
	moved, skipped := 0, 0
	for i, d := range seen {
		switch {
		case done[i] == broker.Drop:
			moved++
			fmt.Fprintf(a.stdout, "discarded %s from %s (reason %s): %s\n", d.MessageID, d.DLQ, d.Reason, preview(d.Body, 60))
		case done[i] == broker.Requeue:
			moved++
			fmt.Fprintf(a.stdout, "requeued %s to %s\n", d.MessageID, d.OriginalQueue)
		case match(d):
			skipped++
			fmt.Fprintf(a.stderr, "kept %s: it does not say which queue it came from\n", d.MessageID)
		}
	}
	verb := "requeued"
	if action == broker.Drop {
		verb = "discarded"
	}
	fmt.Fprintf(a.stderr, "%s %d dead letters\n", verb, moved)
	if err != nil {
		return fmt.Errorf("stopped after %d: %w (what was not confirmed is still in its dead-letter queue)", moved, err)
	}
	if moved == 0 && skipped == 0 {
		return fmt.Errorf("no dead letter matched in %s", strings.Join(queues, ", "))
	}
	return nil
}

// deadLettersIn is --namespace for dead letters: those sas found to be
// of the namespace (x-sas-namespace), or every one.
func (a *app) deadLettersIn(fs *flag.FlagSet, ns string) (func(broker.DeadLetter) bool, error) {
	namespaces, err := a.namespaceOf(fs, ns)
	if err != nil {
		return nil, err
	}
	return func(d broker.DeadLetter) bool { return namespaces == nil || d.Namespace == namespaces[0] }, nil
}

// confirmDiscard lists what a discard would drop and asks.
func (a *app) confirmDiscard(ctx context.Context, queues []string, match func(broker.DeadLetter) bool) error {
	seen, _, err := a.scan(ctx, queues, 0, func(broker.DeadLetter) broker.DLQAction { return broker.Keep })
	if err != nil {
		return err
	}
	n := 0
	for _, d := range seen {
		if match(d) {
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no dead letter matched in %s", strings.Join(queues, ", "))
	}
	fmt.Fprintf(a.stderr, "discard %d dead letters for good? [y/N] ", n)
	answer, _ := bufio.NewReader(a.stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		return fmt.Errorf("nothing discarded")
	}
	return nil
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String()
}

// preview is the start of a body on one line.
func preview(body []byte, n int) string {
	s := string(body)
	if !utf8.ValidString(s) {
		return fmt.Sprintf("(%d bytes, not UTF-8)", len(body))
	}
	return clip(strings.Join(strings.Fields(s), " "), n)
}

type deadLetterJSON struct {
	broker.DeadLetter
	Body string `json:"body"`
}

func deadLettersJSON(ds []broker.DeadLetter) []deadLetterJSON {
	out := make([]deadLetterJSON, len(ds))
	for i, d := range ds {
		out[i] = deadLetterJSON{d, string(d.Body)}
	}
	return out
}
