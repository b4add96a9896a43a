package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"sas/internal/broker"
	"sas/internal/messages"
	"sas/internal/statestore"
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
	wf := fs.String("workflow", "", "name the order by business key: the running order of this workflow whose search attributes --where gives")
	var where stringList
	fs.Var(&where, "where", "with --workflow, a search attribute's value, NAME=VALUE (a number, true or false, else text); again for more")
	all := fs.Bool("all", false, "with --workflow, send it to every running order that matches")
	namespace := namespaceFlag(fs)
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	namespaces, err := a.namespaceOf(fs, *namespace)
	if err != nil {
		return err
	}
	byKey := *wf != "" || len(where) > 0
	if byKey && len(rest) != 1 || !byKey && len(rest) != 2 {
		return a.usageError(fs, "give an order id and a signal name, or --workflow W --where NAME=VALUE and a signal name")
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: *sigID, Name: rest[len(rest)-1], By: claimedName(*as)}
	if sig.SignalID == "" {
		sig.SignalID = messages.NewID()
	}
	if *payload != "" {
		if sig.Payload, err = signalPayload(*payload); err != nil {
			return err
		}
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	var ids []string
	if byKey {
		key := messages.Signal{SchemaVersion: messages.SignalVersion, SignalID: sig.SignalID, Workflow: *wf, Where: map[string]any{},
			Name: sig.Name, All: *all}
		for _, w := range where {
			k, v, ok := strings.Cut(w, "=")
			if !ok {
				return a.usageError(fs, "--where %q: write NAME=VALUE", w)
			}
			key.Where[k] = keyValue(v)
		}
		if err := key.Validate(); err != nil {
			return fmt.Errorf("not a signal: %w", err)
		}
		limit := 2
		if *all {
			limit = 1000
		}
		if ids, err = store.OrdersByKeyIn(ctx, *wf, key.Where, limit, namespaces); err != nil {
			return err
		}
		switch {
		case len(ids) == 0:
			return fmt.Errorf("not sent: no running order of workflow %s has those search attribute values (%s)", *wf, statestore.SignalNoMatch)
		case len(ids) > 1 && !*all:
			return fmt.Errorf("not sent: several running orders of workflow %s have those search attribute values; name one by id, or give --all (%s)",
				*wf, statestore.SignalAmbiguous)
		}
	} else {
		id, ok := messages.CanonicalID(rest[0])
		if !ok {
			return fmt.Errorf("%q is not an order id (a UUID)", rest[0])
		}
		if err := orderIn(ctx, store, id, namespaces); err != nil {
			return err
		}
		ids = []string{id}
	}
	var checked []messages.Signal
	for _, id := range ids {
		one := sig
		one.OrderID = id
		if byKey {
			one.SignalID = sig.SignalID + ":" + id
		}
		if _, err := messages.Encode(one); err != nil {
			return fmt.Errorf("not a signal: %w", err)
		}
		check, err := store.SignalCheckPayload(ctx, id, one.Name, one.Payload)
		if err != nil {
			return err
		}
		if check.Outcome != "" {
			return fmt.Errorf("not sent: order %s: %s (%s)", id, check.Detail, check.Outcome)
		}
		checked = append(checked, one)
	}
	conn, pub, topo, err := a.openBroker(ctx, messages.SignalsQueue)
	if err != nil {
		return err
	}
	defer conn.Close()
	for _, one := range checked {
		if err := a.sendSignal(ctx, store, pub, topo.Queue(messages.SignalsQueue), one, *wait); err != nil {
			return err
		}
	}
	return nil
}

// keyValue reads a --where value: a number, true or false, else text.
func keyValue(v string) any {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f
	}
	if b, err := strconv.ParseBool(v); err == nil && (v == "true" || v == "false") {
		return b
	}
	return v
}

// sendSignal publishes one checked signal and says what became of it.
func (a *app) sendSignal(ctx context.Context, store *statestore.Store, pub *broker.Publisher, queue string, sig messages.Signal, wait time.Duration) error {
	body, err := messages.Encode(sig)
	if err != nil {
		return fmt.Errorf("not a signal: %w", err)
	}
	id := sig.OrderID
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
	deadline := time.Now().Add(wait)
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
				"(sasctl dlq list %s says why)", sig.Name, sig.SignalID, wait, messages.SignalsQueue)
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
