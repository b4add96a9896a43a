package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/orderfilter"
)

// maxListed is how many dead letters of one queue a page reads; in a
// namespace's view, it reads up to maxScanned to find as many of that
// namespace's.
const (
	maxListed  = 200
	maxScanned = 5000
)

// namespaceInputs are the inputs whose dead letters may be a namespace's:
// the entrances where sas learns a message's namespace from its
// publisher's grant (x-sas-namespace). Every other input's are the
// deployment's alone.
func namespaceInputs() []string { return []string{messages.SubmitQueue, messages.SignalsQueue} }

// inputsIn are the inputs whose dead letters the request may see.
func (s *server) inputsIn(ctx context.Context, rq *request) []string {
	if rq.everywhere() {
		return s.inputs(ctx)
	}
	return namespaceInputs()
}

// ours reports whether a dead letter is in the request's view.
func ours(rq *request, dl broker.DeadLetter) bool {
	return rq.everywhere() || dl.Namespace == rq.ns
}

// namespaceCounts counts the dead letters of the request's namespace in
// each input that may hold them (of the first maxScanned of each).
func (s *server) namespaceCounts(ctx context.Context, rq *request) ([]queueCount, bool) {
	conn, _, _ := s.broker()
	var out []queueCount
	for _, part := range s.dlqPartitions() {
		for _, in := range namespaceInputs() {
			qc := queueCount{Queue: in, Partition: part.name}
			seen, _, err := s.scan(ctx, part.prefix, in, maxScanned, keep)
			if err != nil {
				qc.Error = err.Error()
			}
			for _, dl := range seen {
				if ours(rq, dl) {
					qc.Count++
				}
			}
			out = append(out, qc)
		}
	}
	return out, conn != nil
}

// dlqPartition is a partition's name and queue prefix.
type dlqPartition struct{ name, prefix string }

// dlqPartitions are the partitions whose dead letters the console shows:
// every one of a partitioned deployment, else its own prefix alone.
func (s *server) dlqPartitions() []dlqPartition {
	if s.stores.Layout == nil {
		return []dlqPartition{{"", s.cfg.QueuePrefix}}
	}
	var out []dlqPartition
	for _, p := range s.stores.Layout.Partitions {
		out = append(out, dlqPartition{p.Name, p.QueuePrefix})
	}
	return out
}

// partitionParam reads the partition a dead letters path names
// (?partition=), answering 404 for one not in the layout: its name and
// queue prefix ("" and the console's own when the deployment is not
// partitioned; the first partition when none is named).
func (s *server) partitionParam(w http.ResponseWriter, r *http.Request, rq *request) (dlqPartition, bool) {
	parts := s.dlqPartitions()
	name := r.URL.Query().Get("partition")
	if name == "" {
		return parts[0], true
	}
	for _, p := range parts {
		if p.name != "" && p.name == name {
			return p, true
		}
	}
	s.fail(w, r, rq, http.StatusNotFound, "There is no partition "+orderfilter.Clip(name, 40)+".")
	return dlqPartition{}, false
}

// deadLetterCounts counts each input's dead letters; false when the
// console has no broker connection.
func (s *server) deadLetterCounts(ctx context.Context) ([]queueCount, bool) {
	_, _, inspect := s.broker()
	var out []queueCount
	for _, part := range s.dlqPartitions() {
		topo := broker.Topology{Prefix: part.prefix}
		for _, in := range s.inputs(ctx) {
			qc := queueCount{Queue: in, Partition: part.name}
			if inspect == nil {
				qc.Error = errNoBroker.Error()
			} else if n, err := inspect.Ready(ctx, topo.DeadLetterQueue(in)); err == nil {
				qc.Count = n
			} else if ae := (*amqp.Error)(nil); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				qc.Error = err.Error()
			}
			out = append(out, qc)
		}
	}
	return out, inspect != nil
}

type deadLettersData struct {
	Queues []queueCount
	Broker bool
	// Total sums every partition's, in a partitioned deployment.
	Total       int
	Partitioned bool
}

func (s *server) deadLetters(w http.ResponseWriter, r *http.Request, rq *request) {
	var d deadLettersData
	if rq.everywhere() {
		d.Queues, d.Broker = s.deadLetterCounts(r.Context())
	} else {
		d.Queues, d.Broker = s.namespaceCounts(r.Context(), rq)
	}
	d.Partitioned = s.stores.Layout != nil
	for _, q := range d.Queues {
		d.Total += q.Count
	}
	s.render(w, r, rq, http.StatusOK, "deadletters.html", "Dead letters", d)
}

