package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestPluginCgroupsInVM proves issue 7 where the host cannot: this host's systemd
// binds memory and pids to cgroup v1 (a hybrid hierarchy), so the two tests that
// limit a plugin's cgroup are unsupported here. It runs them, unchanged, in a VM
// whose kernel has every controller on cgroup v2: bmc/sandbox's
// TestPrepareRealCgroup (Prepare moves the service's process into main/, the
// plugin cgroup's limits, a probe started into it, an allocation past memory.max
// OOM-killed) and bmc/pluginhost's TestPluginInItsCgroup (the real Host starts the
// real sandboxed bcx-ipmi through the launcher in a network namespace, where it
// talks to ipmi_sim, and the plugin's /proc/<pid>/cgroup is its own cgroup with
// the configured memory.max and pids.max). It fails unless both binaries exit 0,
// print --- PASS for their test, and skip nothing.
func TestPluginCgroupsInVM(t *testing.T) {
	kernel := needLab(t)
	gobin := testenv.NeedTool(t, "go")
	for _, tool := range []string{"busybox", "ldd", "ipmi_sim", "ipmitool"} {
		testenv.NeedTool(t, tool)
	}
	root := repoRoot(t)
	dir := t.TempDir()
	bin := func(name string) string { return filepath.Join(dir, name) }
	start := time.Now()
	builds := [][]string{
		{"test", "-c", "-o", bin("sandbox.test"), "./bmc/sandbox"},
		{"test", "-c", "-o", bin("pluginhost.test"), "./bmc/pluginhost"},
		{"build", "-trimpath", "-o", bin("bcx-ipmi"), "./plugins/bcx-ipmi"},
	}
	for _, args := range builds {
		cmd := exec.Command(gobin, args...)
		cmd.Dir = root
		// Static: the guest has no C library for them.
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	built := time.Since(start)

	tests := []struct{ binary, test string }{
		{"sandbox", "TestPrepareRealCgroup"},
		{"pluginhost", "TestPluginInItsCgroup"},
	}
	g := Guest{
		Name:   fmt.Sprintf("cgroupvm-%d", os.Getpid()),
		Dir:    filepath.Join(dir, "guest"),
		Kernel: kernel,
		// 512 MiB: the initramfs (~70 MiB unpacked) stays in memory.
		MemoryMB: 512,
		// The lab of bmc/pluginhost: iproute2's ip for network namespaces (busybox's
		// has none), the virtual BMC and the client it is checked with.
		Programs: []string{"ip", "ipmi_sim", "ipmitool"},
		Files:    map[string]string{"/guest/bcx-ipmi": bin("bcx-ipmi")},
	}
	for _, tc := range tests {
		gt := GuestTest{Name: tc.binary, Binary: bin(tc.binary + ".test"), Run: "^" + tc.test + "$", Timeout: 2 * time.Minute}
		if tc.binary == "pluginhost" {
			gt.Env = []string{"BCD_TEST_BCX_IPMI=/guest/bcx-ipmi"}
		}
		g.Tests = append(g.Tests, gt)
	}
	// Two inner timeouts of 2 minutes, a boot, and a loaded 2-core machine under TCG.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	run, err := g.Run(ctx)
	if err != nil {
		for _, r := range resultsOf(run) {
			t.Logf("%s (exit %d):\n%s", r.Name, r.Exit, r.Output)
		}
		t.Fatalf("the guest did not finish: %v\n%s", err, run.Tail(60))
	}
	t.Logf("built the binaries in %s; boot to the end of both test binaries %s (accelerator %s)\n%s",
		built.Round(100*time.Millisecond), run.Elapsed.Round(100*time.Millisecond), Accelerator(), strings.TrimSpace(run.Setup))
	if strings.Contains(run.Setup, "SETUP FAILED") {
		t.Errorf("the guest's init could not set itself up:\n%s", run.Setup)
	}
	for i, r := range run.Results {
		name := tests[i].test
		var problems []string
		if r.Exit != 0 {
			problems = append(problems, fmt.Sprintf("exit status %d", r.Exit))
		}
		if !strings.Contains(r.Output, "--- PASS: "+name+" ") {
			problems = append(problems, "no --- PASS: "+name)
		}
		for _, bad := range []string{"--- SKIP", "--- FAIL", "UNSUPPORTED"} {
			if strings.Contains(r.Output, bad) {
				problems = append(problems, "it printed "+bad)
			}
		}
		if len(problems) > 0 {
			t.Errorf("%s in the guest: %s\n%s", name, strings.Join(problems, "; "), r.Output)
			continue
		}
		t.Logf("%s in the guest:\n%s", name, proofLines(r.Output))
	}
	if t.Failed() {
		t.Logf("console:\n%s", run.Tail(60))
	}
}

func resultsOf(run *GuestRun) []GuestResult {
	if run == nil {
		return nil
	}
	return run.Results
}

// proofLines keeps a passing binary's verdicts and its tests' own log lines (what
// they found: cgroup lines, limits), not the plugin host's debug log.
func proofLines(out string) string {
	var keep []string
	for _, line := range strings.Split(out, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "--- ") || strings.HasPrefix(trimmed, "=== RUN") ||
			strings.HasPrefix(trimmed, "cgroup_test.go:") || strings.HasPrefix(trimmed, "lab_test.go:") || trimmed == "PASS" {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
