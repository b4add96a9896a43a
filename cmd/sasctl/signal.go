package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
)

// ordersSignal sends a signal for an order through the signals queue
// (as an application does), after checking that the order would take it
// and its payload meets the wait's schema (as the API does), then says
// what became of it.
func (a *app) ordersSignal(ctx context.Context, args []string) error {
	fs := a.flags()
	payload := fs.String("payload", "", "the signal's payload, the wait step's result: any JSON value inline, or @FILE (default: none)")
	sigID := fs.String("id", "", "the signal's id: the same id twice is applied once (default: a new one)")
	as := fs.String("as", "", "the name recorded as the signal's sender (default: $USER)")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait to learn what became of the signal")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 2 {
		return a.usageError(fs, "give an order id and a signal name")
	}
	id, ok := messages.CanonicalID(rest[0])
	if !ok {
		return fmt.Errorf("%q is not an order id (a UUID)", rest[0])
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: *sigID, OrderID: id, Name: rest[1], By: claimedName(*as)}
	if sig.SignalID == "" {
		sig.SignalID = messages.NewID()
	}
	if *payload != "" {
		if sig.Payload, err = signalPayload(*payload); err != nil {
			return err
		}
	}
	body, err := messages.Encode(sig)
	if err != nil {
		return fmt.Errorf("not a signal: %w", err)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	check, err := store.SignalCheckPayload(ctx, id, sig.Name, sig.Payload)
	if err != nil {
		return err
	}
	if check.Outcome != "" {
		return fmt.Errorf("not sent: %s (%s)", check.Detail, check.Outcome)
	}
	conn, pub, topo, err := a.openBroker(ctx, messages.SignalsQueue)
	if err != nil {
		return err
	}
	defer conn.Close()
	queue := topo.Queue(messages.SignalsQueue)
	for attempt := range 5 {
		err = pub.Publish(ctx, "", queue, amqp.Publishing{ContentType: messages.ContentType, Type: messages.TypeSignal,
			MessageId: sig.SignalID, Timestamp: time.Now(), Headers: amqp.Table{"schema_version": int32(messages.SignalVersion)}, Body: body})
		if err == nil || !errors.Is(err, broker.ErrUnconfirmed) || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("signal %s not sent: %w", sig.SignalID, err)
	}
	deadline := time.Now().Add(*wait)
	for {
		step, taken, err := store.SignalTaken(ctx, id, sig.SignalID)
		if err != nil {
			return err
		}
		switch {
		case taken && step > 0:
			fmt.Fprintf(a.stdout, "order %s: signal %s (id %s) ended step %d\n", id, sig.Name, sig.SignalID, step)
			return nil
		case taken:
			fmt.Fprintf(a.stdout, "order %s: signal %s (id %s) kept: its wait has not begun\n", id, sig.Name, sig.SignalID)
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("signal %s (id %s) sent, but no scheduler took it within %v: a scheduler may be down, or it was refused "+
				"(sasctl dlq list %s says why)", sig.Name, sig.SignalID, *wait, messages.SignalsQueue)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// signalPayload reads a signal's --payload: any JSON value inline, or
// @FILE.
func signalPayload(v string) (json.RawMessage, error) {
	raw := []byte(v)
	if file, ok := strings.CutPrefix(v, "@"); ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--payload %s: %w", v, err)
		}
		raw = b
	}
	if !json.Valid(raw) {
		return nil, fmt.Errorf("--payload %s is not JSON (write a JSON value inline, or @FILE)", clip(v, 60))
	}
	return raw, nil
}
