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
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
