package simlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/sim"
)

var (
	bins Binaries
	// sessionbench is the sim/simlab/sessionbench binary, the load generator
	// of TestSessionBench.
	sessionbench string
	buildErr     error
)

func TestMain(m *testing.M) {
	if spoofRole() {
		return
	}
	dir, err := os.MkdirTemp("", "bcd-simlab-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins = Binaries{Bcd: filepath.Join(dir, "bcd"), BetterCompute: filepath.Join(dir, "better-compute"), BcxIPMI: filepath.Join(dir, "bcx-ipmi")}
	sessionbench = filepath.Join(dir, "sessionbench")
	for bin, pkg := range map[string]string{bins.Bcd: "../../cmd/bcd", bins.BetterCompute: "../../cmd/better-compute", bins.BcxIPMI: "../../plugins/bcx-ipmi",
		sessionbench: "./sessionbench"} {
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
	return newLabWith(t, machines, nil)
}

// newLabWith is newLab with opts changing the Lab before it starts.
func newLabWith(t *testing.T, machines int, opts func(*Lab)) *Lab {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	l := &Lab{Dir: t.TempDir(), Bin: bins, Log: logWriter{t}}
	if opts != nil {
		opts(l)
	}
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

// TestSimMetrics is the boot storm in make test (the only 200-machine run in
// it): 200 machines, half BIOS and half UEFI, deployed at once through one site
// agent and one serve; every one must end provisioned with a complete timeline
// and a node session. Then it scrapes both endpoints and checks the figures
// against what the run did: every machine answered by the proxyDHCP, sent its
// iPXE binary over TFTP and its script, kernel and initrd over HTTP,
// power-cycled through bcx-ipmi, joined as a ramdisk and then as its installed
// node, and provisioned, with its image's bytes counted.
func TestSimMetrics(t *testing.T) {
	const n = 200
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	l := &Lab{Dir: t.TempDir(), Bin: bins, Log: logWriter{t}, MetricsServe: SiteIP + ":9465", MetricsSite: SiteIP + ":9464"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := l.Start(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	const image = 4 << 20
	start := time.Now()
	r, err := l.Run(ctx, Options{Machines: n, ImageSize: image, Timeout: 3 * time.Minute})
	check(t, l, r, err)
	t.Logf("%d machines provisioned in %s (run %s)", n, r.Provision.Round(time.Millisecond), time.Since(start).Round(time.Second))
	if r.Provisioned != n || r.Sessions != n {
		t.Fatalf("sim: %d provisioned, %d sessions of %d", r.Provisioned, r.Sessions, n)
	}
	scrape := func(addr string) metricstest.Families {
		body, err := l.Metrics(addr)
		if err != nil {
			t.Fatalf("scrape %s: %v", addr, err)
		}
		return metricstest.Parse(t, body)
	}
	type L = metricstest.Labels
	atLeast := func(f metricstest.Families, name string, ls L, want float64) {
		t.Helper()
		if got := f.Get(t, name, ls); got < want {
			t.Errorf("%s%v = %v, want at least %v (the run's %d machines)", name, ls, got, want, n)
		}
	}
	exactly := func(f metricstest.Families, name string, ls L, want float64) {
		t.Helper()
		if got := f.Get(t, name, ls); got != want {
			t.Errorf("%s%v = %v, want %v", name, ls, got, want)
		}
	}

	site := scrape(l.MetricsSite)
	atLeast(site, "bcd_site_dhcp_answers_total", L{"kind": "offer"}, n)
	atLeast(site, "bcd_site_tftp_transfers_total", nil, n)
	atLeast(site, "bcd_site_http_requests_total", L{"route": "script"}, n)
	atLeast(site, "bcd_site_http_requests_total", L{"route": "kernel"}, n)
	atLeast(site, "bcd_site_http_requests_total", L{"route": "initrd"}, n)
	atLeast(site, "bcd_site_http_bytes_total", L{"route": "kernel"}, float64(n*l.KernelSize))
	atLeast(site, "bcd_site_events_journaled_total", nil, 5*n) // dhcp, tftp, script, kernel, initrd
	atLeast(site, "bcd_site_bmc_operation_duration_seconds", L{"op": "power-cycle"}, n)
	exactly(site, "bcd_site_tftp_errors_total", L{"code": "2"}, 0)
	exactly(site, "bcd_site_events_dropped_total", nil, 0)
	if failed, _ := site.Sum("bcd_site_bmc_operation_failures_total", nil); failed != 0 {
		t.Errorf("%v BMC operations failed in a run without faults: %s", failed, site.Names("bcd_site_bmc"))
	}

	cp := scrape(l.MetricsServe)
	exactly(cp, "better_compute_machines", L{"state": "provisioned"}, n)
	exactly(cp, "better_compute_machines", L{"state": "failed"}, 0)
	exactly(cp, "better_compute_sessions", L{"role": "site"}, 1)
	// sim's nodes and ramdisks left with it: the gauge came back down (the
	// gateway keeps no session of a node that went away). Live sessions by
	// role are checked in controlplane's TestMetricsAfterDeployments.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		nodes, _ := cp.Sum("better_compute_sessions", L{"role": "node"})
		ramdisks, _ := cp.Sum("better_compute_sessions", L{"role": "ramdisk"})
		if nodes == 0 && ramdisks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%v node and %v ramdisk sessions 10 s after sim exited, want 0", nodes, ramdisks)
			break
		}
		cp = scrape(l.MetricsServe)
	}
	exactly(cp, "better_compute_joins_total", L{"attestor": "provisioned", "code": "OK"}, n)
	atLeast(cp, "better_compute_joins_total", L{"attestor": "discovery", "code": "OK"}, n)
	exactly(cp, "better_compute_deploy_duration_seconds", L{"outcome": "provisioned"}, n)
	exactly(cp, "better_compute_deploy_image_duration_seconds", nil, n)
	exactly(cp, "better_compute_deploy_image_bytes_total", nil, n*image)
	atLeast(cp, "better_compute_agent_events_total", L{"kind": "machine.booted"}, 5*n)
	atLeast(cp, "better_compute_agent_events_total", L{"kind": "boot.nonce"}, n)
}

// TestSimFaults restarts serve and then the site agent while 40 machines boot:
// every machine must still end provisioned, or failed with a reason; none stuck.
func TestSimFaults(t *testing.T) {
	l := newLab(t, 40)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	r, err := l.Run(ctx, Options{Machines: 40, Timeout: 6 * time.Minute, Faults: []sim.Fault{
		{Name: "restart better-compute serve", After: 2 * time.Second, Do: l.RestartServe},
		{Name: "restart bcd site", After: 4 * time.Second, Do: l.RestartSite},
	}})
	if r == nil {
		t.Fatalf("sim run: %v\n%s", err, l.Diagnostics())
	}
	// A fault after the last machine settled tested nothing. (The run takes
	// about 6 s here: the site's restart at +6 s landed after most machines
	// had left it.)
	if len(r.Faults) != 2 {
		t.Fatalf("the run settled before its faults: only %q happened", r.Faults)
	}
	if !r.Settled() {
		t.Fatalf("not every machine settled (provisioned, or failed with a reason): %v\n%s", err, l.Diagnostics())
	}
}
