package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

// buildFleetBinaries builds the three programs the fleet runs.
func buildFleetBinaries(t *testing.T, dir string) FleetBinaries {
	t.Helper()
	b := FleetBinaries{Bcd: filepath.Join(dir, "bcd"), BetterCompute: filepath.Join(dir, "better-compute"), BcxIPMI: filepath.Join(dir, "bcx-ipmi")}
	for out, pkg := range map[string]string{b.Bcd: "../cmd/bcd", b.BetterCompute: "../cmd/better-compute", b.BcxIPMI: "../plugins/bcx-ipmi"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if o, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, o)
		}
	}
	return b
}

// buildRamdisk runs make initramfs's script (cached under .cache/initramfs).
func buildRamdisk(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "initramfs.xz")
	cmd := exec.Command(filepath.Join(repoRoot(t), "initramfs/build.sh"), out, filepath.Join(repoRoot(t), ".cache/kernel/current"))
	cmd.Dir = repoRoot(t)
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initramfs/build.sh: %v\n%s", err, o)
	}
	return out
}

// TestFleet is the main flow, as an operator drives it: the control plane, a site
// agent joined with a site token, and two machines with virtual BMCs (SeaBIOS with
// iPXE, and OVMF with a TPM), each deployed with one command. The control plane
// takes each from there — BMC boot device and power, proxyDHCP, iPXE, the ramdisk's
// discovery join, inventory, deploy.image through the site's proxy, kexec, the
// installed OS's join — to provisioned with its node ready; then a BMC power cycle
// boots the installed disk through the local-boot answer and the node comes back
// with the same identity.
func TestFleet(t *testing.T) {
	kernel := needLab(t)
	for _, tool := range []string{"dnsmasq", "ipmi_sim", "ipmitool", "swtpm", "zstd", "socat", "sgdisk", "syslinux"} {
		testenv.NeedTool(t, tool)
	}
	dir := t.TempDir()
	bin := buildFleetBinaries(t, dir)
	ramdisk := buildRamdisk(t, dir)
	image := filepath.Join(dir, "testos.img")
	if err := (TestOS{Kernel: kernel, ModulesDir: modulesDir(t), Bcd: bin.Bcd,
		Cmdline: "console=ttyS0,115200 panic=30 bcd.proxy=http://" + proxyListen}).Build(image); err != nil {
		t.Fatal(err)
	}
	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: bin, Kernel: kernel, Ramdisk: ramdisk, Image: image, Log: testLog{t},
		Machines: []*FleetMachine{
			{Name: "bios1", Firmware: BIOS, MAC: "52:54:00:30:00:01"},
			{Name: "uefi1", Firmware: UEFI, MAC: "52:54:00:30:00:02", TPM: true},
		}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fail := func(err error) {
		t.Helper()
		t.Fatalf("%v\n%s", err, f.Diagnostics())
	}
	// The machine with a TPM has its EK enrolled: its ramdisk must prove that
	// TPM (credential activation) before deploy.image carries its token.
	tpmMachine := f.Machines[1]
	ek, err := ReadSWTPMEK(filepath.Join(tpmMachine.BMC.vmDir(), "tpm-state"))
	if err != nil {
		fail(err)
	}
	if _, err := f.BC("machines", "enroll-tpm", tpmMachine.Name, "--ek-sha256", ek); err != nil {
		fail(err)
	}
	for _, m := range f.Machines {
		if _, err := f.Deploy(m); err != nil {
			fail(err)
		}
	}
	for _, m := range f.Machines {
		if err := f.WaitState(ctx, m, "provisioned", 20*time.Minute); err != nil {
			fail(err)
		}
	}
	if out, err := f.BC("machines", "events", tpmMachine.Name); err != nil {
		fail(err)
	} else if strings.Contains(out, "deploy.held") || strings.Contains(out, "join.refused") || !strings.Contains(out, "proving TPM endorsement key "+ek) {
		fail(fmt.Errorf("machine %s, its EK enrolled: its ramdisk did not join proving it, or was refused or held:\n%s", tpmMachine.Name, out))
	}
	for _, m := range f.Machines {
		if id, session := f.node(m); id == "" || session == 0 {
			fail(fmt.Errorf("machine %s: its node is not connected (node %q)", m.Name, id))
		}
	}

	// The boot entry is local now: a power cycle boots the installed disk and the
	// node comes back as itself.
	m := f.Machines[0]
	before, _ := f.node(m)
	if _, err := f.BC("machines", "power", m.Name, "cycle"); err != nil {
		fail(err)
	}
	if err := f.WaitNodeBack(ctx, m, 10*time.Minute); err != nil {
		fail(fmt.Errorf("machine %s: the node did not come back after a power cycle: %w", m.Name, err))
	}
	if after, _ := f.node(m); after != before {
		fail(fmt.Errorf("machine %s came back as node %s, was %s", m.Name, after, before))
	}

	// Power off through the control plane, the site agent and the sandboxed plugin:
	// the VM's QEMU process is really gone, and the BMC then says off.
	u := f.Machines[1]
	pid, running := u.BMC.QEMUPID()
	if !running {
		fail(fmt.Errorf("machine %s: no QEMU running before power off", u.Name))
	}
	if _, err := f.BC("machines", "power", u.Name, "off"); err != nil {
		fail(err)
	}
	if err := waitFor(ctx, 30*time.Second, func() bool { return !ProcessRunning(pid) }); err != nil {
		fail(fmt.Errorf("machine %s: QEMU (pid %d) still runs after machines power off", u.Name, pid))
	}
	if out, err := f.BC("machines", "power", u.Name, "status"); err != nil || !strings.Contains(out, "off") {
		fail(fmt.Errorf("machine %s: machines power status after off: %q %v", u.Name, out, err))
	}

	// The faults a fleet meets, on the same lab, one after the other: each leaves
	// every machine provisioned with its node connected for the next.
	faults := []struct {
		name string
		run  func(t *testing.T, f *Fleet)
	}{
		{"BootdevPXEAndPowerOn", faultBootdevPXEAndPowerOn},
		{"PluginKilled", faultPluginKilled},
		{"GatewayRestartedMidDeploy", faultGatewayRestartedMidDeploy},
		{"PoweredOffMidDeploy", faultPoweredOffMidDeploy},
		{"SiteAgentRestartedWithoutControlPlane", faultSiteAgentRestarted},
	}
	for _, c := range faults {
		if !t.Run(c.name, func(t *testing.T) { c.run(t, f) }) {
			t.Logf("lab after %s:\n%s", c.name, f.Diagnostics())
			break
		}
	}
}

