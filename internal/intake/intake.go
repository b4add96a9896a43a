// Package intake turns a submitted order into the order the state store
// writes: the checks and the form every way in (the submit queue, the
// HTTP API) gives an order alike, so that the same order sent both ways
// is the same order.
package intake

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"sas/internal/messages"
	"sas/internal/service"
	"sas/internal/statestore"
	"sas/internal/workflow"
)

// Reasons an order is refused, beside those of messages.
const (
	ReasonConflict        = "conflict"
	ReasonUnknownWorkflow = "unknown_workflow"
)

// Refusal is why an order cannot be taken: a reason a program branches
// on and a detail a person reads.
type Refusal struct {
	Reason, Detail string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Detail }

// Prepare checks o against its workflow in reg (known, and run in
// namespace ns; payload valid for its schema, for_each lists within
// bounds) and returns the order to write, with its search attributes; a
// *Refusal when it cannot be taken.
// stepTimeout, when set, replaces every step's budget; actor is who
// writes it, as the history records.
func Prepare(reg *workflow.Registry, o messages.SubmitOrder, ns string, stepTimeout time.Duration, actor string) (statestore.NewOrder, error) {
	wf, ok := reg.Lookup(o.Workflow)
	if !ok || !wf.In(ns) {
		// A workflow of other namespaces does not exist in this one.
		return statestore.NewOrder{}, &Refusal{ReasonUnknownWorkflow, fmt.Sprintf("workflow %q is not defined (known: %v)", o.Workflow, reg.NamesIn(ns))}
	}
	payload := o.PayloadJSON()
	// Decoded once: for the schema and for the canonical form's hash.
	value, err := checkPayload(wf, payload)
	if err != nil {
		return statestore.NewOrder{}, err
	}
	hash := sha256.Sum256(o.CanonicalWith(value))
	var own time.Duration
	if o.Deadline != "" {
		if own, err = messages.ParseDuration(o.Deadline); err != nil {
			return statestore.NewOrder{}, &Refusal{messages.ReasonInvalidValue, err.Error()}
		}
	}
	deadline, onDeadline := wf.Deadline(own)
	return statestore.NewOrder{
		OrderID: o.OrderID, Workflow: wf.Name, WorkflowVersion: wf.Version(), Payload: payload, Priority: o.Priority, ReplyTo: o.ReplyTo,
		PlacedAt: o.PlacedAt, StartAt: o.StartAt, PayloadHash: hash[:], Steps: statestore.StepsOf(wf, stepTimeout), Actor: actor,
		FailurePolicy: wf.Policy, Attributes: Attributes(wf, payload), Key: Key(wf, payload), Deadline: deadline, OnDeadline: onDeadline,
	}, nil
}

// CheckPayload checks a payload as a submit's is checked (JSON within
// bounds, valid for wf's schema, its for_each lists within bounds): a
// re-run's corrected payload must be one its workflow takes. The error
// is a *Refusal.
func CheckPayload(wf workflow.Workflow, payload []byte) error {
	if err := messages.CheckJSON(payload, messages.MaxPayloadBytes); err != nil {
		return &Refusal{messages.ReasonInvalidPayload, err.Error()}
	}
	_, err := checkPayload(wf, payload)
	return err
}

func checkPayload(wf workflow.Workflow, payload []byte) (any, error) {
	value, err := messages.PayloadValue(payload)
	if err == nil {
		err = wf.CheckPayloadValue(value)
	}
	if err == nil {
		err = wf.CheckForEach(payload)
	}
	if err != nil {
		var pe *workflow.PayloadError
		if errors.As(err, &pe) {
			return nil, &Refusal{messages.ReasonInvalidPayload, fmt.Sprintf("at %s: %s", cmp.Or(pe.Pointer, "/"), pe.Detail)}
		}
		return nil, &Refusal{messages.ReasonInvalidPayload, err.Error()}
	}
	return value, nil
}

// Rerun re-runs an order held in error with a corrected payload, as an
// operator asks through the API or the console: the payload is checked
// against the order's workflow in reg as a submit's is (a *Refusal when
// the workflow is not there or the payload is refused), its search
// attributes are read from it, and the store keeps the payload it had
// (statestore.Rerun). It returns the steps put back to work.
func Rerun(ctx context.Context, store *statestore.Store, reg *workflow.Registry, orderID string, step int, payload []byte, actor string) ([]int, error) {
	d, err := store.GetOrder(ctx, orderID)
	if err != nil {
		return nil, err
	}
	wf, ok := reg.Lookup(d.Order.Workflow)
	if !ok {
		return nil, &Refusal{ReasonUnknownWorkflow, fmt.Sprintf("workflow %q is not in this service's workflows file: its schema cannot be checked", d.Order.Workflow)}
	}
	if err := CheckPayload(wf, payload); err != nil {
		return nil, err
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, payload); err != nil {
		return nil, &Refusal{messages.ReasonInvalidPayload, err.Error()}
	}
	return store.Rerun(ctx, orderID, step, compact.Bytes(), Attributes(wf, compact.Bytes()), actor)
}

// Key is the order's concurrency key (wf's concurrency_key over
// payload), nil when wf declares none.
func Key(wf workflow.Workflow, payload []byte) *statestore.ConcurrencyKey {
	k, ok := wf.Key(payload)
	if !ok {
		return nil
	}
	return &statestore.ConcurrencyKey{Key: k, MaxPerKey: wf.MaxPerKey}
}

// Attributes are wf's search attributes read from payload, as the state
// store keeps them.
func Attributes(wf workflow.Workflow, payload []byte) []statestore.Attribute {
	vals := wf.Attributes(payload)
	if len(vals) == 0 {
		return nil
	}
	out := make([]statestore.Attribute, 0, len(vals))
	for _, v := range vals {
		out = append(out, Attribute(v.Name, v.Value))
	}
	return out
}

// Attribute is a value of a search attribute (a string, float64, bool or
// time.Time) as the state store keeps it.
func Attribute(name string, v any) statestore.Attribute {
	a := statestore.Attribute{Name: name}
	switch x := v.(type) {
	case string:
		a.Text = &x
	case float64:
		a.Num = &x
	case bool:
		a.Bool = &x
	case time.Time:
		a.Time = &x
	}
	return a
}

// StoreVersions records the version of every workflow in the file before
// any order names one, retrying while the database is unreachable.
func StoreVersions(ctx context.Context, store *statestore.Store, workflows *workflow.Registry, me string, logger *slog.Logger) error {
	var vs []statestore.WorkflowVersion
	for _, wf := range workflows.All() {
		vs = append(vs, statestore.WorkflowVersion{Name: wf.Name, Version: wf.Version(), Definition: wf.Definition(), CreatedBy: me})
	}
	return service.RetryDB(ctx, logger, "storing the workflow versions", func() error { return store.StoreWorkflowVersions(ctx, vs) })
}
