package messages

// RepliesQueue is the unprefixed name of the queue agents send StepReplies
// to and schedulers consume.
const RepliesQueue = "replies"

// RequestsQueue is the unprefixed name of an agent kind's request queue:
// schedulers send it the StepRequests of the kind's steps.
func RequestsQueue(kind string) string { return "agent." + kind }

// SubmitQueue is the unprefixed name of the queue applications send
// SubmitOrders to and submitters consume.
const SubmitQueue = "submit"

// SignalsQueue is the unprefixed name of the queue signals (Signal) are
// sent to and schedulers consume.
const SignalsQueue = "signals"

// Inputs are the unprefixed names of every queue sas reads, each with a
// dead-letter queue of its own that sasctl dlq and the console list: the
// submit queue, the replies queue, the signals queue (signals and
// callbacks) and the request queue of each agent kind in kinds.
func Inputs(kinds []string) []string {
	out := []string{SubmitQueue, RepliesQueue, SignalsQueue}
	for _, k := range kinds {
		if k != "" {
			out = append(out, RequestsQueue(k))
		}
	}
	return out
}
