// Command supervisor finds steps whose complete-by time has passed and
// puts them back to pending, or past their failure threshold holds them in
// error and alerts an operator. Run one or more; one leads. Configuration
// comes from SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/service"
	"sas/internal/supervisor"
)

func main() {
	os.Exit(service.Main("supervisor", supervisor.Run))
}
