package testbed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// GuestTest is one Go test binary (go test -c) that a Guest runs.
type GuestTest struct {
	// Name is the binary's name in the guest (/guest/<Name>) and in the console
	// markers: letters, digits, '.', '_' and '-'.
	Name string
	// Binary is the test binary on this machine. Build it with CGO_ENABLED=0: the
	// guest has only the shared libraries of Guest.Programs.
	Binary string
	// Run is its -test.run pattern.
	Run string
	// Env adds KEY=VALUE settings to BCD_REQUIRE_ALL=1, PATH, HOME and TMPDIR.
	Env []string
	// Timeout is its -test.timeout, after which the binary panics with every
	// goroutine's stack on the console; 0 means 3 minutes.
	Timeout time.Duration
}

// Guest is a VM that runs Go test binaries as root under a kernel whose every
// controller is on cgroup v2, for tests the host's own setup cannot run (a hybrid
// cgroup hierarchy binds memory and pids to cgroup v1). Its init, busybox's sh,
// mounts proc, sysfs, devtmpfs, tmpfs on /tmp and /run (/var/run links to it),
// cgroup2 on /sys/fs/cgroup with memory and pids enabled for the root's children,
// writes a root-only /etc/passwd and /etc/group, brings lo up, runs each test
// binary in turn with -test.v and BCD_REQUIRE_ALL=1, and powers off. The VM has no
// NIC.
type Guest struct {
	// Name of the VM; Dir holds the initramfs and the VM's files.
	Name, Dir string
	// Kernel is Debian's vmlinuz (KernelPath). The guest needs no module.
	Kernel string
	// MemoryMB of the VM; 0 means 512.
	MemoryMB int
	Tests    []GuestTest
	// Programs are executables of this machine (absolute paths or names on PATH)
	// placed at the same absolute path in the guest, with every shared library ldd
	// lists for them. The guest's PATH puts /usr/sbin and /usr/bin before busybox's
	// /bin, so these win over busybox applets of the same name (iproute2's ip,
	// which has netns, over busybox's).
	Programs []string
	// Files are more files: path in the guest → path here.
	Files map[string]string
	// Append adds to the kernel command line.
	Append string
}

// GuestResult is what one test binary did in the guest.
type GuestResult struct {
	Name string
	// Exit is the binary's exit status; -1 when the guest never reported one.
	Exit int
	// Output is what it printed (stdout and stderr), without carriage returns.
	Output string
}

// GuestRun is a finished (or failed) boot of a Guest.
type GuestRun struct {
	VM *VM
	// Setup is what init printed before the first test: the cgroup v2 controllers
	// and anything that failed while it set the guest up.
	Setup   string
	Results []GuestResult
	// Elapsed is from starting QEMU until init reported the last binary done.
	Elapsed time.Duration
	marker  string
}

// Tail returns the console's last n lines and QEMU's output.
func (r *GuestRun) Tail(n int) string {
	if r == nil || r.VM == nil {
		return "(no VM was started)"
	}
	return r.VM.Tail(n)
}

