package testbed

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"
)

// buildBcd builds the static bcd binary the lab's images and agents run.
func buildBcd(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(dir, "bcd")
	cmd := exec.Command("go", "build", "-o", out, "../cmd/bcd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build bcd: %v\n%s", err, b)
	}
	return out
}

// TestTestOSBoots: the image the lab deploys boots from its disk under both
// firmwares, mounts its root and reaches bcd join (which, with no configuration,
// fails: this test has no control plane).
func TestTestOSBoots(t *testing.T) {
	kernel := needLab(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "testos.img")
	o := TestOS{Kernel: kernel, ModulesDir: modulesDir(t), Bcd: buildBcd(t, dir), Cmdline: "console=ttyS0 panic=-1 bcd.proxy=http://10.20.0.2:3128"}
	if err := o.Build(img); err != nil {
		t.Fatal(err)
	}
	for _, fw := range []string{BIOS, UEFI} {
		t.Run(fw, func(t *testing.T) {
			vm, err := StartVM(nil, VMConfig{Name: "testos-" + fw, Dir: filepath.Join(dir, fw), Firmware: fw, Disk: img})
			if err != nil {
				t.Fatal(err)
			}
			defer vm.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`bcd-testos: root /dev/vda2, proxy http://10\.20\.0\.2:3128`)); err != nil {
				t.Fatalf("%v\n%s", err, vm.Tail(40))
			}
			if _, err := vm.WaitConsole(ctx, regexp.MustCompile(`bcd-testos: bcd join exited`)); err != nil {
				t.Fatalf("%v\n%s", err, vm.Tail(40))
			}
			t.Logf("%s: power-on to bcd join %s", fw, time.Since(vm.Started).Round(100*time.Millisecond))
		})
	}
}

func modulesDir(t *testing.T) string {
	t.Helper()
	matches, _ := filepath.Glob(filepath.Join(repoRoot(t), ".cache/kernel/current/lib/modules/*"))
	if len(matches) != 1 {
		t.Fatalf("no kernel modules under .cache/kernel/current (run scripts/fetch-kernel.sh)")
	}
	return matches[0]
}
