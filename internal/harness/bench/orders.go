package bench

import (
	"time"

	"sas/internal/harness/sample"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// orders makes the benchmark's orders: demo orders of a built-in
// workflow.
type orders struct {
	workflow string
}

// newOrders checks that name is a built-in workflow that takes the demo
// order's payload.
func newOrders(name string) (*orders, error) {
	if err := sample.Check(workflow.Builtin(), name, nil); err != nil {
		return nil, err
	}
	return &orders{workflow: name}, nil
}

func (o *orders) next() messages.SubmitOrder {
	now := time.Now().UTC()
	return messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: o.workflow,
		Payload: sample.DemoPayload(), PlacedAt: &now}
}
