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
	os.Exit(service.Main("remote", remote.Run))
}
