// Command submit100 submits 100 orders of the built-in order workflow with
// the Go client, waits for each, and prints its outcome. It reads the
// broker from SAS_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/)
// and SAS_QUEUE_PREFIX (default sas.), like sas's own services: run it
// beside `make demo DEMO_FLAGS=--keep`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"time"

	"sas/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "submit100:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	url := os.Getenv("SAS_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	c, err := client.Connect(ctx, client.Config{URL: url, QueuePrefix: os.Getenv("SAS_QUEUE_PREFIX")})
	if err != nil {
		return err
	}
	defer c.Close()

	type outcome struct {
		id     string
		status string
		err    error
	}
	outcomes := make([]outcome, 100)
	var wg sync.WaitGroup
	for i := range outcomes {
		wg.Go(func() {
			id, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: map[string]any{
				"customer": fmt.Sprintf("customer %d", i+1),
				"items":    []map[string]any{{"sku": "SKU-RED-1", "qty": 1 + i%3}},
				"amount":   1000 + 10*i,
				"currency": "EUR",
			}})
			if err != nil {
				outcomes[i] = outcome{id: id, err: err}
				return
			}
			st, err := c.Await(ctx, id)
			outcomes[i] = outcome{id: id, status: st.Status, err: err}
		})
	}
	wg.Wait()
	counts := map[string]int{}
	for i, o := range outcomes {
		switch {
		case o.err != nil:
			fmt.Printf("%3d  %s  %v\n", i+1, o.id, o.err)
			counts["unknown"]++
		default:
			fmt.Printf("%3d  %s  %s\n", i+1, o.id, o.status)
			counts[o.status]++
		}
	}
	fmt.Printf("\n%d completed, %d failed, %d held in error, %d not known\n",
		counts["completed"], counts["failed"], counts["error"], counts["unknown"])
	return nil
}
