// Package testenv decides whether a test that needs root, a tool or a VM may skip.
//
// A test that cannot run here skips with the reason when run by hand, but under
// BCD_REQUIRE_ALL=1 (set by `make test`, which installs everything) the same
// condition is a failure: a suite that passes by skipping proves nothing.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// RequireAll reports whether BCD_REQUIRE_ALL=1 turns skips into failures.
func RequireAll() bool { return os.Getenv("BCD_REQUIRE_ALL") == "1" }

// Skip skips t with reason, or fails it under BCD_REQUIRE_ALL=1.
func Skip(t testing.TB, reason string) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("BCD_REQUIRE_ALL=1 but this test cannot run: %s", reason)
	}
	t.Skip(reason)
}

// NeedRoot skips (or fails under BCD_REQUIRE_ALL=1) unless the test runs as root.
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Skip(t, "needs root")
	}
}

// NeedTool returns the path of an executable on PATH, skipping (or failing under
// BCD_REQUIRE_ALL=1) when it is missing.
func NeedTool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Skip(t, name+" is not installed")
	}
	return p
}

// Unsupported skips t because this machine's kernel setup lacks a capability that no
// package install can give it (e.g. cgroup v2 memory and pids controllers on a host
// whose init bound them to cgroup v1). Unlike Skip it skips under BCD_REQUIRE_ALL=1
// too, and says so loudly: the test's subject is then covered only by the tests that
// run without the capability, which the caller names in reason.
func Unsupported(t testing.TB, reason string) {
	t.Helper()
	t.Logf("UNSUPPORTED ON THIS MACHINE (skipped even under BCD_REQUIRE_ALL=1): %s", reason)
	t.Skip(reason)
}
