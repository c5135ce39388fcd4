package testbed

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestBootDiskBootsOnBothFirmwares proves the local-disk image the PXE tests fall
// through to: SeaBIOS (gptmbr + syslinux) and OVMF (a unified kernel image) each boot
// it to a marker on the serial console, without a network.
func TestBootDiskBootsOnBothFirmwares(t *testing.T) {
	kernel := needLab(t)
	for _, tool := range []string{"sgdisk", "mkfs.vfat", "mcopy", "syslinux", "objcopy"} {
		testenv.NeedTool(t, tool)
	}
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd")
	if err := BusyboxInitramfs(initrd, MarkerInit("BCD-LOCAL-DISK-BOOTED"), nil); err != nil {
		t.Fatal(err)
	}
	disk := BootDisk{Path: filepath.Join(dir, "disk.img"), Kernel: kernel, Initrd: initrd, Cmdline: "console=ttyS0 panic=-1"}
	if err := disk.Build(); err != nil {
		t.Fatal(err)
	}
	for _, fw := range []string{BIOS, UEFI} {
		t.Run(fw, func(t *testing.T) {
			vm, err := StartVM(nil, VMConfig{Name: "disk-" + fw, Dir: filepath.Join(dir, fw), Firmware: fw, Disk: disk.Path})
			if err != nil {
				t.Fatal(err)
			}
			defer vm.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`BCD-LOCAL-DISK-BOOTED`)); err != nil {
				t.Fatalf("%v\n%s", err, vm.Tail(40))
			}
			t.Log(fmt.Sprintf("%s: power-on to marker %s", fw, time.Since(vm.Started).Round(100*time.Millisecond)))
		})
	}
}
