//go:build linux

package pluginhost

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/bmc/pins"
	"github.com/better-compute/bcd/bmc/sandbox"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/testbed"
)

// labPassword is the virtual BMC's admin password: distinctive, so finding it
// anywhere it must not be is meaningful.
const labPassword = "Pw-7d3fQ91xZk"

// lab is a virtual BMC in a network namespace and a plugin host whose plugins run
// in that namespace, the way a site agent and its BMC network would be.
type lab struct {
	ns     *testbed.Netns
	vbmc   *testbed.VBMC
	host   *Host
	logs   *logBuffer
	drv    bmc.Driver
	target bmc.Host
	errs   []error // every error a call returned, searched for the password
	leaks  *argvWatch
}

func needLab(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ipmi_sim")
	testenv.NeedTool(t, "ipmitool")
	testenv.NeedTool(t, "ip")
}

var labSeq int

func newLab(t *testing.T, vm *testbed.VMConfig, setup func(ns *testbed.Netns), hostOpts ...func(*Host)) *lab {
	t.Helper()
	needLab(t)
	labSeq++
	ns, err := testbed.NewNetns(fmt.Sprintf("bcdph%d-%d", os.Getpid(), labSeq))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if setup != nil {
		setup(ns)
	}
	l := &lab{ns: ns}
	l.leaks = watchArgv(t, labPassword)
	l.vbmc = &testbed.VBMC{Name: "m-1", Dir: filepath.Join(t.TempDir(), "bmc"), Port: 6230, Password: labPassword, Netns: ns, VM: vm}
	if err := l.vbmc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.vbmc.Stop)
	l.host, l.logs = newHost(t, pluginDir(t), "ip", "netns", "exec", ns.Name)
	l.host.CallTimeout = 6 * time.Second
	for _, o := range hostOpts {
		o(l.host)
	}
	if l.drv, err = l.host.Driver("bcx-ipmi"); err != nil {
		t.Fatal(err)
	}
	l.target = bmc.Host{Name: "m-1", Address: "127.0.0.1", Port: 6230, Username: "admin", Password: labPassword, CipherSuite: 3}
	t.Cleanup(func() {
		l.leaks.stop(t)
		for _, err := range l.errs {
			if strings.Contains(fmt.Sprintf("%v %+v %#v", err, err, err), labPassword) {
				t.Errorf("an error shows the BMC password: %v", err)
			}
		}
		if strings.Contains(l.logs.String(), labPassword) {
			t.Errorf("the log shows the BMC password")
		}
	})
	return l
}

// ctx gives one step of a test its own deadline.
func (l *lab) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (l *lab) note(err error) error {
	if err != nil {
		l.errs = append(l.errs, err)
	}
	return err
}

func (l *lab) power(t *testing.T) bmc.PowerState {
	t.Helper()
	p, err := l.drv.PowerStatus(l.ctx(t), l.target)
	if l.note(err) != nil {
		t.Fatalf("bcx-ipmi power status: %v\n%s", err, l.vbmc.Tail(10))
	}
	return p
}

func (l *lab) ipmitoolPower(t *testing.T) bmc.PowerState {
	t.Helper()
	out, err := l.vbmc.Ipmitool(l.ctx(t), "chassis", "power", "status")
	if err != nil {
		t.Fatal(err)
	}
	switch strings.TrimSpace(out) {
	case "Chassis Power is on":
		return bmc.PowerOn
	case "Chassis Power is off":
		return bmc.PowerOff
	}
	t.Fatalf("ipmitool says %q", out)
	return ""
}

func (l *lab) pluginPID(t *testing.T) int {
	t.Helper()
	st, ok := l.host.Status("bcx-ipmi")
	if !ok || !st.Running || st.PID == 0 {
		t.Fatalf("bcx-ipmi is not running: %+v", st)
	}
	return st.PID
}

// argvWatch scans every process's command line while a test runs.
type argvWatch struct {
	secret string
	done   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	found  []string
	scans  int
}