type deadLetterView struct {
	broker.DeadLetter
	Body      string // as text, clipped
	Printable bool
}

type queueData struct {
	Queue   string
	Letters []deadLetterView
	Limit   int
	// Partition names the partition whose queue it is ("" unpartitioned).
	Partition string
}

func viewOf(dl broker.DeadLetter, clipAt int) deadLetterView {
	v := deadLetterView{DeadLetter: dl, Printable: utf8.Valid(dl.Body)}
	if v.Printable {
		v.Body = orderfilter.Clip(string(dl.Body), clipAt)
	} else {
		v.Body = fmt.Sprintf("(%d bytes, not UTF-8)", len(dl.Body))
	}
	return v
}

// queueParam reads the {queue} of a path: one of the inputs whose dead
// letters the request may see.
func (s *server) queueParam(w http.ResponseWriter, r *http.Request, rq *request) (string, bool) {
	q := r.PathValue("queue")
	if !slices.Contains(s.inputsIn(r.Context(), rq), q) {
		s.fail(w, r, rq, http.StatusNotFound, "There is no input queue "+orderfilter.Clip(q, 60)+".")
		return "", false
	}
	return q, true
}

// scan reads at most limit dead letters of one input's dead-letter
// queue, doing what decide says.
func (s *server) scan(ctx context.Context, prefix, queue string, limit int, decide func(broker.DeadLetter) broker.DLQAction) ([]broker.DeadLetter, []broker.DLQAction, error) {
	conn, pub, _ := s.broker()
	if conn == nil {
		return nil, nil, errNoBroker
	}
	return conn.ScanDLQ(ctx, pub, broker.Topology{Prefix: prefix}.DeadLetterQueue(queue), limit, decide)
}

// scanFor reads the dead letters of one input the request may see: up
// to maxListed of the queue, or in a namespace's view up to maxListed of
// that namespace's among the first maxScanned; decide acts on those alone.
func (s *server) scanFor(ctx context.Context, rq *request, prefix, queue string, decide func(broker.DeadLetter) broker.DLQAction) ([]broker.DeadLetter, []broker.DLQAction, error) {
	limit := maxListed
	if !rq.everywhere() {
		limit = maxScanned
	}
	listed := 0
	seen, done, err := s.scan(ctx, prefix, queue, limit, func(dl broker.DeadLetter) broker.DLQAction {
		if !ours(rq, dl) || listed >= maxListed {
			return broker.Keep
		}
		listed++
		return decide(dl)
	})
	var mine []broker.DeadLetter
	var acts []broker.DLQAction
	for i, dl := range seen {
		if ours(rq, dl) && len(mine) < maxListed {
			mine, acts = append(mine, dl), append(acts, done[i])
		}
	}
	return mine, acts, err
}

func keep(broker.DeadLetter) broker.DLQAction { return broker.Keep }

func (s *server) deadLetterQueue(w http.ResponseWriter, r *http.Request, rq *request) {
	q, ok := s.queueParam(w, r, rq)
	if !ok {
		return
	}
	part, ok := s.partitionParam(w, r, rq)
	if !ok {
		return
	}
	seen, _, err := s.scanFor(r.Context(), rq, part.prefix, q, keep)
	if err != nil {
		s.brokerError(w, r, rq, err)
		return
	}
	d := queueData{Queue: q, Limit: maxListed, Partition: part.name}
	for _, dl := range seen {
		d.Letters = append(d.Letters, viewOf(dl, 200))
	}
	s.render(w, r, rq, http.StatusOK, "queue.html", "Dead letters of "+q, d)
}

func (s *server) brokerError(w http.ResponseWriter, r *http.Request, rq *request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.logger.Error("console: dead letters", "path", r.URL.Path, "err", err)
	s.fail(w, r, rq, http.StatusServiceUnavailable, "The broker did not answer: "+err.Error())
}

// messageIDParam reads the {id} of a dead letter's path: a message id of
// printable characters.
func messageIDParam(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	ok := id != "" && len(id) <= 200 && strings.IndexFunc(id, func(c rune) bool { return !unicode.IsPrint(c) }) < 0
	return id, ok
}

// verbAction is what a dead letter's verb does, and the notice its
// redirect shows.
func verbAction(verb string) (broker.DLQAction, string, bool) {
	switch verb {
	case "requeue":
		return broker.Requeue, "requeued", true
	case "discard":
		return broker.Drop, "discarded", true
	}
	return broker.Keep, "", false
}

