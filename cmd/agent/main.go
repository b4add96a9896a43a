// Command agent performs the steps of orders: it consumes step requests,
// calls the remote service with retries and replies. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/agent"
	"sas/internal/service"
)

func main() {
	os.Exit(service.Main("agent", agent.Run))
}