func watchArgv(t *testing.T, secret string) *argvWatch {
	w := &argvWatch{secret: secret, done: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			w.scan()
			select {
			case <-w.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *argvWatch) scan() {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), w.secret) {
			w.mu.Lock()
			w.found = append(w.found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
			w.mu.Unlock()
		}
	}
	w.mu.Lock()
	w.scans++
	w.mu.Unlock()
}

func (w *argvWatch) stop(t *testing.T) {
	close(w.done)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.found) > 0 {
		t.Errorf("the BMC password is in a process's argv:\n%s", strings.Join(w.found, "\n"))
	}
	if w.scans < 2 {
		t.Errorf("argv was scanned only %d times", w.scans)
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestPluginAndIpmitoolAgree: bcx-ipmi, through the real plugin host and sandbox,
// and ipmitool -I lanplus -C 3 read the same power state from the virtual BMC
// whichever of them changed it, and the same inventory. It also measures both.
func TestPluginAndIpmitoolAgree(t *testing.T) {
	l := newLab(t, nil, nil)
	if p, q := l.power(t), l.ipmitoolPower(t); p != bmc.PowerOff || q != bmc.PowerOff {
		t.Fatalf("fresh machine: bcx-ipmi %s, ipmitool %s", p, q)
	}
	if _, err := l.vbmc.Ipmitool(l.ctx(t), "chassis", "power", "on"); err != nil {
		t.Fatal(err)
	}
	if p := l.power(t); p != bmc.PowerOn {
		t.Errorf("ipmitool turned it on, bcx-ipmi reads %s", p)
	}
	if err := l.note(l.drv.PowerOff(l.ctx(t), l.target)); err != nil {
		t.Fatal(err)
	}
	if q := l.ipmitoolPower(t); q != bmc.PowerOff {
		t.Errorf("bcx-ipmi turned it off, ipmitool reads %s", q)
	}
	if err := l.note(l.drv.SetBootDevice(l.ctx(t), l.target, bmc.BootDevice{Device: bmc.DevicePXE, EFI: true})); err != nil {
		t.Fatal(err)
	}
	if got := l.vbmc.BootDevice(); got != "pxe" {
		t.Errorf("boot device at the BMC: %q", got)
	}
	out, err := l.vbmc.Ipmitool(l.ctx(t), "chassis", "bootparam", "get", "5")
	if err != nil || !strings.Contains(out, "Force PXE") {
		t.Errorf("ipmitool reads boot flags %q (%v)", out, err)
	}

	inv, err := l.drv.Inventory(l.ctx(t), l.target)
	if l.note(err) != nil {
		t.Fatal(err)
	}
	guid, err := l.vbmc.Ipmitool(l.ctx(t), "mc", "guid")
	if err != nil {
		t.Fatal(err)
	}
	if inv.ManufacturerID != 4753 || inv.ProductID != 0xf02 || inv.IPMIVersion != "2.0" || inv.Power != bmc.PowerOff ||
		inv.SystemGUID == "" || !strings.Contains(guid, inv.SystemGUID) {
		t.Errorf("inventory %+v; ipmitool mc guid:\n%s", inv, guid)
	}

	// The same commands, timed, each way.
	type op struct {
		name     string
		ipmitool []string
		plugin   func(context.Context) error
	}
	ops := []op{
		{"power status", []string{"chassis", "power", "status"}, func(ctx context.Context) error {
			_, err := l.drv.PowerStatus(ctx, l.target)
			return err
		}},
		{"power on", []string{"chassis", "power", "on"}, func(ctx context.Context) error { return l.drv.PowerOn(ctx, l.target) }},
		{"power off", []string{"chassis", "power", "off"}, func(ctx context.Context) error { return l.drv.PowerOff(ctx, l.target) }},
		{"bootdev pxe", []string{"chassis", "bootdev", "pxe"}, func(ctx context.Context) error {
			return l.drv.SetBootDevice(ctx, l.target, bmc.BootDevice{Device: bmc.DevicePXE})
		}},
	}
	const runs = 7
	for _, o := range ops {
		var viaTool, viaPlugin []time.Duration
		for i := 0; i < runs; i++ {
			start := time.Now()
			if _, err := l.vbmc.Ipmitool(l.ctx(t), o.ipmitool...); err != nil {
				t.Fatal(err)
			}
			viaTool = append(viaTool, time.Since(start))
			// The plugin paces calls to one BMC (MinInterval); measure the call
			// itself, after the pause.
			time.Sleep(300 * time.Millisecond)
			start = time.Now()
			if err := l.note(o.plugin(l.ctx(t))); err != nil {
				t.Fatal(err)
			}
			viaPlugin = append(viaPlugin, time.Since(start))
		}
		t.Logf("%-12s median of %d: ipmitool -I lanplus -C 3 %6s   bcx-ipmi via plugin host %6s",
			o.name, runs, median(viaTool).Round(time.Millisecond), median(viaPlugin).Round(time.Millisecond))
	}
}

// TestPluginRunsConfined: the running plugin has its own uid and gid, no
// capability in any set, no_new_privs and a seccomp filter, and its argv is its
// name alone.
func TestPluginRunsConfined(t *testing.T) {
	l := newLab(t, nil, nil)
	l.power(t)
	pid := l.pluginPID(t)
	st := procStatus(t, pid)
	ids, err := sandbox.PluginIDs("bcx-ipmi")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat(strconv.Itoa(ids.UID)+"\t", 3) + strconv.Itoa(ids.UID)
	if st["Uid"] != want || st["Gid"] != strings.Repeat(strconv.Itoa(ids.GID)+"\t", 3)+strconv.Itoa(ids.GID) {
		t.Errorf("Uid %q Gid %q, want all %d/%d", st["Uid"], st["Gid"], ids.UID, ids.GID)
	}
	if st["Groups"] != "" {
		t.Errorf("Groups %q", st["Groups"])
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if st[k] != "0000000000000000" {
			t.Errorf("%s = %s", k, st[k])
		}
	}
	if st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" {
		t.Errorf("NoNewPrivs %s Seccomp %s", st["NoNewPrivs"], st["Seccomp"])
	}
	if st["Name"] != "bcx-ipmi" {
		t.Errorf("the plugin process is %q", st["Name"])
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if string(cmdline) != "bcx-ipmi\x00" {
		t.Errorf("plugin argv %q", cmdline)
	}
	t.Logf("bcx-ipmi pid %d: Uid %s CapEff %s CapBnd %s NoNewPrivs %s Seccomp %s", pid, st["Uid"], st["CapEff"], st["CapBnd"], st["NoNewPrivs"], st["Seccomp"])
}

// TestPluginInItsCgroup: with [plugins] cgroup, the plugin runs in its own child of
// it with the configured memory.max and pids.max. The stand-in for bcd.service holds
// a process, as it does under systemd before 254 (which ignores
// DelegateSubgroup=main), so the host must first move it into the main leaf.
// On a host whose cgroup v2 lacks the controllers, testbed's TestPluginCgroupsInVM
// runs this test inside a VM whose kernel has them all on cgroup v2.
func TestPluginInItsCgroup(t *testing.T) {
	needLab(t)
	mnt := cgroup2Mount(t)
	if mnt == "" {
		testenv.Skip(t, "cgroup v2 is not mounted here")
	}
	ctl, _ := os.ReadFile(filepath.Join(mnt, "cgroup.controllers"))
	sub, _ := os.ReadFile(filepath.Join(mnt, "cgroup.subtree_control"))
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(strings.Fields(string(ctl)), c) || !slices.Contains(strings.Fields(string(sub)), c) {
			testenv.Unsupported(t, fmt.Sprintf("cgroup v2 at %s lacks the %s controller (cgroup.controllers %q, subtree_control %q): a hybrid hierarchy binds it to cgroup v1, so plugin cgroups cannot be limited on this machine; `go test -run TestPluginCgroupsInVM ./testbed` proves the same in a VM with a pure cgroup v2",
				mnt, c, strings.TrimSpace(string(ctl)), strings.TrimSpace(string(sub))))
		}
	}
	service := filepath.Join(mnt, fmt.Sprintf("bcd-host-test-%d.service", os.Getpid()))
	if err := os.Mkdir(service, 0o755); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		os.Remove(service)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sleeper.Process.Kill()
		sleeper.Wait()
		for _, d := range []string{filepath.Join(service, "plugins", "bcx-ipmi"), filepath.Join(service, "plugins"), filepath.Join(service, sandbox.MainLeaf), service} {
			for i := 0; i < 50 && os.Remove(d) != nil; i++ {
				if _, err := os.Stat(d); err != nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	})
	if err := os.WriteFile(filepath.Join(service, "cgroup.procs"), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	l := newLab(t, nil, nil)
	l.host.Close()
	self, _ := os.Executable()
	h := &Host{Dir: l.host.Dir, Cgroup: filepath.Join(service, "plugins"), MemoryMax: 96 << 20, PidsMax: 48,
		Launcher: []string{"ip", "netns", "exec", l.ns.Name, self, "plugin-exec"}, RuntimeDir: t.TempDir(), Logger: l.host.Logger}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	leafProcs, _ := os.ReadFile(filepath.Join(service, sandbox.MainLeaf, "cgroup.procs"))
	if !slices.Contains(strings.Fields(string(leafProcs)), strconv.Itoa(sleeper.Process.Pid)) {
		t.Errorf("the process in %s (%d) was not moved into %s/: its cgroup.procs holds %q", service, sleeper.Process.Pid, sandbox.MainLeaf, leafProcs)
	}
	d, err := h.Driver("bcx-ipmi")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.PowerStatus(l.ctx(t), l.target); err != nil {
		t.Fatal(err)
	}
	st, _ := h.Status("bcx-ipmi")
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", st.PID))
	rel := strings.TrimPrefix(filepath.Join(service, "plugins", "bcx-ipmi"), mnt)
	if !strings.Contains(string(cg), "0::"+rel+"\n") {
		t.Errorf("plugin cgroups:\n%s\nwant 0::%s", cg, rel)
	}
	limits := map[string]string{}
	for file, want := range map[string]string{"memory.max": strconv.Itoa(96 << 20), "pids.max": "48"} {
		b, _ := os.ReadFile(filepath.Join(service, "plugins", "bcx-ipmi", file))
		limits[file] = strings.TrimSpace(string(b))
		if limits[file] != want {
			t.Errorf("%s = %q, want %s", file, b, want)
		}
	}
	t.Logf("bcd's stand-in %d moved into %s/%s; plugin bcx-ipmi pid %d (uid %d) /proc/%d/cgroup: %s; memory.max %s, pids.max %s",
		sleeper.Process.Pid, service, sandbox.MainLeaf, st.PID, st.UID, st.PID, strings.TrimSpace(string(cg)), limits["memory.max"], limits["pids.max"])
}

func cgroup2Mount(t *testing.T) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if ok && strings.HasPrefix(post, "cgroup2 ") {
			if f := strings.Fields(pre); len(f) >= 5 {
				return f[4]
			}
		}
	}
	return ""
}

