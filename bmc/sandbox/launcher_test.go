//go:build linux

package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
)

// runProbe runs the test binary as the probe: through the launcher under spec, or
// directly when spec is nil.
func runProbe(t *testing.T, spec *Spec) probeReport {
	t.Helper()
	return runProbeIn(t, "/", spec)
}

func runProbeIn(t *testing.T, dir string, spec *Spec) probeReport {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	if spec == nil {
		cmd = &exec.Cmd{Path: self, Args: []string{probeName}}
	} else {
		bin, err := os.Open(self)
		if err != nil {
			t.Fatal(err)
		}
		defer bin.Close()
		if cmd, err = Command([]string{self, "plugin-exec"}, *spec, bin); err != nil {
			t.Fatal(err)
		}
	}
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("probe: %v\nstderr: %s", err, stderr.String())
	}
	var r probeReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("probe output %q: %v (stderr %s)", stdout.String(), err, stderr.String())
	}
	return r
}

const noCaps = "0000000000000000"

// TestLauncherConfines proves the launcher on this kernel: the probe that runs
// through it has its own uid and gid, no groups, no capabilities in any set,
// no_new_privs, a seccomp filter that refuses what the same probe may do outside
// it, the resource limits, and still a working network stack.
func TestLauncherConfines(t *testing.T) {
	testenv.NeedRoot(t)
	free := runProbe(t, nil)
	for _, call := range []string{"socket(AF_NETLINK)", "keyctl", "personality", "fork"} {
		if free.Calls[call] != "ok" {
			t.Fatalf("outside the sandbox %s fails (%s), so the sandbox cannot be shown to refuse it", call, free.Calls[call])
		}
	}

	ids, err := PluginIDs(probeName)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chown(dir, ids.UID, ids.GID); err != nil {
		t.Fatal(err)
	}
	r := runProbeIn(t, dir, &Spec{Name: probeName, UID: ids.UID, GID: ids.GID, NoFile: 256, NProc: 64, NameLink: true})
	if r.Status["Name"] != probeName {
		t.Errorf("the process is named %q, want %q", r.Status["Name"], probeName)
	}
	if r.UID != ids.UID || r.EUID != ids.UID || r.GID != ids.GID {
		t.Errorf("probe runs as uid %d euid %d gid %d, want %d/%d", r.UID, r.EUID, r.GID, ids.UID, ids.GID)
	}
	if len(r.Groups) != 0 {
		t.Errorf("probe keeps supplementary groups %v", r.Groups)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if r.Status[k] != noCaps {
			t.Errorf("%s = %q, want %s", k, r.Status[k], noCaps)
		}
	}
	if r.Status["NoNewPrivs"] != "1" || r.Status["Seccomp"] != "2" || r.Status["Seccomp_filters"] != "1" {
		t.Errorf("NoNewPrivs %q Seccomp %q filters %q, want 1, 2 (filter), 1", r.Status["NoNewPrivs"], r.Status["Seccomp"], r.Status["Seccomp_filters"])
	}
	for _, call := range []string{"socket(AF_NETLINK)", "keyctl", "personality", "fork", "unshare(CLONE_NEWUSER)", "mount", "ptrace"} {
		if !strings.HasSuffix(r.Calls[call], "operation not permitted") {
			t.Errorf("in the sandbox %s: %q, want operation not permitted", call, r.Calls[call])
		}
	}
	if r.UDPLoopback != "ping" {
		t.Errorf("UDP on loopback in the sandbox: %s", r.UDPLoopback)
	}
	if r.NoFile != 256 || r.Core != 0 {
		t.Errorf("RLIMIT_NOFILE %d RLIMIT_CORE %d, want 256 and 0", r.NoFile, r.Core)
	}
	t.Logf("probe ran as uid %d (%s): %v", r.UID, ids.Source, r.Status)
}

// TestLauncherPrivileged: a privileged plugin keeps root and its capabilities and
// gets no filter.
func TestLauncherPrivileged(t *testing.T) {
	testenv.NeedRoot(t)
	r := runProbe(t, &Spec{Name: probeName, Privileged: true, NoFile: 512})
	if r.UID != 0 || r.Status["CapEff"] == noCaps || r.Status["Seccomp"] != "0" || r.Status["NoNewPrivs"] != "0" {
		t.Errorf("privileged probe: uid %d %v", r.UID, r.Status)
	}
	if r.Calls["socket(AF_NETLINK)"] != "ok" || r.NoFile != 512 || r.Core != 0 {
		t.Errorf("privileged probe: netlink %q nofile %d core %d", r.Calls["socket(AF_NETLINK)"], r.NoFile, r.Core)
	}
}

func TestLauncherRefusesRoot(t *testing.T) {
	self, _ := os.Executable()
	bin, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	if _, err := Command([]string{self, "plugin-exec"}, Spec{Name: "x", UID: 0, GID: 0}, bin); err == nil {
		t.Error("Command accepted a confined plugin as root")
	}
	if err := Exec([]string{"--name", "x", "--fd", "3", "--uid", "0", "--gid", "0"}); err == nil || !strings.Contains(err.Error(), "other than root") {
		t.Errorf("Exec as root: %v", err)
	}
	if err := Exec([]string{"stray"}); err == nil {
		t.Error("Exec took a positional argument")
	}
}

// cgroup2Mount finds where cgroup v2 is mounted, or "".
func cgroup2Mount(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		if f := strings.Fields(pre); len(f) >= 5 {
			return f[4]
		}
	}
	return ""
}

// TestLauncherStartsInItsCgroup: the launcher, and so the plugin, is created inside
// the cgroup it is given (clone3 CLONE_INTO_CGROUP), never outside it for a moment.
// Placement needs no controller, so this runs on any cgroup v2 mount.
func TestLauncherStartsInItsCgroup(t *testing.T) {
	testenv.NeedRoot(t)
	mnt := cgroup2Mount(t)
	if mnt == "" {
		testenv.Skip(t, "no cgroup v2 mount on this machine")
	}
	name := fmt.Sprintf("bcd-sandbox-test-%d", os.Getpid())
	dir := filepath.Join(mnt, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	ids, err := PluginIDs(probeName)
	if err != nil {
		t.Fatal(err)
	}
	r := runProbe(t, &Spec{Name: probeName, UID: ids.UID, GID: ids.GID, Cgroup: cg})
	if !strings.Contains("\n"+r.Cgroup+"\n", "\n0::/"+name+"\n") {
		t.Errorf("probe's cgroups:\n%s\nwant 0::/%s", r.Cgroup, name)
	}
}