// deadLetterTarget reads a dead letter's path: its input queue, verb and
// message id, answering the request itself when one is not there.
func (s *server) deadLetterTarget(w http.ResponseWriter, r *http.Request, rq *request) (part dlqPartition, q, verb string, action broker.DLQAction, notice, id string, ok bool) {
	if q, ok = s.queueParam(w, r, rq); !ok {
		return
	}
	if part, ok = s.partitionParam(w, r, rq); !ok {
		return
	}
	verb = r.PathValue("verb")
	if action, notice, ok = verbAction(verb); !ok {
		s.notFound(w, r)
		return
	}
	if id, ok = messageIDParam(w, r); !ok {
		s.fail(w, r, rq, http.StatusNotFound, "There is no such dead letter.")
	}
	return
}

func (s *server) confirmDeadLetter(w http.ResponseWriter, r *http.Request, rq *request) {
	if !s.mayAct(w, r, rq) {
		return
	}
	part, q, verb, _, _, id, ok := s.deadLetterTarget(w, r, rq)
	if !ok {
		return
	}
	seen, _, err := s.scanFor(r.Context(), rq, part.prefix, q, keep)
	if err != nil {
		s.brokerError(w, r, rq, err)
		return
	}
	i := slices.IndexFunc(seen, func(d broker.DeadLetter) bool { return d.MessageID == id })
	if i < 0 {
		s.fail(w, r, rq, http.StatusNotFound, "There is no dead letter "+orderfilter.Clip(id, 60)+" in "+q+".")
		return
	}
	dl := viewOf(seen[i], 2000)
	details := []string{"Reason: " + dl.Reason + " " + dl.Detail, "From: " + dl.OriginalQueue, "Body: " + dl.Body}
	what := "It is published back to " + dl.OriginalQueue + " (confirmed by the broker before it leaves the dead letters); if it is still bad it comes back here."
	if verb == "discard" {
		what = "It is deleted for good."
	}
	s.render(w, r, rq, http.StatusOK, "confirm.html", strings.ToUpper(verb[:1])+verb[1:], confirmData{
		Question: fmt.Sprintf("%s dead letter %s of %s?", strings.ToUpper(verb[:1])+verb[1:], id, q),
		Details:  append(details, what, "Recorded as done by "+rq.user.Name+"."),
		Action:   "/dead-letters/" + q + "/" + id + "/" + verb + inPartition(part), Button: strings.ToUpper(verb[:1]) + verb[1:],
		Back: "/dead-letters/" + q + inPartition(part), Danger: verb == "discard",
	})
}

func (s *server) moveDeadLetter(w http.ResponseWriter, r *http.Request, rq *request) {
	part, q, verb, action, notice, id, ok := s.deadLetterTarget(w, r, rq)
	if !ok {
		return
	}
	seen, done, err := s.scanFor(r.Context(), rq, part.prefix, q, func(d broker.DeadLetter) broker.DLQAction {
		if d.MessageID == id {
			return action
		}
		return broker.Keep
	})
	moved := 0
	var reason string
	for i, d := range seen {
		if done[i] == action {
			moved++
			reason = d.Reason
		}
	}
	if moved > 0 {
		detail := fmt.Sprintf("%d message(s), reason %s", moved, reason)
		if rerr := s.store.RecordOperatorAction(r.Context(), "dead letter "+verb, partitionLabel(part)+q+"/"+id, detail, claimedBy(rq)); rerr != nil {
			s.logger.Error("console: record operator action", "err", rerr)
		}
		s.logger.Info("console: dead letter "+verb, "user", rq.user.Name, "queue", q, "message_id", id, "count", moved)
	}
	if err != nil {
		s.brokerError(w, r, rq, err)
		return
	}
	if moved == 0 {
		s.fail(w, r, rq, http.StatusNotFound, "There is no dead letter "+orderfilter.Clip(id, 60)+" in "+q+" (moved already?).")
		return
	}
	s.redirect(w, r, "/dead-letters/"+q+inPartition(part), notice)
}

// partitionLabel names a partition's queue in the operators' record.
func partitionLabel(p dlqPartition) string {
	if p.name == "" {
		return ""
	}
	return p.name + ":"
}

// inPartition is the query naming a partition's dead letters ("" for
// an unpartitioned deployment's).
func inPartition(p dlqPartition) string {
	if p.name == "" {
		return ""
	}
	return "?partition=" + url.QueryEscape(p.name)
}