// silentBMC listens where a BMC would and never answers, in the namespace.
func silentBMC(t *testing.T, ns *testbed.Netns, port int) {
	t.Helper()
	var pc net.PacketConn
	if err := ns.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
		}
	}()
}

// TestPluginCrashAndHang: a plugin killed with SIGKILL in the middle of an
// operation fails that operation with the reason and restarts, and the next
// operation succeeds; a plugin that stops answering is killed at the call's
// deadline and restarted; a BMC that does not answer is not mistaken for a hung
// plugin; the host carries on throughout.
func TestPluginCrashAndHang(t *testing.T) {
	// Health checks would catch the stopped plugin first (TestHungPluginFailsHealthCheck).
	l := newLab(t, nil, func(ns *testbed.Netns) { silentBMC(t, ns, 6299) }, func(h *Host) { h.HealthInterval = time.Hour })
	silent := l.target
	silent.Port = 6299
	if p := l.power(t); p != bmc.PowerOff {
		t.Fatalf("power %s", p)
	}
	pid := l.pluginPID(t)

	// kill -9 in the middle of an operation (the silent BMC keeps it going).
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := l.drv.PowerStatus(context.Background(), silent)
		errc <- err
	}()
	time.Sleep(time.Second)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	l.note(err)
	if bmc.KindOf(err) != bmc.KindPlugin || !strings.Contains(err.Error(), "plugin bcx-ipmi died during power status of m-1 (127.0.0.1:6299) (signal: killed)") {
		t.Fatalf("operation in flight: %v (kind %s)", err, bmc.KindOf(err))
	}
	t.Logf("in flight when the plugin was killed (%s later): %v", time.Since(start).Round(time.Millisecond), err)
	if p := l.power(t); p != bmc.PowerOff {
		t.Errorf("the next operation: %s", p)
	}
	if pid2 := l.pluginPID(t); pid2 == pid {
		t.Error("the plugin was not restarted")
	}
	if st, _ := l.host.Status("bcx-ipmi"); st.Restarts != 1 || !strings.Contains(st.LastError, "signal: killed") {
		t.Errorf("status after the crash: %+v", st)
	}

	// A BMC that never answers fails the call with the plugin's own verdict before
	// the host's deadline, and the plugin lives on.
	pid = l.pluginPID(t)
	_, err = l.drv.PowerStatus(context.Background(), silent)
	l.note(err)
	if bmc.KindOf(err) != bmc.KindUnreachable {
		t.Errorf("silent BMC: %v (kind %s), want unreachable", err, bmc.KindOf(err))
	}
	if l.pluginPID(t) != pid {
		t.Error("a silent BMC got the plugin restarted")
	}

	// A plugin that stops answering (SIGSTOP) is killed at the call's deadline.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = l.drv.PowerStatus(context.Background(), l.target)
	l.note(err)
	if bmc.KindOf(err) != bmc.KindPlugin || !strings.Contains(err.Error(), "did not answer power status of m-1") ||
		!strings.Contains(err.Error(), "it was killed and restarts") {
		t.Fatalf("hung plugin: %v", err)
	}
	if d := time.Since(start); d < l.host.CallTimeout-time.Second || d > l.host.CallTimeout+5*time.Second {
		t.Errorf("the hung call took %s (call timeout %s)", d, l.host.CallTimeout)
	}
	if p := l.power(t); p != bmc.PowerOff {
		t.Errorf("after the hang: %s", p)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		if st := procStatus(t, pid); !strings.HasPrefix(st["State"], "Z") {
			t.Errorf("the hung plugin %d is still there: %s", pid, st["State"])
		}
	}
	if st, _ := l.host.Status("bcx-ipmi"); st.Restarts != 2 {
		t.Errorf("status after the hang: %+v", st)
	}
	if !strings.Contains(l.logs.String(), "killed because it did not answer power status") {
		t.Errorf("the log does not say why the plugin was killed")
	}
}

