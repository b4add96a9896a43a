//go:build !failpoints

// Package failpoint marks the points where fault tests kill a process on
// purpose (for example a scheduler after it claimed steps and before it
// sent their requests). In a normal build Inject does nothing; binaries
// built with -tags failpoints kill themselves with SIGKILL at a point named
// in SAS_FAILPOINTS (comma-separated), and break on purpose where
// SAS_BROKEN names a switch (to prove the fault checker catches it).
package failpoint

import "context"

// Inject is a no-op in normal builds.
func Inject(name string) {}

// StopHere is a no-op in normal builds.
func StopHere(ctx context.Context, name string) {}

// Delay is a no-op in normal builds.
func Delay(name string) {}

// Panic is a no-op in normal builds.
func Panic(name, key string) {}

// Broken reports whether a deliberately broken behaviour is switched on,
// for the fault suite's negative controls; always false in normal builds.
func Broken(name string) bool { return false }
