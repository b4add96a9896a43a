// Package sample makes sample orders for the tools that post them
// without an application (sasctl submit --count, sasctl dev, the
// benchmark): a plausible random demo order, checked against its
// workflow.
package sample

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"

	"sas/internal/messages"
	"sas/internal/workflow"
)

// DemoPayload is a plausible random order of the demo workflows.
func DemoPayload() []byte {
	customers := []string{"ACME Ltd", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries"}
	skus := []string{"SKU-RED-1", "SKU-BLUE-2", "SKU-GREEN-3", "SKU-WIDGET-4", "SKU-GADGET-5"}
	items := make([]messages.Item, 1+rand.IntN(3))
	var amount int64
	for i := range items {
		items[i] = messages.Item{SKU: skus[rand.IntN(len(skus))], Qty: 1 + rand.Int64N(5)}
		amount += items[i].Qty * (100 + rand.Int64N(9900))
	}
	b, _ := json.Marshal(messages.OrderPayload{Customer: customers[rand.IntN(len(customers))], Items: items, Amount: amount, Currency: "EUR"})
	return b
}

// ErrDemoPayload: the workflow does not take the demo order's payload;
// give it one of its own.
var ErrDemoPayload = errors.New("the workflow does not take the demo order's payload")

// Check reports why the workflow name of reg cannot take payload (nil:
// the demo order's, and then the error wraps ErrDemoPayload).
func Check(reg *workflow.Registry, name string, payload []byte) error {
	wf, ok := reg.Lookup(name)
	if !ok {
		return fmt.Errorf("unknown workflow %q (its file's workflows are %s)", name, strings.Join(reg.Names(), ", "))
	}
	probe := payload
	if probe == nil {
		probe = DemoPayload()
	}
	err := wf.CheckPayload(probe)
	var pe *workflow.PayloadError
	if errors.As(err, &pe) && payload == nil {
		return fmt.Errorf("%w (workflow %s: %v)", ErrDemoPayload, wf.Name, err)
	}
	return err
}
