package main

import (
	"context"
	"fmt"
	"time"

	"sas/internal/messages"
	"sas/internal/statestore"
)

// stepsCallback ends (complete, fail) or holds open (heartbeat) the step
// a step token names, as the step's service would by calling back: the
// same door as the signals queue and the API (statestore.Callback), the
// same fence, and the same refusals.
func (a *app) stepsCallback(ctx context.Context, name string, args []string) error {
	fs := a.flags()
	result := fs.String("result", "", "for complete: the step's result, a JSON object inline or @FILE (default: none)")
	why := fs.String("error", "", "for fail: why the step failed (required)")
	id := fs.String("id", "", "for complete and fail: the callback's id, applied once (default: callback:STEP.ATTEMPT:NAME, so a repeat is a duplicate)")
	as := fs.String("as", "", "the name recorded in the history as who called back (default: $USER)")
	rest, err := a.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return a.usageError(fs, "give the step's token (the Sas-Step-Token of the call its service answered 202 Accepted)")
	}
	sig := messages.Signal{SchemaVersion: messages.SignalVersion, Token: rest[0], Name: name, SignalID: *id, Error: *why}
	if *result != "" {
		if name != messages.CallbackComplete {
			return a.usageError(fs, "--result is for complete")
		}
		if sig.Payload, err = signalPayload(*result); err != nil {
			return err
		}
	}
	if name != messages.CallbackFail && *why != "" {
		return a.usageError(fs, "--error is for fail")
	}
	if err := sig.Validate(); err != nil {
		return fmt.Errorf("not a callback: %w", err)
	}
	store, closeStore, err := a.store(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	out, err := store.Callback(ctx, statestore.Callback{Token: sig.Token, Name: name, SignalID: sig.SignalID, Result: sig.Payload,
		Error: sig.Error, Actor: "sasctl:" + claimedName(*as), Notify: true})
	if err != nil {
		return err
	}
	if out.Outcome != statestore.SignalApplied {
		return fmt.Errorf("nothing changed: %s (%s)", out.Detail, out.Outcome)
	}
	switch name {
	case messages.CallbackHeartbeat:
		fmt.Fprintf(a.stdout, "order %s step %d attempt %d: held open until %s\n", out.OrderID, out.Step, out.Attempt,
			out.CompleteBy.UTC().Format(time.RFC3339))
	default:
		status := ""
		if out.OrderStatus != "" {
			status = "; the order is " + out.OrderStatus
		}
		fmt.Fprintf(a.stdout, "order %s step %d attempt %d: %s%s\n", out.OrderID, out.Step, out.Attempt, map[string]string{
			messages.CallbackComplete: "completed", messages.CallbackFail: "failed"}[name], status)
	}
	return nil
}
