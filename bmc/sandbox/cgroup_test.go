//go:build linux

package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// fakeCgroupfs lays out what the kernel would show for bcd's delegated cgroup:
// the interface files of the parent, of the plugins cgroup and of one plugin's
// child, since a plain mkdir creates none of them.
func fakeCgroupfs(t *testing.T, parentProcs string, controllers string) (root string) {
	t.Helper()
	root = t.TempDir()
	parent := filepath.Join(root, "bcd.service")
	for _, dir := range []string{parent, filepath.Join(parent, "main"), filepath.Join(parent, "plugins"), filepath.Join(parent, "plugins", "bcx-ipmi")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"cgroup.controllers", "cgroup.subtree_control", "cgroup.procs", "memory.max", "pids.max", "memory.swap.max", "memory.oom.group", "cgroup.kill"} {
			if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(t, filepath.Join(parent, "cgroup.controllers"), controllers)
	write(t, filepath.Join(parent, "cgroup.procs"), parentProcs)
	return root
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPrepareMovesIntoMainLeaf: systemd before 254 leaves bcd in its unit's own
// cgroup, so bcd moves every process there into main/ before it can enable the
// controllers its plugins' cgroups need.
func TestPrepareMovesIntoMainLeaf(t *testing.T) {
	root := fakeCgroupfs(t, "4242\n4243\n", "cpuset cpu io memory pids\n")
	parent := filepath.Join(root, "bcd.service")
	c := &Cgroup{Path: filepath.Join(parent, "plugins"), MemoryMax: 256 << 20, PidsMax: 128, fake: true}
	moved, err := c.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(moved) != "[4242 4243]" {
		t.Errorf("moved %v", moved)
	}
	if got := read(t, filepath.Join(parent, "main", "cgroup.procs")); got != "4242\n4243\n" {
		t.Errorf("main/cgroup.procs got %q", got)
	}
	for _, dir := range []string{parent, c.Path} {
		if got := read(t, filepath.Join(dir, "cgroup.subtree_control")); got != "+memory +pids" {
			t.Errorf("%s/cgroup.subtree_control got %q", dir, got)
		}
	}

	f, err := c.Plugin("bcx-ipmi")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	dir := c.Dir("bcx-ipmi")
	for file, want := range map[string]string{"memory.max": "268435456", "pids.max": "128", "memory.swap.max": "0", "memory.oom.group": "1"} {
		if got := read(t, filepath.Join(dir, file)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	if killed, err := c.Kill("bcx-ipmi"); !killed || err != nil || read(t, filepath.Join(dir, "cgroup.kill")) != "1" {
		t.Errorf("Kill: %v %v", killed, err)
	}
}

// TestPrepareWithDelegateSubgroup: under systemd 254+ bcd already sits in main/,
// the parent holds no process, and nothing moves.
func TestPrepareWithDelegateSubgroup(t *testing.T) {
	root := fakeCgroupfs(t, "", "memory pids\n")
	c := &Cgroup{Path: filepath.Join(root, "bcd.service", "plugins"), MemoryMax: 1 << 20, PidsMax: 8, fake: true}
	moved, err := c.Prepare()
	if err != nil || len(moved) != 0 {
		t.Fatalf("Prepare: moved %v, %v", moved, err)
	}
	if got := read(t, filepath.Join(root, "bcd.service", "main", "cgroup.procs")); got != "" {
		t.Errorf("something was moved: %q", got)
	}
}

func TestPrepareRefuses(t *testing.T) {
	for _, c := range []struct {
		name, controllers, want string
		setup                   func(root string)
	}{
		{"no memory controller", "cpu pids\n", "the memory controller is not available", nil},
		{"no pids controller", "memory\n", "the pids controller is not available", nil},
		{"processes in the plugins cgroup", "memory pids\n", "holds processes [77] itself", func(root string) {
			write(t, filepath.Join(root, "bcd.service", "plugins", "cgroup.procs"), "77\n")
		}},
		{"no parent", "memory pids\n", "no such file", func(root string) {
			os.RemoveAll(filepath.Join(root, "bcd.service"))
		}},
	} {
		root := fakeCgroupfs(t, "", c.controllers)
		if c.setup != nil {
			c.setup(root)
		}
		cg := &Cgroup{Path: filepath.Join(root, "bcd.service", "plugins"), MemoryMax: 1, PidsMax: 1, fake: true}
		_, err := cg.Prepare()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	// A plugins cgroup named like the leaf would swallow bcd.
	root := fakeCgroupfs(t, "1\n", "memory pids\n")
	cg := &Cgroup{Path: filepath.Join(root, "bcd.service", "main"), MemoryMax: 1, PidsMax: 1, fake: true}
	if _, err := cg.Prepare(); err == nil || !strings.Contains(err.Error(), "cannot be named") {
		t.Errorf("plugins cgroup named main: %v", err)
	}
}

// inVM names the test that proves the real-cgroup tests on a kernel whose cgroup v2
// has every controller, for hosts where they cannot run.
const inVM = "`go test -run TestPluginCgroupsInVM ./testbed` proves the same in a VM with a pure cgroup v2"

// TestPrepareRealCgroup runs the whole preparation on the kernel's cgroup v2: a
// stand-in for bcd.service holding a process, which Prepare moves into main/; the
// plugin's cgroup gets its limits, and a process started into it is in it. A
// process that allocates past a small memory.max is OOM-killed: the limit bites.
// On a host whose cgroup v2 lacks the controllers, testbed's TestPluginCgroupsInVM
// runs this test inside a VM whose kernel has them all on cgroup v2.
func TestPrepareRealCgroup(t *testing.T) {
	testenv.NeedRoot(t)
	mnt := cgroup2Mount(t)
	if mnt == "" {
		testenv.Skip(t, "cgroup v2 is not mounted here")
	}
	avail, _ := readList(filepath.Join(mnt, "cgroup.controllers"))
	if !containsAll(avail, controllers) {
		testenv.Unsupported(t, fmt.Sprintf("cgroup v2 at %s offers %q, without memory and pids (a hybrid hierarchy: they are bound to cgroup v1), so plugin cgroups cannot be limited on this machine; %s", mnt, strings.Join(avail, " "), inVM))
	}
	enabled, _ := readList(filepath.Join(mnt, "cgroup.subtree_control"))
	if !containsAll(enabled, controllers) {
		testenv.Unsupported(t, fmt.Sprintf("cgroup v2 at %s does not enable memory and pids for its children (subtree_control %q); %s", mnt, strings.Join(enabled, " "), inVM))
	}
	service := filepath.Join(mnt, fmt.Sprintf("bcd-test-%d.service", os.Getpid()))
	if err := os.Mkdir(service, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Cgroup{Path: filepath.Join(service, "plugins"), MemoryMax: 64 << 20, PidsMax: 32}
	t.Cleanup(func() {
		sleeper.Process.Kill()
		sleeper.Wait()
		for _, d := range []string{c.Dir("probe"), c.Dir(hogName), c.Path, filepath.Join(service, MainLeaf), service} {
			for i := 0; i < 50 && os.Remove(d) != nil && dirExists(d); i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	})
	if err := appendLine(filepath.Join(service, "cgroup.procs"), strconv.Itoa(sleeper.Process.Pid)); err != nil {
		t.Fatal(err)
	}
	moved, err := c.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if len(moved) != 1 || moved[0] != sleeper.Process.Pid {
		t.Errorf("moved %v, want the sleeper %d", moved, sleeper.Process.Pid)
	}
	f, err := c.Plugin("probe")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	memMax := strings.TrimSpace(read(t, filepath.Join(c.Dir("probe"), "memory.max")))
	pidsMax := strings.TrimSpace(read(t, filepath.Join(c.Dir("probe"), "pids.max")))
	if memMax != strconv.Itoa(64<<20) || pidsMax != "32" {
		t.Errorf("memory.max %q pids.max %q, want %d and 32", memMax, pidsMax, 64<<20)
	}
	ids, err := PluginIDs(probeName)
	if err != nil {
		t.Fatal(err)
	}
	r := runProbe(t, &Spec{Name: probeName, UID: ids.UID, GID: ids.GID, Cgroup: f})
	rel := strings.TrimPrefix(c.Dir("probe"), mnt)
	if !strings.Contains(r.Cgroup, "0::"+rel) {
		t.Errorf("probe's cgroup:\n%s\nwant 0::%s", r.Cgroup, rel)
	}
	t.Logf("sleeper %d moved into %s; probe (uid %d) /proc/self/cgroup: %s; memory.max %s, pids.max %s",
		sleeper.Process.Pid, filepath.Join(service, MainLeaf), r.UID, r.Cgroup, memMax, pidsMax)

	// The limit bites: a plugin that touches more than its memory.max is killed.
	small := &Cgroup{Path: c.Path, MemoryMax: hogLimit, PidsMax: 32}
	hf, err := small.Plugin(hogName)
	if err != nil {
		t.Fatal(err)
	}
	defer hf.Close()
	hogIDs, err := PluginIDs(hogName)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	hog, err := Command([]string{self, "plugin-exec"}, Spec{Name: hogName, UID: hogIDs.UID, GID: hogIDs.GID, Cgroup: hf}, bin)
	if err != nil {
		t.Fatal(err)
	}
	hog.Dir, hog.Env = "/", []string{"PATH=/usr/bin:/bin"}
	out, err := hog.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("a plugin touching %d MiB under memory.max %d MiB: %v, want killed by the OOM killer\n%s", hogTouch>>20, hogLimit>>20, err, out)
	}
	events := read(t, filepath.Join(small.Dir(hogName), "memory.events"))
	var ooms int
	for _, line := range strings.Split(events, "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
			ooms, _ = strconv.Atoi(v)
		}
	}
	if ooms < 1 {
		t.Errorf("memory.events after the hog died:\n%s\nwant oom_kill >= 1", events)
	}
	t.Logf("hog touching %d MiB under memory.max %s: %v; memory.events oom_kill %d; output %q",
		hogTouch>>20, strings.TrimSpace(read(t, filepath.Join(small.Dir(hogName), "memory.max"))), err, ooms, bytes.TrimSpace(out))
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
