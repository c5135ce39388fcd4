package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// repoRoot is two levels up from this package's directory in every checkout.
func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// needLab skips (or fails under BCD_REQUIRE_ALL=1) unless this machine can run VMs.
func needLab(t *testing.T) string {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "qemu-system-x86_64")
	testenv.NeedTool(t, "ip")
	testenv.NeedTool(t, "cpio")
	kernel := KernelPath(repoRoot(t))
	if _, err := os.Stat(kernel); err != nil {
		testenv.Skip(t, "no kernel at "+kernel+" (run scripts/fetch-kernel.sh)")
	}
	return kernel
}

// TestDirectBoot proves the launcher: Debian's kernel with a busybox initramfs prints
// a marker carrying a value only this test put on its command line.
func TestDirectBoot(t *testing.T) {
	kernel := needLab(t)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd")
	if err := BusyboxInitramfs(initrd, MarkerInit("BCD-MARKER-UP"), nil); err != nil {
		t.Fatal(err)
	}
	token := fmt.Sprintf("bcdtest.token=%d", time.Now().UnixNano())
	vm, err := StartVM(nil, VMConfig{Name: "direct", Dir: filepath.Join(dir, "vm"), Kernel: kernel, Initrd: initrd,
		Append: "console=ttyS0 panic=-1 " + token})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`cmdline: .*`+regexp.QuoteMeta(token))); err != nil {
		t.Fatalf("%v\n%s", err, vm.Tail(40))
	}
	if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`BCD-MARKER-UP`)); err != nil {
		t.Fatalf("%v\n%s", err, vm.Tail(40))
	}
	t.Logf("kernel to marker in %s (accelerator %s)", time.Since(vm.Started).Round(100*time.Millisecond), Accelerator())
}

// TestNetnsBridge proves a namespace with a bridge and a tap, and that Do binds inside it.
func TestNetnsBridge(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	ns, err := NewNetns(fmt.Sprintf("bcdtb%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	if err := ns.AddBridge("br0", "10.99.0.1/24"); err != nil {
		t.Fatal(err)
	}
	if err := ns.AddTap("tap0", "br0"); err != nil {
		t.Fatal(err)
	}
	out, err := ns.Command("ip", "-o", "addr", "show", "br0").CombinedOutput()
	if err != nil || !regexp.MustCompile(`10\.99\.0\.1/24`).Match(out) {
		t.Fatalf("bridge address missing: %v %s", err, out)
	}
	// The host must not see the namespace's bridge.
	if err := exec.Command("ip", "link", "show", "br0").Run(); err == nil {
		t.Log("note: the host has its own br0; not ours")
	}
}
