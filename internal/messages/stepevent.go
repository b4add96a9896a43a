package messages

import "time"

// TypeStepEvent is the AMQP type of a StepEvent.
const TypeStepEvent = "sas.step_event"

// The events a StepEvent tells (StepEvent.Event): its routing key on the
// status exchange is step.EVENT (StepEventKey), so that a subscriber binds
// step.# for all of them, or step.awaiting for one.
const (
	StepClaimed     = "claimed"     // an attempt was claimed and sent to its agent
	StepAwaiting    = "awaiting"    // it waits for a signal (Wait), or for its child order
	StepProcessed   = "processed"   // an action ended well
	StepCompensated = "compensated" // a compensation ended well: its action is undone
	StepFailed      = "failed"      // it failed for good (Reason says why)
	StepSkipped     = "skipped"     // it ended doing nothing
	StepCancelled   = "cancelled"   // it will not run
)

// StepEvent tells a subscriber that a step moved: published on the status
// exchange with routing key step.EVENT, for every order, while some queue
// is bound for it. Status events (one-word routing keys) say where the
// order is; step events say where each of its steps is.
type StepEvent struct {
	SchemaVersion int    `json:"schema_version"`
	OrderID       string `json:"order_id"`
	Step          int    `json:"step"`
	// Name is the step's id, or its action.
	Name string `json:"name"`
	// Kind is action or compensation.
	Kind  string `json:"kind"`
	Event string `json:"event"`
	// State is the step's state now (process_state).
	State string `json:"state"`
	// Attempt is the step's attempt (0 for a step sas performed itself
	// with no claim: a wait that began, a timer that ended).
	Attempt int `json:"attempt"`
	// Wait is, for a step awaiting a signal, the signal's name.
	Wait string    `json:"wait,omitempty"`
	At   time.Time `json:"at"`
	// Reason says why it moved, as the order's history does.
	Reason string `json:"reason,omitempty"`
}

// StepEventKey is the routing key of a step event.
func StepEventKey(event string) string { return "step." + event }

// Type implements Message.
func (StepEvent) Type() string { return TypeStepEvent }

// Validate implements Message.
func (e StepEvent) Validate() error {
	if e.SchemaVersion != SchemaVersion {
		return reject(ReasonUnsupportedVersion, "schema_version %d is not supported", e.SchemaVersion)
	}
	if err := checkID("order_id", e.OrderID); err != nil {
		return err
	}
	if e.Step < 1 || e.Step > MaxStep {
		return reject(ReasonInvalidValue, "step %d is outside 1..%d", e.Step, MaxStep)
	}
	if err := checkName("name", e.Name, 100); err != nil {
		return err
	}
	switch e.Kind {
	case "action", "compensation":
	default:
		return reject(ReasonInvalidValue, "kind %q is not action or compensation", truncate(e.Kind))
	}
	switch e.Event {
	case StepClaimed, StepAwaiting, StepProcessed, StepCompensated, StepFailed, StepSkipped, StepCancelled:
	default:
		return reject(ReasonInvalidValue, "event %q is not a step event", truncate(e.Event))
	}
	if err := checkName("state", e.State, 20); err != nil {
		return err
	}
	if e.Attempt < 0 {
		return reject(ReasonInvalidValue, "attempt %d is negative", e.Attempt)
	}
	if e.Wait != "" {
		if err := checkName("wait", e.Wait, 100); err != nil {
			return err
		}
	}
	if len(e.Reason) > maxReasonLen {
		return reject(ReasonInvalidValue, "reason is %d bytes, limit %d", len(e.Reason), maxReasonLen)
	}
	return checkTime("at", e.At)
}

// DecodeStepEvent decodes and validates a StepEvent body.
func DecodeStepEvent(body []byte) (StepEvent, error) {
	return decodeValid[StepEvent](body, []string{"order_id", "step", "event", "at"}, nil, true)
}
