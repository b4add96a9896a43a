package main

import (
	"context"
	"fmt"
	"time"

	"sas/internal/broker"
	"sas/internal/messages"
)

// alerts tail consumes the durable alerts queue and prints each operator
// alert, acking it once printed.
func (a *app) alerts(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "tail" {
		fmt.Fprintf(a.stderr, "sasctl alerts: the command is \"alerts tail\"\n\n%s", usage)
		return errUsage
	}
	fs := a.flags("alerts tail")
	count := fs.Int("count", 0, "stop after this many alerts (0: follow until interrupted)")
	timeout := fs.Duration("timeout", 0, "stop after this long (0: no limit)")
	if err := a.parse(fs, args[1:]); err != nil {
		return err
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	conn, pub, topo, err := a.openBroker(ctx, broker.AlertsInput)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer pub.Close()
	ch, err := conn.Channel(ctx)
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.ConsumeWithContext(ctx, topo.Queue(broker.AlertsInput), "sasctl-alerts-tail", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consume alerts: %w", err)
	}
	fmt.Fprintf(a.stderr, "following %s (Ctrl-C to stop)\n", topo.Queue(broker.AlertsInput))
	seen := 0
	for {
		select {
		case <-ctx.Done():
			if *count > 0 {
				return fmt.Errorf("stopped after %d of %d alerts", seen, *count)
			}
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return fmt.Errorf("the alerts queue went away")
			}
			if al, err := messages.DecodeOperatorAlert(d.Body); err == nil {
				fmt.Fprintf(a.stdout, "%s  order %s  step %d  failures %d  %s\n",
					al.At.UTC().Format(time.RFC3339), al.OrderID, al.Step, al.FailureCount, al.Reason)
			} else {
				fmt.Fprintf(a.stdout, "unreadable alert (%v): %s\n", err, d.Body)
			}
			if err := d.Ack(false); err != nil {
				return fmt.Errorf("ack alert: %w", err)
			}
			seen++
			if *count > 0 && seen >= *count {
				return nil
			}
		}
	}
}
