// Command scheduler claims pending steps, sends them to agents and applies
// their replies, and publishes status events. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/scheduler"
	"sas/internal/service"
)

func main() {
	os.Exit(service.Main("scheduler", scheduler.Run))
}
