//go:build e2edebian

package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/nodeagent/installscript"
	"github.com/better-compute/bcd/pki"
)

// TestDebianTPM is issue 13's proof in the Debian flavour: machines that join
// with their TPM through the install script generated with --attestor tpm, from
// a release scripts/release.sh built and signed, in the same lab as
// TestDebianFleet's script machine. Three VMs boot the Debian disk at once:
//
//   - tpm1 has a TPM (swtpm, tpm-tis, which Debian's kernel drives: /dev/tpmrm0)
//     whose EK the test read from swtpm's state before the boot and enrolled
//     (tpm enroll --pool tpm-enrolled, a pool whose policy then admits only tpm
//     joins). Its script installs, joins and starts bcd.service; node.key is the
//     TPM's record (BCD TPM NODE KEY); the node is ready in tpm-enrolled. The
//     same script run again (the upgrade run) returns at the join at once and
//     leaves the node ready.
//   - tpm2 has a TPM whose EK nobody enrolled, but its MAC is a registered
//     machine of the site (machines add): its join waits (join.deferred on the
//     machine) until machines approve, then the node is ready and machines show
//     names its EK.
//   - notpm has no TPM: the script stops before installing anything, with its
//     message, non-zero.
func TestDebianTPM(t *testing.T) {
	lab := newDebianLab(t, "swtpm")
	kernel, began, dir, repo, bin, ramdisk, image := lab.kernel, lab.began, lab.dir, lab.repo, lab.bin, lab.ramdisk, lab.image
	dist, releasePin := buildDebianRelease(t, bin, repo, dir)

	f := &Fleet{Dir: filepath.Join(dir, "lab"), Bin: bin, Kernel: kernel, Ramdisk: ramdisk, Image: image, Log: testLog{t},
		Downloads: dist, ProxyAllow: []string{apiAddr}}
	ctx := context.Background()
	if err := f.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	type machine struct {
		name, mac, state string
		vm               *VM
		bootAt           time.Time
	}
	tpm1 := &machine{name: "tpm1", mac: "52:54:00:31:00:11", state: filepath.Join(dir, "tpm1-state")}
	tpm2 := &machine{name: "tpm2", mac: "52:54:00:31:00:12", state: filepath.Join(dir, "tpm2-state")}
	notpm := &machine{name: "notpm", mac: "52:54:00:31:00:13"}
	all := []*machine{tpm1, tpm2, notpm}
	fail := func(err error) {
		t.Helper()
		var b strings.Builder
		for _, m := range all {
			if m.vm != nil {
				b.WriteString(m.vm.Tail(60))
			}
		}
		b.WriteString(f.Diagnostics())
		if out, err := f.BC("machines", "events", tpm2.name); err == nil {
			fmt.Fprintf(&b, "--- machines events %s\n%s\n", tpm2.name, out)
		}
		t.Fatalf("%v\n%s", err, b.String())
	}

	// The EKs, read from the TPMs' state before they boot, as an operator reads
	// them off a delivery note or a first boot.
	ek1, err := ReadSWTPMEK(tpm1.state)
	if err != nil {
		fail(err)
	}
	ek2, err := ReadSWTPMEK(tpm2.state)
	if err != nil {
		fail(err)
	}
	if again, err := ReadSWTPMEK(tpm1.state); err != nil || again != ek1 {
		fail(fmt.Errorf("tpm1's swtpm state gives EK %s, then %s (%v): not the same TPM", ek1, again, err))
	}
	if ek1 == ek2 {
		fail(fmt.Errorf("tpm1 and tpm2 have the same EK %s", ek1))
	}
	t.Logf("EKs: tpm1 %s (enrolled), tpm2 %s (not enrolled)", ek1, ek2)
	for _, args := range [][]string{
		{"tpm", "enroll", "--site", "lab", "--pool", "tpm-enrolled", "--ek-sha256", ek1},
		{"pools", "set-policy", "tpm-enrolled", "--join-attestors", "tpm"},
		{"machines", "add", "--site", "lab", "--name", tpm2.name, "--mac", tpm2.mac},
	} {
		if _, err := f.BC(args...); err != nil {
			fail(err)
		}
	}

	gen := exec.Command(bin.BetterCompute, "daemon", "install-script", "--pool", "tpm-enrolled", "--site", "lab",
		"--gateway-url", GatewayURL, "--base-url", APIURL, "--bcd-version", debianRelease, "--attestor", "tpm",
		"--release-manifest", filepath.Join(dist, pki.ManifestFile), "--release-pins", releasePin, "--pki", f.PKIDir())
	script, err := gen.Output()
	if err != nil {
		fail(fmt.Errorf("daemon install-script --attestor tpm: %v", err))
	}
	seed := filepath.Join(dir, "seed")
	os.MkdirAll(seed, 0o700)
	for name, data := range map[string][]byte{"install-bcd.sh": script, "rerun": nil} {
		if err := os.WriteFile(filepath.Join(seed, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range all {
		disk := filepath.Join(dir, m.name+".img")
		files := []DebianSeed{
			{Path: "/etc/bcd-lab-install/install-bcd.sh", Src: filepath.Join(seed, "install-bcd.sh"), Mode: 0o600},
			{Path: "/etc/bcd-lab-install/ca.crt", Src: f.ServingCACert(), Mode: 0o644},
		}
		if m == tpm1 {
			// tpm1 runs the script a second time once it is ready: the upgrade run.
			files = append(files, DebianSeed{Path: "/etc/bcd-lab-install/rerun", Src: filepath.Join(seed, "rerun"), Mode: 0o600})
		}
		// A plain Debian without bcd; no join token anywhere.
		if err := PlainDebianDisk(image, disk, []string{"/etc/bcd-lab-install"}, files); err != nil {
			t.Fatal(err)
		}
		m.bootAt = time.Now()
		if m.vm, err = f.StartDiskVMWith(DiskVM{Name: m.name, MAC: m.mac, Disk: disk, TPMState: m.state}); err != nil {
			fail(err)
		}
		defer m.vm.Stop()
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	exited := regexp.MustCompile(`bcd-lab: install script exited \d+`)
	starting := regexp.MustCompile(`bcd-lab: install script starting \([^\r\n]*\)`)
	// The test waits on one machine after the other; the timings come from a
	// watcher that notes when each script started and each node was first ready.
	clock := &labClock{at: map[string]time.Time{}}
	go func() {
		for i := 0; wctx.Err() == nil; i++ {
			for _, m := range all {
				if b, _ := os.ReadFile(m.vm.Serial); starting.Match(b) {
					clock.mark(m.name + " start")
				}
			}
			if i%4 == 0 {
				nodes, _ := f.Nodes()
				for _, n := range nodes {
					if n.State == "ready" && n.Connected {
						clock.mark("node " + n.ID)
					}
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
	}()

	// --- notpm: the script stops before it installs anything.
	line, err := notpm.vm.WaitConsole(wctx, starting)
	if err != nil {
		fail(err)
	}
	if !strings.Contains(line, "/dev/tpmrm0 absent") {
		fail(fmt.Errorf("notpm: %s", line))
	}
	exit, err := notpm.vm.WaitConsole(wctx, exited)
	if err != nil {
		fail(err)
	}
	after, err := notpm.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: after the script: [^\r\n]*`))
	if err != nil {
		fail(err)
	}
	serial, _ := os.ReadFile(notpm.vm.Serial)
	logConsole(t, notpm.name, serial)
	if strings.HasSuffix(exit, " 0") {
		fail(fmt.Errorf("notpm: %s, want non-zero without /dev/tpmrm0", exit))
	}
	if !strings.Contains(string(serial), "install-bcd: /dev/tpmrm0 (the kernel's TPM resource manager) is missing: this script joins with the TPM") {
		fail(fmt.Errorf("notpm: the script did not say that /dev/tpmrm0 is missing"))
	}
	if want := "/usr/local/bin/bcd absent, /etc/systemd/system/bcd.service absent, /etc/bcd/config.toml absent"; !strings.Contains(after, want) {
		fail(fmt.Errorf("notpm: %s, want %s", after, want))
	}
	t.Logf("notpm: the script stopped (%s), nothing installed; boot → script start %s", exit, clock.get("notpm start").Sub(notpm.bootAt).Round(time.Second))
	notpm.vm.Stop() // its core for the others

	// --- tpm1: enrolled, joins into tpm-enrolled with the node key in its TPM.
	if line, err = tpm1.vm.WaitConsole(wctx, starting); err != nil {
		fail(err)
	}
	if !strings.Contains(line, "/dev/tpmrm0 present") {
		fail(fmt.Errorf("tpm1: %s: the guest's kernel does not drive the TPM", line))
	}
	n1, err := waitPoolNode(wctx, f, "tpm-enrolled", 20*time.Minute)
	if err != nil {
		fail(fmt.Errorf("tpm1: %w", err))
	}
	scriptAt, ready1 := clock.get("tpm1 start"), clock.get("node "+n1.ID)
	if !strings.Contains(n1.DaemonVersion, debianRelease) {
		fail(fmt.Errorf("tpm1: node %s runs bcd %q, want the release's %s", n1.ID, n1.DaemonVersion, debianRelease))
	}
	if exit, err = tpm1.vm.WaitConsole(wctx, exited); err != nil {
		fail(err)
	}
	if !strings.HasSuffix(exit, " 0") {
		fail(fmt.Errorf("tpm1: %s", exit))
	}
	if _, err := tpm1.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: systemctl is-active bcd: \S+`)); err != nil {
		fail(err)
	}
	key, err := tpm1.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: node.key: [^\r\n]*`))
	if err != nil {
		fail(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(key), "-----BEGIN BCD TPM NODE KEY-----") {
		fail(fmt.Errorf("tpm1: %s, want the TPM's record", key))
	}
	serial, _ = os.ReadFile(tpm1.vm.Serial)
	if err := checkHardened(string(serial), installscript.UnitPath); err != nil {
		fail(fmt.Errorf("tpm1: %w", err))
	}
	if !strings.Contains(string(serial), "bcd-lab: install-bcd.sh: bcd "+debianRelease+" installed, joined and started.") {
		fail(fmt.Errorf("tpm1: the script did not say it installed, joined and started bcd"))
	}
	t.Logf("tpm1: node %s ready in pool %s (bcd %s); boot → script start %s, script start → node ready %s, boot → node ready %s",
		n1.ID, n1.Pool, n1.DaemonVersion, scriptAt.Sub(tpm1.bootAt).Round(time.Second), ready1.Sub(scriptAt).Round(time.Second),
		ready1.Sub(tpm1.bootAt).Round(time.Second))

	// --- tpm2: not enrolled, a registered machine's MAC: the join waits.
	if line, err = tpm2.vm.WaitConsole(wctx, starting); err != nil {
		fail(err)
	}
	if !strings.Contains(line, "/dev/tpmrm0 present") {
		fail(fmt.Errorf("tpm2: %s", line))
	}
	var events string
	if err := waitFor(wctx, 10*time.Minute, func() bool {
		events, _ = f.BC("machines", "events", tpm2.name)
		return strings.Contains(events, ek2)
	}); err != nil {
		fail(fmt.Errorf("tpm2: no deferred tpm join on the machine's timeline naming EK %s:\n%s", ek2, events))
	}
	deferredAt := time.Now()
	// Deferred, it keeps waiting: still no exit 15 s on.
	time.Sleep(15 * time.Second)
	if b, _ := os.ReadFile(tpm2.vm.Serial); exited.Match(b) {
		fail(fmt.Errorf("tpm2: the script ended before the machine was approved"))
	}
	for _, n := range mustNodes(t, f) {
		if n.ID != n1.ID && n.Role == "node" {
			fail(fmt.Errorf("tpm2: a node %+v before the approval", n))
		}
	}
	if _, err := f.BC("machines", "approve", tpm2.name); err != nil {
		fail(err)
	}
	approvedAt := time.Now()
	if exit, err = tpm2.vm.WaitConsole(wctx, exited); err != nil {
		fail(err)
	}
	if !strings.HasSuffix(exit, " 0") {
		fail(fmt.Errorf("tpm2: %s", exit))
	}
	n2, err := waitReadyNode(wctx, f, "after the approval", func(n FleetNode) bool { return n.ID != n1.ID }, 10*time.Minute)
	if err != nil {
		fail(fmt.Errorf("tpm2: %w", err))
	}
	ready2 := clock.get("node " + n2.ID)
	show, err := f.BC("machines", "show", tpm2.name)
	if err != nil {
		fail(err)
	}
	if !regexp.MustCompile(`TPM EK:\s+` + ek2).MatchString(show) {
		fail(fmt.Errorf("tpm2: machines show names no TPM EK %s:\n%s", ek2, show))
	}
	if key, err = tpm2.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: node.key: [^\r\n]*`)); err != nil {
		fail(err)
	}
	if !strings.HasSuffix(strings.TrimSpace(key), "-----BEGIN BCD TPM NODE KEY-----") {
		fail(fmt.Errorf("tpm2: %s, want the TPM's record", key))
	}
	serial, _ = os.ReadFile(tpm2.vm.Serial)
	logConsole(t, tpm2.name, serial)
	t.Logf("tpm2: node %s ready in pool %s; boot → script start %s, → deferral seen %s, approve → node ready %s, boot → node ready %s (with the wait for the approval)",
		n2.ID, n2.Pool, clock.get("tpm2 start").Sub(tpm2.bootAt).Round(time.Second), deferredAt.Sub(tpm2.bootAt).Round(time.Second),
		ready2.Sub(approvedAt).Round(time.Second), ready2.Sub(tpm2.bootAt).Round(time.Second))
	for _, l := range strings.Split(strings.TrimSpace(show), "\n") {
		if strings.HasPrefix(l, "TPM EK:") || strings.HasPrefix(l, "NODE:") {
			t.Logf("tpm2: machines show: %s", l)
		}
	}

	// --- tpm1's upgrade run: the join returns at once, the node stays ready.
	rerun, err := tpm1.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: install script rerun exited \d+ in \d+ ms`))
	if err != nil {
		fail(err)
	}
	if !strings.Contains(rerun, "exited 0 ") {
		fail(fmt.Errorf("tpm1: %s", rerun))
	}
	if _, err := tpm1.vm.WaitConsole(wctx, regexp.MustCompile(`bcd-lab: after the rerun: systemctl is-active bcd: active`)); err != nil {
		fail(err)
	}
	serial, _ = os.ReadFile(tpm1.vm.Serial)
	logConsole(t, tpm1.name, serial)
	if !regexp.MustCompile(`bcd-lab: rerun: already joined`).Match(serial) ||
		!strings.Contains(string(serial), "bcd-lab: rerun: bcd upgraded to "+debianRelease+" and restarted.") {
		fail(fmt.Errorf("tpm1: the upgrade run did not return at the join (already joined) and restart bcd"))
	}
	var again FleetNode
	if err := waitFor(wctx, 5*time.Minute, func() bool {
		nodes, _ := f.Nodes()
		for _, n := range nodes {
			if n.ID == n1.ID {
				again = n
				return n.State == "ready" && n.Connected
			}
		}
		return false
	}); err != nil {
		fail(fmt.Errorf("tpm1: after the upgrade run node %s is not ready and connected (%+v)", n1.ID, again))
	}
	if nodes := mustNodes(t, f); len(nodes) != 2 {
		fail(fmt.Errorf("nodes after the upgrade run: %+v, want tpm1's and tpm2's", nodes))
	}
	t.Logf("tpm1: upgrade run %s; node %s ready again (session %d → %d)", strings.TrimPrefix(rerun, "bcd-lab: "), n1.ID, n1.SessionID, again.SessionID)
	t.Logf("TestDebianTPM: %s in all", time.Since(began).Round(time.Second))
}

func mustNodes(t *testing.T, f *Fleet) []FleetNode {
	t.Helper()
	nodes, err := f.Nodes()
	if err != nil {
		t.Fatal(err)
	}
	var out []FleetNode
	for _, n := range nodes {
		if n.Role == "node" {
			out = append(out, n)
		}
	}
	return out
}

// labClock holds when things first happened, by name.
type labClock struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (c *labClock) mark(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.at[k]; !ok {
		c.at[k] = time.Now()
	}
}

// get is when k happened; now if the watcher has not seen it yet (the test saw
// it first).
func (c *labClock) get(k string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if at, ok := c.at[k]; ok {
		return at
	}
	now := time.Now()
	c.at[k] = now
	return now
}