var guestName = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// Run builds the guest's initramfs, boots it, waits until init reports every test
// binary done (or ctx ends, or QEMU exits), and returns each binary's exit status
// and output. QEMU is stopped before Run returns. An error means the guest did not
// report every binary; the run, when not nil, still holds the VM for its Tail.
func (g Guest) Run(ctx context.Context) (*GuestRun, error) {
	if g.Name == "" || g.Dir == "" || g.Kernel == "" || len(g.Tests) == 0 {
		return nil, errors.New("testbed: a guest needs a Name, a Dir, a Kernel and a test")
	}
	// A marker no test prints: init's lines are found by it and nothing else.
	marker := fmt.Sprintf("BCD-GUEST-%d-%d", os.Getpid(), time.Now().UnixNano())
	files := map[string]string{}
	for to, from := range g.Files {
		files[to] = from
	}
	for _, p := range g.Programs {
		if err := addProgram(files, p); err != nil {
			return nil, err
		}
	}
	for _, tst := range g.Tests {
		if !guestName.MatchString(tst.Name) {
			return nil, fmt.Errorf("testbed: guest test name %q: use letters, digits, '.', '_' and '-'", tst.Name)
		}
		if _, err := os.Stat(tst.Binary); err != nil {
			return nil, fmt.Errorf("testbed: guest test %s: %w", tst.Name, err)
		}
		files["/guest/"+tst.Name] = tst.Binary
	}
	script, err := g.initScript(marker)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(g.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	initrd := filepath.Join(g.Dir, "initrd")
	if err := BusyboxInitramfs(initrd, script, files); err != nil {
		return nil, err
	}
	vm, err := StartVM(nil, VMConfig{Name: g.Name, Dir: filepath.Join(g.Dir, "vm"), MemoryMB: g.MemoryMB,
		Kernel: g.Kernel, Initrd: initrd, Append: strings.TrimSpace("console=ttyS0 panic=-1 loglevel=3 " + g.Append)})
	if err != nil {
		return nil, err
	}
	defer vm.Stop()
	run := &GuestRun{VM: vm, marker: marker}
	_, werr := vm.WaitConsole(ctx, regexp.MustCompile(regexp.QuoteMeta(marker)+` DONE`))
	if werr == nil {
		run.Elapsed = time.Since(vm.Started)
	}
	run.parse(g.Tests)
	return run, werr
}

// initScript is the guest's /init. Every value it embeds is checked, so no
// pattern or setting can break out of its single quotes.
func (g Guest) initScript(marker string) (string, error) {
	quote := func(what, s string) (string, error) {
		if strings.ContainsAny(s, "'\n\x00") {
			return "", fmt.Errorf("testbed: guest: %s %q holds a quote or a newline", what, s)
		}
		return "'" + s + "'", nil
	}
	var b strings.Builder
	b.WriteString(`#!/bin/sh
# /init of a testbed guest: runs Go test binaries as root on cgroup v2, then powers off.
/bin/busybox mount -t devtmpfs dev /dev
exec </dev/null >/dev/console 2>&1
/bin/busybox --install -s /bin
# The image's root comes from a private temporary directory (0700): the plugins'
# own uids must be able to walk it.
chmod 755 /
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp
M=` + marker + `
fail() { echo "$M SETUP FAILED: $*"; }
mkdir -p /run /var /root
mount -t proc proc /proc || fail proc
mount -t sysfs sys /sys || fail sysfs
mount -t tmpfs -o mode=1777 tmp /tmp || fail tmp
mount -t tmpfs -o mode=755 run /run || fail run
ln -s /run /var/run
mount -t cgroup2 cgroup2 /sys/fs/cgroup || fail cgroup2
echo '+memory +pids' >/sys/fs/cgroup/cgroup.subtree_control || fail subtree_control
echo 'root:x:0:0:root:/root:/bin/sh' >/etc/passwd
echo 'root:x:0:' >/etc/group
ip link set lo up || fail lo
echo "$M cgroup2 controllers: $(cat /sys/fs/cgroup/cgroup.controllers); subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
`)
	for _, tst := range g.Tests {
		run, err := quote("-test.run", tst.Run)
		if err != nil {
			return "", err
		}
		timeout := tst.Timeout
		if timeout == 0 {
			timeout = 3 * time.Minute
		}
		env := []string{"BCD_REQUIRE_ALL=1"}
		for _, e := range tst.Env {
			if k, _, ok := strings.Cut(e, "="); !ok || !guestName.MatchString(k) {
				return "", fmt.Errorf("testbed: guest test %s: %q is not KEY=VALUE", tst.Name, e)
			}
			q, err := quote("setting", e)
			if err != nil {
				return "", err
			}
			env = append(env, q)
		}
		fmt.Fprintf(&b, "echo \"$M BEGIN %s\"\n", tst.Name)
		fmt.Fprintf(&b, "(cd /tmp && exec env %s /guest/%s -test.v -test.run %s -test.timeout %s)\n",
			strings.Join(env, " "), tst.Name, run, timeout)
		fmt.Fprintf(&b, "echo \"$M END %s exit=$?\"\n", tst.Name)
	}
	b.WriteString(`echo "$M DONE"
poweroff -f
`)
	return b.String(), nil
}

// parse splits the console into init's setup lines and each binary's output.
func (r *GuestRun) parse(tests []GuestTest) {
	raw, _ := os.ReadFile(r.VM.Serial)
	console := strings.ReplaceAll(string(raw), "\r", "")
	byName := map[string]*GuestResult{}
	for _, tst := range tests {
		r.Results = append(r.Results, GuestResult{Name: tst.Name, Exit: -1})
	}
	for i := range r.Results {
		byName[r.Results[i].Name] = &r.Results[i]
	}
	var cur *GuestResult
	var out, setup strings.Builder
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		i := strings.Index(line, r.marker+" ")
		if i < 0 {
			if cur != nil {
				out.WriteString(line + "\n")
			}
			continue
		}
		// A marker can follow the unterminated last line of a binary's output.
		if cur != nil && i > 0 {
			out.WriteString(line[:i] + "\n")
		}
		f := strings.Fields(line[i+len(r.marker)+1:])
		switch {
		case len(f) == 2 && f[0] == "BEGIN":
			cur = byName[f[1]]
			out.Reset()
		case len(f) == 3 && f[0] == "END" && cur != nil && f[1] == cur.Name:
			if n, err := strconv.Atoi(strings.TrimPrefix(f[2], "exit=")); err == nil {
				cur.Exit = n
			}
			cur.Output = out.String()
			cur = nil
		case cur == nil && !(len(f) == 1 && f[0] == "DONE"):
			setup.WriteString(line[i:] + "\n")
		}
	}
	// A binary that never finished: what it printed up to the end.
	if cur != nil {
		cur.Output = out.String()
	}
	r.Setup = setup.String()
}

// addProgram adds an executable and the shared libraries ldd lists for it
// (including the dynamic loader) at their paths on this machine.
func addProgram(files map[string]string, name string) error {
	path := name
	if !filepath.IsAbs(path) {
		p, err := exec.LookPath(name)
		if err != nil {
			return fmt.Errorf("testbed: guest program %s: %w", name, err)
		}
		if path, err = filepath.Abs(p); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	files[path] = path
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("ldd", path)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		// A static binary needs nothing more.
		if strings.Contains(stdout.String()+stderr.String(), "not a dynamic executable") {
			return nil
		}
		return fmt.Errorf("testbed: ldd %s: %v: %s", path, err, bytes.TrimSpace(stderr.Bytes()))
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x…)"; the vDSO has no file.
		f := strings.Fields(line)
		var lib string
		switch {
		case len(f) >= 3 && f[1] == "=>":
			lib = f[2]
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			lib = f[0]
		}
		if lib == "" {
			continue
		}
		if line := strings.TrimSpace(line); strings.Contains(line, "not found") {
			return fmt.Errorf("testbed: guest program %s: ldd: %s", path, line)
		}
		files[lib] = lib
	}
	return nil
}
