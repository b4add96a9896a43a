package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"sas/client"
)

// An application submits an order of the built-in order workflow and
// waits for its outcome.
func ExampleClient_Await() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: os.Getenv("SAS_AMQP_URL"), QueuePrefix: os.Getenv("SAS_QUEUE_PREFIX")})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	id, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: map[string]any{
		"customer": "ACME Ltd", "items": []map[string]any{{"sku": "SKU-1", "qty": 2}}, "amount": 1999, "currency": "EUR"}})
	if err != nil {
		log.Fatal(err)
	}
	st, err := c.Await(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(st.Status, len(st.Results) > 0)
	// Output: completed true
}

// A submit the submitter refuses is reported with the dead letter's
// reason.
func ExampleRejectedError() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: os.Getenv("SAS_AMQP_URL"), QueuePrefix: os.Getenv("SAS_QUEUE_PREFIX")})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	id, err := c.Submit(ctx, client.Order{Workflow: "order", Payload: map[string]any{"customer": "ACME Ltd"}})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Await(ctx, id)
	if rej, ok := err.(*client.RejectedError); ok {
		fmt.Println(rej.Reason)
	}
	// Output: invalid_payload
}

// Watch follows an order's status events until it ends.
func ExampleClient_Watch() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Connect(ctx, client.Config{URL: os.Getenv("SAS_AMQP_URL"), QueuePrefix: os.Getenv("SAS_QUEUE_PREFIX")})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	id, err := c.Submit(ctx, client.Order{Workflow: "single", Payload: map[string]any{
		"customer": "ACME Ltd", "items": []map[string]any{{"sku": "SKU-1", "qty": 1}}, "amount": 500, "currency": "EUR"}})
	if err != nil {
		log.Fatal(err)
	}
	for st := range c.Watch(ctx, id) {
		fmt.Println(st.Status)
	}
	// Output:
	// received
	// processing
	// completed
}