// TestHungPluginFailsHealthCheck: a plugin that stops answering is killed by its
// health check and restarted even when no call is waiting on it.
func TestHungPluginFailsHealthCheck(t *testing.T) {
	l := newLab(t, nil, nil)
	l.power(t)
	pid := l.pluginPID(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(l.host.HealthInterval + DefaultHealthTimeout + 10*time.Second)
	for {
		st, _ := l.host.Status("bcx-ipmi")
		if st.Running && st.PID != pid {
			if !strings.Contains(st.LastError, "killed because it failed its health check") {
				t.Errorf("last error %q", st.LastError)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopped plugin was not replaced: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if p := l.power(t); p != bmc.PowerOff {
		t.Errorf("after the restart: %s", p)
	}
}

// TestWrongPasswordStaysSecret: a refused login is an auth error naming the user,
// and neither password appears in it.
func TestWrongPasswordStaysSecret(t *testing.T) {
	l := newLab(t, nil, nil)
	wrong := l.target
	wrong.Password = bmc.Secret("Wr0ng-" + labPassword[3:])
	_, err := l.drv.PowerStatus(l.ctx(t), wrong)
	l.note(err)
	if bmc.KindOf(err) != bmc.KindAuth || !strings.Contains(err.Error(), `refused the login of user "admin"`) {
		t.Fatalf("wrong password: %v (kind %s)", err, bmc.KindOf(err))
	}
	if strings.Contains(err.Error(), string(wrong.Password)) || strings.Contains(l.logs.String(), string(wrong.Password)) {
		t.Errorf("the wrong password shows: %v", err)
	}
	if p := l.power(t); p != bmc.PowerOff {
		t.Errorf("right password afterwards: %s", p)
	}
}

// TestPluginDrivesAVM: through bcx-ipmi, power off really ends QEMU, and boot
// device pxe plus power on really starts it with the NIC first: its command line
// says so and SeaBIOS boots from the NIC's ROM before anything else; disk does the
// opposite; a cycle replaces the QEMU process.
func TestPluginDrivesAVM(t *testing.T) {
	needLab(t)
	testenv.NeedTool(t, "qemu-system-x86_64")
	testenv.NeedTool(t, "socat")
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	vm := &testbed.VMConfig{Name: "m-1", Dir: filepath.Join(dir, "vm"), MemoryMB: 256, Tap: "tap0",
		MAC: "52:54:00:bc:d0:01", Disk: disk}
	l := newLab(t, vm, func(ns *testbed.Netns) {
		if err := ns.AddBridge("br0", "10.77.0.1/24"); err != nil {
			t.Fatal(err)
		}
		if err := ns.AddTap("tap0", "br0"); err != nil {
			t.Fatal(err)
		}
	})
	firstBoot := regexp.MustCompile(`Booting from [^.\r\n]*`)
	boot := func(device string) (pid int, cmdline, first string) {
		t.Helper()
		if err := l.note(l.drv.SetBootDevice(l.ctx(t), l.target, bmc.BootDevice{Device: device})); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := l.note(l.drv.PowerOn(l.ctx(t), l.target)); err != nil {
			t.Fatal(err)
		}
		pid, ok := l.vbmc.QEMUPID()
		if !ok {
			t.Fatalf("power on through bcx-ipmi started no QEMU\n%s", l.vbmc.Tail(20))
		}
		args, err := l.vbmc.QEMUCmdline()
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		first, err = l.vbmc.WaitSerial(ctx, firstBoot)
		if err != nil {
			t.Fatalf("%v\n%s", err, l.vbmc.Tail(30))
		}
		t.Logf("bootdev %s, power on: QEMU %d up in %s; SeaBIOS %q after %s", device, pid,
			time.Since(start).Round(time.Millisecond), first, time.Since(start).Round(100*time.Millisecond))
		return pid, strings.Join(args, " "), first
	}

	if p, q := l.power(t), l.ipmitoolPower(t); p != bmc.PowerOff || q != bmc.PowerOff {
		t.Fatalf("fresh machine: %s / %s", p, q)
	}
	pid, cmdline, first := boot(bmc.DevicePXE)
	if !strings.Contains(cmdline, "virtio-net-pci,netdev=n0,mac=52:54:00:bc:d0:01,bootindex=1") ||
		!strings.Contains(cmdline, "virtio-blk-pci,drive=d0,bootindex=2") {
		t.Errorf("pxe: QEMU's command line puts the NIC second: %s", cmdline)
	}
	if first != "Booting from ROM" {
		t.Errorf("pxe: SeaBIOS booted %q first, want the NIC's ROM", first)
	}
	if p, q := l.power(t), l.ipmitoolPower(t); p != bmc.PowerOn || q != bmc.PowerOn {
		t.Errorf("running VM: bcx-ipmi %s, ipmitool %s", p, q)
	}

	if err := l.note(l.drv.PowerOff(l.ctx(t), l.target)); err != nil {
		t.Fatal(err)
	}
	if testbed.ProcessRunning(pid) {
		t.Errorf("power off through bcx-ipmi: QEMU %d is still there", pid)
	}
	if p := l.power(t); p != bmc.PowerOff {
		t.Errorf("after power off: %s", p)
	}

	pid, cmdline, first = boot(bmc.DeviceDisk)
	if !strings.Contains(cmdline, "virtio-blk-pci,drive=d0,bootindex=1") {
		t.Errorf("disk: QEMU's command line puts the disk second: %s", cmdline)
	}
	if first != "Booting from Hard Disk" {
		t.Errorf("disk: SeaBIOS booted %q first", first)
	}

	// A cycle is off and on again: a new QEMU.
	if err := l.note(l.drv.PowerCycle(l.ctx(t), l.target)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p2, ok := l.vbmc.QEMUPID(); ok && p2 != pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("power cycle: no new QEMU\n%s", l.vbmc.Tail(20))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := l.note(l.drv.PowerOff(l.ctx(t), l.target)); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.vbmc.QEMUPID(); ok {
		t.Error("QEMU runs after the last power off")
	}
	t.Logf("chassis calls:\n%s", l.vbmc.Calls())
}

// TestPrivilegedPluginKeepsCapabilities: a plugin named in [plugins] privileged
// runs as bcd's uid with its capabilities and no seccomp filter.
func TestPrivilegedPluginKeepsCapabilities(t *testing.T) {
	l := newLab(t, nil, nil, func(h *Host) { h.Privileged = []string{"bcx-ipmi"} })
	l.power(t)
	st := procStatus(t, l.pluginPID(t))
	if !strings.HasPrefix(st["Uid"], "0\t") || st["CapEff"] == "0000000000000000" || st["Seccomp"] != "0" || st["NoNewPrivs"] != "0" {
		t.Errorf("privileged plugin: Uid %q CapEff %s Seccomp %s NoNewPrivs %s", st["Uid"], st["CapEff"], st["Seccomp"], st["NoNewPrivs"])
	}
}

// TestCrashLoopBacksOff: a plugin that exits at once is started again and again,
// each time a little later, and a call meanwhile fails with why.
func TestCrashLoopBacksOff(t *testing.T) {
	needLab(t)
	dir := t.TempDir()
	b, err := os.ReadFile("/bin/false")
	if err != nil {
		testenv.Skip(t, "no /bin/false to stand in for a crashing plugin")
	}
	if err := os.WriteFile(filepath.Join(dir, "crasher"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	writePins(t, dir, pins.Format("crasher", sha256.Sum256(b)))
	h, logs := newHost(t, dir)
	h.MinBackoff, h.MaxBackoff = 100*time.Millisecond, 400*time.Millisecond
	d, err := h.Driver("crasher")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = d.PowerStatus(ctx, nowhere)
	if bmc.KindOf(err) != bmc.KindPlugin || !strings.Contains(err.Error(), "plugin crasher did not come up in time (plugin crasher did not start") {
		t.Fatalf("call to a crashing plugin: %v", err)
	}
	var waits []string
	// The host keeps retrying after the call gave up; on a loaded machine the third
	// start can come well after the call's deadline, so wait for it on the log.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		waits = waits[:0]
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, `"plugin not started"`) && strings.Contains(line, `"plugin":"crasher"`) {
				if i := strings.Index(line, `"retry_in":`); i >= 0 {
					waits = append(waits, strings.TrimRight(strings.SplitN(line[i+len(`"retry_in":`):], ",", 2)[0], "}"))
				}
			}
		}
		if len(waits) >= 3 {
			break
		}
	}
	if len(waits) < 3 || waits[0] != "100000000" || waits[1] != "200000000" || waits[len(waits)-1] != "400000000" {
		t.Errorf("backoff between starts (ns): %v", waits)
	}
}

// TestDefaultLauncherIsThisBinary: without Launcher the host re-executes its own
// binary (here the test binary, which is a launcher as bcd is).
func TestDefaultLauncherIsThisBinary(t *testing.T) {
	testenv.NeedRoot(t)
	h, _ := newHost(t, pluginDir(t))
	h.Launcher = nil
	if _, err := h.Driver("bcx-ipmi"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _ := h.Status("bcx-ipmi")
		if st.Running {
			if st.UID <= 0 || st.PID <= 0 {
				t.Errorf("status %+v", st)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin did not start: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
