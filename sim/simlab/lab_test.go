package simlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/sim"
)

var (
	bins     Binaries
	buildErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bcd-simlab-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins = Binaries{Bcd: filepath.Join(dir, "bcd"), BetterCompute: filepath.Join(dir, "better-compute"), BcxIPMI: filepath.Join(dir, "bcx-ipmi")}
	for bin, pkg := range map[string]string{bins.Bcd: "../../cmd/bcd", bins.BetterCompute: "../../cmd/better-compute", bins.BcxIPMI: "../../plugins/bcx-ipmi"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// logWriter sends lines to t.Log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }

func newLab(t *testing.T, machines int) *Lab {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	l := &Lab{Dir: t.TempDir(), Bin: bins, Log: logWriter{t}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := l.Start(ctx, machines); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// check fails the test unless every machine was provisioned with a complete
// timeline and a node session, printing the services' logs and a timeline.
func check(t *testing.T, l *Lab, r *sim.Result, err error) {
	t.Helper()
	if err != nil || r == nil || !r.OK() {
		if r != nil && len(r.MachineNames) > 0 {
			t.Logf("machines events %s:\n%s", r.MachineNames[0], l.Events(r.MachineNames[0]))
		}
		t.Fatalf("sim run: %v\n%s", err, l.Diagnostics())
	}
}

// TestSimFew plays a few machines (BIOS and UEFI) through the whole path.
func TestSimFew(t *testing.T) {
	l := newLab(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	r, err := l.Run(ctx, Options{Machines: 4, Timeout: 3 * time.Minute})
	check(t, l, r, err)
	for _, s := range []string{"dhcp", "tftp", "script", "kernel", "initrd", "join", "inventory", "deploy", "node_join", "session"} {
		if r.Stages[s].N != 4 {
			t.Errorf("stage %s measured on %d machines, want 4", s, r.Stages[s].N)
		}
	}
}

// TestSim200 is the boot storm in make test: 200 machines, half BIOS and half
// UEFI, deployed at once through one site agent and one serve; every one must end
// provisioned with a complete timeline and a node session. About a minute here.
func TestSim200(t *testing.T) {
	l := newLab(t, 200)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	r, err := l.Run(ctx, Options{Machines: 200, Timeout: 5 * time.Minute})
	check(t, l, r, err)
	t.Logf("200 machines provisioned in %s (run %s)", r.Provision.Round(time.Millisecond), time.Since(start).Round(time.Second))
}

// TestSimFaults restarts serve and then the site agent while 40 machines boot:
// every machine must still end provisioned, or failed with a reason; none stuck.
func TestSimFaults(t *testing.T) {
	l := newLab(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, err := l.Run(ctx, Options{Machines: 40, Timeout: 6 * time.Minute, Faults: []sim.Fault{
		{Name: "restart better-compute serve", After: 2 * time.Second, Do: l.RestartServe},
		{Name: "restart bcd site", After: 6 * time.Second, Do: l.RestartSite},
	}})
	if r == nil {
		t.Fatalf("sim run: %v\n%s", err, l.Diagnostics())
	}
	if !r.Settled() {
		t.Fatalf("not every machine settled (provisioned, or failed with a reason): %v\n%s", err, l.Diagnostics())
	}
}
