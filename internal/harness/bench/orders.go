package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sas/internal/harness/sample"
	"sas/internal/messages"
	"sas/internal/workflow"
)

// orders makes the benchmark's orders: demo orders of a built-in
// workflow, or the orders of a graph scenario.
type orders struct {
	workflow string
	payload  json.RawMessage
	graph    *graphScenario
}

// graphScenario is a benchmark of a graph workflow: its file (the
// built-in workflows and the graphs), the payload of its orders and the
// remote service's latency per action.
type graphScenario struct {
	payload json.RawMessage
	latency map[string]int // action -> ms
}

// graphsYAML are the graph scenarios' workflows, on the built-in agent
// kinds so that the benchmark's queues and agents are the usual ones.
const graphsYAML = `
  # fanout: one step, then five branches at once (200 ms each), then a join.
  - name: fanout
    steps:
      - {action: fan_start, agent: inventory}
      - {action: fan_b1, agent: payment, needs: [fan_start]}
      - {action: fan_b2, agent: payment, needs: [fan_start]}
      - {action: fan_b3, agent: payment, needs: [fan_start]}
      - {action: fan_b4, agent: payment, needs: [fan_start]}
      - {action: fan_b5, agent: payment, needs: [fan_start]}
      - {action: fan_join, agent: shipping, needs: [fan_b1, fan_b2, fan_b3, fan_b4, fan_b5]}
  # foreach: one step per item of a list of 100, 20 at once (50 ms each).
  - name: foreach
    steps:
      - {action: each_item, agent: shipping, for_each: payload.items, max_parallel: 20, max_items: 100}
`

func graphScenarios() map[string]*graphScenario {
	items := make([]string, 100)
	for i := range items {
		items[i] = fmt.Sprint(i)
	}
	return map[string]*graphScenario{
		"fanout": {payload: json.RawMessage(`{"n":1}`),
			latency: map[string]int{"fan_b1": 200, "fan_b2": 200, "fan_b3": 200, "fan_b4": 200, "fan_b5": 200}},
		"foreach": {payload: json.RawMessage(`{"items":[` + strings.Join(items, ",") + `]}`),
			latency: map[string]int{"each_item": 50}},
	}
}

// newOrders checks that name is a built-in workflow that takes the demo
// order's payload, or a graph scenario.
func newOrders(name string) (*orders, error) {
	if g, ok := graphScenarios()[name]; ok {
		return &orders{workflow: name, payload: g.payload, graph: g}, nil
	}
	if err := sample.Check(workflow.Builtin(), name, nil); err != nil {
		return nil, fmt.Errorf("%w (or a graph scenario: fanout, foreach)", err)
	}
	return &orders{workflow: name}, nil
}

// setUp writes a graph scenario's workflows file into dir and returns the
// services' environment for it and the remote's faults, each action at
// latency ms unless the scenario says otherwise; a list's run needs
// neither file nor more than the one latency.
func (o *orders) setUp(dir string, latency int) (env []string, faults string, err error) {
	faults = fmt.Sprintf(`{"*":{"latency_min_ms":%d,"latency_max_ms":%d}`, latency, latency)
	if o.graph == nil {
		return nil, faults + "}", nil
	}
	for action, ms := range o.graph.latency {
		faults += fmt.Sprintf(`,%q:{"latency_min_ms":%d,"latency_max_ms":%d}`, action, ms, ms)
	}
	file := filepath.Join(dir, "bench-workflows.yaml")
	if err := os.WriteFile(file, append(workflow.BuiltinYAML(), graphsYAML...), 0o644); err != nil {
		return nil, "", err
	}
	return []string{"SAS_WORKFLOWS_FILE=" + file}, faults + "}", nil
}

func (o *orders) next() messages.SubmitOrder {
	now := time.Now().UTC()
	payload := o.payload
	if payload == nil {
		payload = sample.DemoPayload()
	}
	return messages.SubmitOrder{SchemaVersion: messages.SubmitOrderVersion, OrderID: messages.NewID(), Workflow: o.workflow,
		Payload: payload, PlacedAt: &now}
}
