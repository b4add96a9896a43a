package api

import (
	"context"
	"sas/internal/batch"
	"sas/internal/broker"
	"sas/internal/statestore"
)

// part is what the API keeps for one partition of the deployment (in a
// deployment of one state store, for that store): its store, its queues'
// prefix, the hub of its status events and the batcher of the submits
// written there. An order's routes go to the partition owning its id's
// bucket (s.stores.Index); lists merge every partition's (s.stores).
type part struct {
	name    string
	store   *statestore.Store
	topo    broker.Topology
	hub     *hub
	inserts *batch.Batcher[statestore.NewOrder, statestore.InsertOutcome]
}

// partOf is the partition holding order id.
func (s *server) partOf(ctx context.Context, id string) *part {
	return s.parts[s.stores.Index(ctx, id)]
}
