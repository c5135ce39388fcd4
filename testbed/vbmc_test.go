package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// StayUpInit is an /init that prints marker with the boot's uptime and then idles,
// so a machine stays on until its BMC turns it off.
func stayUpInit(marker string) string {
	return `#!/bin/sh
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t devtmpfs dev /dev
tpm=no
[ -e /dev/tpm0 ] && tpm=yes
echo "` + marker + ` up=$(/bin/busybox cut -d' ' -f1 /proc/uptime) tpm=$tpm"
while true; do /bin/busybox sleep 3600; done
`
}

func needVBMC(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ipmi_sim")
	testenv.NeedTool(t, "ipmitool")
	testenv.NeedTool(t, "ip")
}

func powerStatus(t *testing.T, b *VBMC) string {
	t.Helper()
	out, err := b.Ipmitool(context.Background(), "chassis", "power", "status")
	if err != nil {
		t.Fatalf("%v\n%s", err, b.Tail(20))
	}
	return strings.TrimSpace(out)
}

// TestVBMCWithoutVM: ipmi_sim on a namespace's loopback answers ipmitool, and its
// chassis program keeps the power state and boot device.
func TestVBMCWithoutVM(t *testing.T) {
	needVBMC(t)
	ns, err := NewNetns(fmt.Sprintf("bcdvb%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	b := &VBMC{Name: "dummy", Dir: t.TempDir(), Port: 6230, Netns: ns}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if got := powerStatus(t, b); got != "Chassis Power is off" {
		t.Errorf("fresh machine: %q", got)
	}
	if _, err := b.Ipmitool(context.Background(), "chassis", "power", "on"); err != nil {
		t.Fatal(err)
	}
	if got := powerStatus(t, b); got != "Chassis Power is on" {
		t.Errorf("after power on: %q", got)
	}
	if _, err := b.Ipmitool(context.Background(), "chassis", "bootdev", "pxe"); err != nil {
		t.Fatal(err)
	}
	if b.BootDevice() != "pxe" {
		t.Errorf("boot device %q\n%s", b.BootDevice(), b.Calls())
	}
	// Nothing listens outside the namespace.
	if _, err := (&VBMC{Name: "x", Port: 6230}).Ipmitool(context.Background(), "mc", "info"); err == nil {
		t.Error("the BMC answered outside its namespace")
	}
}

// TestVBMCPowersAVM: power on through IPMI really starts QEMU, which boots; reset
// reboots it without QEMU exiting; power off really ends QEMU; the boot device
// picks the command line.
func TestVBMCPowersAVM(t *testing.T) {
	needVBMC(t)
	kernel := needLab(t)
	testenv.NeedTool(t, "socat")
	testenv.NeedTool(t, "swtpm")
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd")
	if err := BusyboxInitramfs(initrd, stayUpInit("BCD-VBMC-UP"), nil); err != nil {
		t.Fatal(err)
	}
	b := &VBMC{Name: "vm1", Dir: filepath.Join(dir, "bmc"), Port: 16230 + os.Getpid()%1000, TPM: true,
		VM: &VMConfig{Name: "vm1", Dir: filepath.Join(dir, "vm"), MemoryMB: 256, Kernel: kernel, Initrd: initrd,
			Append: "console=ttyS0 panic=-1 quiet", Disk: filepath.Join(dir, "disk.img")}}
	if err := os.WriteFile(b.VM.Disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	if _, err := b.Ipmitool(ctx, "chassis", "bootdev", "pxe"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Ipmitool(ctx, "chassis", "power", "on"); err != nil {
		t.Fatal(err)
	}
	pid, ok := b.QEMUPID()
	if !ok {
		t.Fatalf("power on started no QEMU\n%s", b.Tail(20))
	}
	args, err := b.QEMUCmdline()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(args, " "), "virtio-blk-pci,drive=d0,bootindex=2") {
		t.Errorf("bootdev pxe, but the disk is not second: %q", args)
	}
	up := regexp.MustCompile(`BCD-VBMC-UP up=\S+ tpm=\w+`)
	line, err := b.WaitSerial(ctx, up)
	if err != nil {
		t.Fatalf("%v\n%s", err, b.Tail(30))
	}
	if !strings.HasSuffix(line, "tpm=yes") {
		t.Errorf("the guest has no TPM from swtpm: %q", line)
	}
	if got := powerStatus(t, b); got != "Chassis Power is on" {
		t.Errorf("running VM: %q", got)
	}

	if _, err := b.Ipmitool(ctx, "chassis", "power", "reset"); err != nil {
		t.Fatal(err)
	}
	twice := regexp.MustCompile(`(?s)BCD-VBMC-UP.*BCD-VBMC-UP`)
	if _, err := b.WaitSerial(ctx, twice); err != nil {
		t.Fatalf("no second boot after reset: %v\n%s", err, b.Tail(30))
	}
	if p2, ok := b.QEMUPID(); !ok || p2 != pid {
		t.Errorf("reset replaced QEMU (%d → %d, %v): it should reboot the same VM", pid, p2, ok)
	}

	if _, err := b.Ipmitool(ctx, "chassis", "power", "off"); err != nil {
		t.Fatal(err)
	}
	if ProcessRunning(pid) {
		t.Errorf("QEMU %d still runs after power off", pid)
	}
	if got := powerStatus(t, b); got != "Chassis Power is off" {
		t.Errorf("after power off: %q", got)
	}

	if _, err := b.Ipmitool(ctx, "chassis", "bootdev", "disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Ipmitool(ctx, "chassis", "power", "on"); err != nil {
		t.Fatal(err)
	}
	args, err = b.QEMUCmdline()
	if err != nil {
		t.Fatalf("%v\n%s", err, b.Tail(20))
	}
	if !strings.Contains(strings.Join(args, " "), "virtio-blk-pci,drive=d0,bootindex=1") {
		t.Errorf("bootdev disk, but the disk is not first: %q", args)
	}
	t.Logf("chassis calls:\n%s", b.Calls())
}
