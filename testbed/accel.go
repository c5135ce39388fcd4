package testbed

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

var (
	accelOnce sync.Once
	accel     string
)

// KernelPath is where scripts/fetch-kernel.sh unpacks Debian's kernel, relative to the
// repository root; BCD_KERNEL overrides it.
func KernelPath(repoRoot string) string {
	if k := os.Getenv("BCD_KERNEL"); k != "" {
		return k
	}
	return filepath.Join(repoRoot, ".cache/kernel/current/vmlinuz")
}

// Accelerator returns "kvm" only when a probe boot proves KVM runs a stock kernel here,
// else "tcg". BCD_ACCEL=tcg|kvm overrides the probe. On the machines this project
// runs on /dev/kvm exists but cannot boot Debian's kernel (nested kvm_pvm), so a
// /dev/kvm that merely opens proves nothing.
func Accelerator() string {
	accelOnce.Do(func() {
		switch a := os.Getenv("BCD_ACCEL"); a {
		case "tcg", "kvm":
			accel = a
			return
		}
		accel = "tcg"
		if _, err := os.Stat("/dev/kvm"); err != nil {
			return
		}
		if probeKVM() {
			accel = "kvm"
		}
	})
	return accel
}

func probeKVM() bool {
	kernel := os.Getenv("BCD_KERNEL")
	if kernel == "" {
		// Walk up from the working directory to the repository's kernel cache.
		dir, _ := os.Getwd()
		for dir != "/" && dir != "" {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				kernel = KernelPath(dir)
				break
			}
			dir = filepath.Dir(dir)
		}
	}
	if _, err := os.Stat(kernel); err != nil {
		return false
	}
	dir, err := os.MkdirTemp("", "bcd-kvm-probe-")
	if err != nil {
		return false
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initrd")
	if err := BusyboxInitramfs(initrd, MarkerInit("BCD-KVM-PROBE-OK"), nil); err != nil {
		return false
	}
	vm, err := StartVM(nil, VMConfig{Name: "kvm-probe", Dir: dir, Accel: "kvm", MemoryMB: 256,
		Kernel: kernel, Initrd: initrd, Append: "console=ttyS0 panic=-1 quiet"})
	if err != nil {
		return false
	}
	defer vm.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := vm.WaitConsole(ctx, regexp.MustCompile(`BCD-KVM-PROBE-OK`))
	return err == nil && strings.Contains(m, "OK")
}