// faultBootdevPXEAndPowerOn: through the control plane, bootdev pxe (efi) and
// power on a machine that is off: its QEMU starts with the network first, it asks
// the site agent's proxyDHCP, and since its boot entry is local it boots its disk
// and the node comes back.
func faultBootdevPXEAndPowerOn(t *testing.T, f *Fleet) {
	ctx := context.Background()
	m := f.Machines[1]
	if _, running := m.BMC.QEMUPID(); running {
		t.Fatalf("machine %s should be off after TestFleet powered it off", m.Name)
	}
	// The session of the node powered off may still be open: the gateway drops a
	// session only after missed heartbeats. The node is back with another one.
	node, session := f.node(m)
	since := time.Now()
	args := []string{"machines", "bootdev", m.Name, "pxe"}
	if m.Firmware == UEFI {
		args = append(args, "--efi")
	}
	if _, err := f.BC(args...); err != nil {
		t.Fatal(err)
	}
	if got := m.BMC.BootDevice(); got != "pxe" {
		t.Fatalf("machine %s: the BMC's boot device is %q after machines bootdev pxe", m.Name, got)
	}
	if out, err := f.BC("machines", "power", m.Name, "on"); err != nil || !strings.Contains(out, "power is on") {
		t.Fatalf("machines power %s on: %q %v", m.Name, out, err)
	}
	if _, running := m.BMC.QEMUPID(); !running {
		t.Fatalf("machine %s: no QEMU after machines power on", m.Name)
	}
	if err := waitFor(ctx, 5*time.Minute, func() bool {
		st, _ := f.BootStages(m, since)
		for _, b := range st {
			if b.Stage == "dhcp" {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("machine %s: the site agent's proxyDHCP never answered it after bootdev pxe + power on: %v", m.Name, err)
	}
	if err := f.waitNodeSession(ctx, m, node, session, 10*time.Minute); err != nil {
		t.Fatalf("machine %s: the node did not come back after power on: %v", m.Name, err)
	}
	t.Logf("machine %s: node back %s after machines power on", m.Name, time.Since(since).Round(100*time.Millisecond))
}

// faultPluginKilled: the machine's BMC stops answering (ipmi_sim stopped with
// SIGSTOP, a known field failure), so a BMC operation through the control plane
// hangs in the plugin; kill -9 of the sandboxed bcx-ipmi then fails that
// operation with the reason, bcd site stays up, and once the BMC answers again the
// next operation succeeds through a new plugin process.
func faultPluginKilled(t *testing.T, f *Fleet) {
	ctx := context.Background()
	m := f.Machines[0]
	if _, err := f.BC("machines", "power", m.Name, "status"); err != nil {
		t.Fatal(err)
	}
	pids := f.PluginPIDs()
	if len(pids) != 1 {
		t.Fatalf("want one bcx-ipmi under bcd site (pid %d), found %v", f.SiteAgent().PID(), pids)
	}
	bmcPID := m.BMC.proc.PID()
	if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", bmcPID)); strings.TrimSpace(string(comm)) != "ipmi_sim" {
		t.Fatalf("the BMC's process %d is %q, want ipmi_sim", bmcPID, comm)
	}
	if err := syscall.Kill(bmcPID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			syscall.Kill(bmcPID, syscall.SIGCONT)
		}
	}()
	logStart := fileSize(f.SiteAgent().Log)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := f.BC("machines", "power", m.Name, "status")
		done <- result{out, err}
	}()
	// The site agent has the command (it logs it before the plugin gets the call):
	// the plugin is now waiting on a BMC that does not answer.
	if err := waitFor(ctx, time.Minute, func() bool {
		b, _ := os.ReadFile(f.SiteAgent().Log)
		return int64(len(b)) > logStart && strings.Contains(string(b[logStart:]), `"kind":"bmc.power"`)
	}); err != nil {
		t.Fatalf("bcd site never ran the bmc.power command:\n%s", f.SiteAgent().Tail(20))
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("machines power status did not return after the plugin was killed")
	}
	if r.err == nil || !strings.Contains(r.err.Error(), "died during power status") {
		t.Fatalf("the operation in flight when the plugin was killed: %q %v, want it FAILED saying the plugin died", r.out, r.err)
	}
	t.Logf("in flight when bcx-ipmi was killed: %v", r.err)
	if err := syscall.Kill(bmcPID, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	out, err := f.BC("machines", "power", m.Name, "status")
	if err != nil || !strings.Contains(out, "power is on") {
		t.Fatalf("the first BMC operation after the plugin was killed: %q %v", out, err)
	}
	select {
	case <-f.SiteAgent().Exited():
		t.Fatalf("bcd site exited with the plugin: %v", f.SiteAgent().Err())
	default:
	}
	if now := f.PluginPIDs(); len(now) != 1 || now[0] == pids[0] {
		t.Errorf("bcx-ipmi processes after the restart: %v (the killed one was %d)", now, pids[0])
	}
}

// faultGatewayRestartedMidDeploy: better-compute serve (api and gateway) stops and
// starts again while the ramdisk streams the image; the ramdisk reconnects, the
// lifecycle resumes from the store, and the machine ends provisioned with an
// installed OS that really boots and joins — never good when it is not.
func faultGatewayRestartedMidDeploy(t *testing.T, f *Fleet) {
	ctx := context.Background()
	m := f.Machines[0]
	if _, err := f.Deploy(m); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitState(ctx, m, "deploying", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	f.StopControlPlane()
	stopped := time.Now()
	t.Logf("machine %s: control plane stopped while deploying", m.Name)
	if err := f.StartControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitState(ctx, m, "provisioned", 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	// The restart really fell inside deploy.image: its end reached the new serve.
	evs, err := f.Events(m)
	if err != nil {
		t.Fatal(err)
	}
	var installing time.Time
	for _, e := range evs {
		if e.Kind == protocol.MachineEventState && strings.HasPrefix(e.Message, "installing") {
			installing = e.Time
		}
	}
	if !installing.After(stopped) {
		t.Fatalf("machine %s: deploy.image ended at %s, before the control plane stopped at %s: the restart did not happen mid-deploy", m.Name, installing, stopped)
	}
	t.Logf("machine %s: deploy.image ended %s after the control plane stopped", m.Name, installing.Sub(stopped).Round(100*time.Millisecond))
	if id, session := f.node(m); id == "" || session == 0 {
		t.Fatalf("machine %s is provisioned but its node %q is not connected", m.Name, id)
	}
}

// faultPoweredOffMidDeploy: the machine's BMC powers it off while the ramdisk
// streams the image (an operator at the BMC, not the control plane). The
// machine's timeline says its ramdisk disconnected during deploy.image; it is
// never installing or provisioned from that attempt; the lifecycle boots it into
// the ramdisk again and the second deploy succeeds.
func faultPoweredOffMidDeploy(t *testing.T, f *Fleet) {
	ctx := context.Background()
	m := f.Machines[1]
	if _, err := f.Deploy(m); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitState(ctx, m, "deploying", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	out, err := m.BMC.Ipmitool(octx, "chassis", "power", "off")
	cancel()
	if err != nil {
		t.Fatalf("ipmitool chassis power off: %v %s", err, out)
	}
	off := time.Now()
	if state, reason, _ := f.MachineState(m); state != "deploying" {
		t.Fatalf("machine %s was powered off mid-deploy but its state is %s %s (a deploy that short proves nothing)", m.Name, state, reason)
	}
	// The state must say so: the lifecycle notes the lost ramdisk, then, past the
	// grace period, boots it again into the ramdisk with that reason.
	var states []string
	if err := waitFor(ctx, 5*time.Minute, func() bool {
		s, r, err := f.MachineState(m)
		if err != nil {
			return false
		}
		if len(states) == 0 || states[len(states)-1] != s+": "+r {
			states = append(states, s+": "+r)
		}
		return s != "deploying"
	}); err != nil {
		t.Fatalf("machine %s: still deploying 5 min after its BMC powered it off: %v", m.Name, err)
	}
	state, reason, _ := f.MachineState(m)
	if state == "installing" || state == "provisioned" {
		t.Fatalf("machine %s powered off mid-deploy went to %s (%s): a deploy that did not finish was taken as good", m.Name, state, reason)
	}
	if !strings.Contains(reason, "disconnected during deploy.image") {
		t.Fatalf("machine %s after power off: %s %q, want the reason to say the ramdisk disconnected during deploy.image (states %q)", m.Name, state, reason, states)
	}
	t.Logf("machine %s %s after its BMC powered it off: %s", m.Name, time.Since(off).Round(time.Second), reason)
	if err := f.WaitState(ctx, m, "provisioned", 15*time.Minute); err != nil {
		t.Fatal(err)
	}
	evs, err := f.Events(m)
	if err != nil {
		t.Fatal(err)
	}
	var notes int
	for _, e := range evs {
		if !e.Time.Before(off.Add(-time.Second)) && strings.Contains(e.Message, "disconnected during deploy.image") {
			notes++
		}
	}
	if notes == 0 {
		t.Errorf("machine %s: no timeline event after the power off says the ramdisk disconnected during deploy.image", m.Name)
	}
}

// faultSiteAgentRestarted: with the control plane down, bcd site restarts; it
// serves from the boot table it kept, so a machine power-cycled at its BMC meanwhile
// is answered (its boot entry is local: it boots its disk). When the control plane
// is back the site's queued machine.booted events reach the machine's timeline, and
// the node comes back.
func faultSiteAgentRestarted(t *testing.T, f *Fleet) {
	ctx := context.Background()
	m := f.Machines[0]
	node, session := f.node(m)
	qemu, _ := m.BMC.QEMUPID()
	f.StopControlPlane()
	f.StopSiteAgent()
	restarted := time.Now()
	if err := f.StartSiteAgentOffline(ctx); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(f.SiteAgent().Log); !strings.Contains(string(b), "applying the saved spec") {
		t.Fatalf("bcd site restarted without applying its saved spec:\n%s", f.SiteAgent().Tail(20))
	}
	octx, cancel := context.WithTimeout(ctx, time.Minute)
	out, err := m.BMC.Ipmitool(octx, "chassis", "power", "cycle")
	cancel()
	if err != nil {
		t.Fatalf("ipmitool chassis power cycle: %v %s", err, out)
	}
	// The machine boots its disk (the local answer) and its node tries to reach a
	// gateway that is not there; give it until the installed OS's init runs.
	if err := waitNewQEMU(ctx, m, qemu, time.Minute); err != nil {
		t.Fatalf("machine %s: no new QEMU after the BMC's power cycle: %v", m.Name, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	_, err = m.BMC.WaitSerial(wctx, regexp.MustCompile(`bcd-testos: init`))
	cancel()
	if err != nil {
		t.Fatalf("machine %s did not boot its disk while the control plane was down: %v", m.Name, err)
	}
	if err := f.StartControlPlane(ctx); err != nil {
		t.Fatal(err)
	}
	var served []BootStage
	if err := waitFor(ctx, 3*time.Minute, func() bool {
		served, _ = f.BootStages(m, restarted)
		return len(served) > 0
	}); err != nil {
		t.Fatalf("machine %s: no machine.booted from the restarted site agent reached the timeline: %v", m.Name, err)
	}
	t.Logf("machine %s: the restarted site agent served %d boot stages while the control plane was down (first %s %s)", m.Name, len(served), served[0].Stage, served[0].File)
	if err := f.waitNodeSession(ctx, m, node, session, 10*time.Minute); err != nil {
		t.Fatalf("machine %s: the node did not come back: %v", m.Name, err)
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
