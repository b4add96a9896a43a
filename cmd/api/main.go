// Command api serves the HTTP API (/api/v1): submit, read, await and
// follow orders, signal them, resubmit, cancel and re-run them, alone or
// in bulk jobs, for callers with an API token. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/api"
	"sas/internal/service"
)

func main() {
	os.Exit(service.Main("api", api.Run))
}
