//go:build failpoints

package failpoint

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// Inject kills the process with SIGKILL if name is listed in
// SAS_FAILPOINTS: no deferred function runs, nothing is flushed, as in a
// crash.
func Inject(name string) {
	if slices.Contains(strings.Split(os.Getenv("SAS_FAILPOINTS"), ","), name) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// Panic panics if SAS_FAILPOINTS lists name=key, e.g.
// panic-on-message=<message id>: a handler that meets that one message
// panics, as a bug would.
func Panic(name, key string) {
	if key != "" && slices.Contains(strings.Split(os.Getenv("SAS_FAILPOINTS"), ","), name+"="+key) {
		panic("failpoint " + name + " for " + key)
	}
}

// Broken reports whether name is listed in SAS_BROKEN.
func Broken(name string) bool {
	return slices.Contains(strings.Split(os.Getenv("SAS_BROKEN"), ","), name)
}
