//go:build failpoints

package failpoint

import (
	"context"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Inject kills the process with SIGKILL if name is listed in
// SAS_FAILPOINTS: no deferred function runs, nothing is flushed, as in a
// crash.
func Inject(name string) {
	if listed(name) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// StopHere stops the process as an operator would, with SIGTERM to
// itself, if SAS_FAILPOINTS lists name: once, then the name is taken off
// the list. It returns when the stop has ended ctx (a consumer's, which
// the stop ends first) and gone on for 100 ms, so that the work in hand
// at this point finishes while the process is stopping around it.
func StopHere(ctx context.Context, name string) {
	if !listed(name) {
		return
	}
	rest := slices.DeleteFunc(strings.Split(os.Getenv("SAS_FAILPOINTS"), ","), func(n string) bool { return n == name })
	_ = os.Setenv("SAS_FAILPOINTS", strings.Join(rest, ","))
	_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	<-ctx.Done()
	time.Sleep(100 * time.Millisecond)
}

// Delay waits a second if SAS_FAILPOINTS lists name: a step that is
// slow where it is usually quick, so that what must wait for it can be
// seen to.
func Delay(name string) {
	if listed(name) {
		time.Sleep(time.Second)
	}
}

// Panic panics if SAS_FAILPOINTS lists name=key, e.g.
// panic-on-message=<message id>: a handler that meets that one message
// panics, as a bug would.
func Panic(name, key string) {
	if key != "" && listed(name+"="+key) {
		panic("failpoint " + name + " for " + key)
	}
}

// Broken reports whether name is listed in SAS_BROKEN.
func Broken(name string) bool {
	return slices.Contains(strings.Split(os.Getenv("SAS_BROKEN"), ","), name)
}

// listed reports whether SAS_FAILPOINTS (comma-separated) names point.
func listed(point string) bool {
	return slices.Contains(strings.Split(os.Getenv("SAS_FAILPOINTS"), ","), point)
}
