// Command submitter consumes orders from the submit queue and writes them,
// with their step state rows, to the state store. Configuration comes from
// SAS_ environment variables; see the README.
package main

import (
	"os"

	"sas/internal/service"
	"sas/internal/submitter"
)

func main() {
	os.Exit(service.Main("submitter", submitter.Run))
}
