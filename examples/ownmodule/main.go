// Command ownmodule is an application in a module of its own that uses
// the sas Go client, as yours will: its go.mod requires the module sas
// and replaces it with a checkout of sas (../.. here), since sas is not
// fetched from a module proxy. It submits one order of the built-in
// single workflow, waits for its outcome and prints it, with the reason
// when it did not complete. It reads the broker from SAS_AMQP_URL
// (default amqp://guest:guest@127.0.0.1:5672/) and SAS_QUEUE_PREFIX
// (default sas.).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"sas/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ownmodule:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	id, err := c.Submit(ctx, client.Order{Workflow: "single", Payload: map[string]any{
		"customer": "a customer of another module", "items": []map[string]any{{"sku": "SKU-1", "qty": 1}}, "amount": 100, "currency": "EUR"}})
	if err != nil {
		return err
	}
	st, err := c.Await(ctx, id)
	if err != nil {
		return err
	}
	fmt.Printf("order %s %s", id, st.Status)
	if st.Reason != "" {
		fmt.Printf(" (%s at %s: %s)", st.Reason, st.FailedStep, st.Detail)
	}
	fmt.Println()
	return nil
}
