// Command console serves the web console: orders, steps and their
// history, alerts, dead letters and workflows, with resubmit, cancel,
// acknowledge, requeue and discard for operators. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/console"
	"sas/internal/service"
)

func main() {
	os.Exit(service.Main("console", console.Run))
}
