// Command remote is the demo remote service agents call: inventory,
// payment and shipping endpoints with an idempotency-key ledger and fault
// injection. Configuration comes from SAS_ environment variables; see the
// README.
package main

import (
	"os"

	"sas/internal/remote"
	"sas/internal/service"
)

func main() {
	// The remote stands for a user's service, whose work is a timer's
	// sleep (1 ms in the benchmarks): unless told otherwise it keeps the
	// timer slack it inherits, so that its answers come when they would
	// from a service of the user's (SAS_TIMER_SLACK, README).
	if _, set := os.LookupEnv("SAS_TIMER_SLACK"); !set {
		_ = os.Setenv("SAS_TIMER_SLACK", "0")
	}
	os.Exit(service.Main("remote", remote.Run))
}
