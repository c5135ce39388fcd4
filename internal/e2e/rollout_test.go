package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Self-update through the whole stack on loopback (spec "Self-update", "From v0.4:
// rollouts and self-update"): fakehw bcd node processes whose [update]
// slots_dir and entrypoint are in temp dirs, a real better-compute serve
// with --release-pins serving the releases' bare binaries from its https
// downloads route, and the real exec of the new binary. fakehw builds never
// write systemd units, and they honour BCD_TEST_UPDATE_DEADLINE, so the
// deadline of an update that never confirms is seconds, not 120.

// fakeRelease is a fakehw bcd of one version, signed as a release.
type fakeRelease struct {
	version  string
	bin      string // the bare binary
	manifest string
}

// fakeBuilds are the builds fakehwVersion made: "version tags" → *fakeBuild.
var fakeBuilds sync.Map

type fakeBuild struct {
	once sync.Once
	bin  string
	err  error
}

// fakehwVersion builds bcd with the fakehw tag (and tags) as version, once
// per test binary.
func fakehwVersion(t *testing.T, version, tags string) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	v, _ := fakeBuilds.LoadOrStore(version+" "+tags, &fakeBuild{})
	b := v.(*fakeBuild)
	b.once.Do(func() {
		b.bin = filepath.Join(binDir, "bcd-fakehw-"+version)
		all := "fakehw"
		if tags != "" {
			all += "," + tags
		}
		cmd := exec.Command("go", "build", "-tags="+all, "-ldflags", "-X github.com/better-compute/bcd/internal/version.Version="+version, "-o", b.bin, "../../cmd/bcd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build -tags %s bcd %s: %v\n%s", all, version, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

// releaseKey makes a release signing key and returns its path and pin.
func releaseKey(t *testing.T) (string, string) {
	t.Helper()
	key := filepath.Join(t.TempDir(), "release.key")
	out, err := exec.Command(bcBin, "release", "keygen", "--out", key).Output()
	if err != nil {
		t.Fatalf("release keygen: %v", err)
	}
	return key, strings.TrimSpace(string(out))
}

// signRelease puts bin as version's bare binary for this platform into its
// own release directory and into downloads (serve's --downloads-dir), and
// signs the release with key at seq.
func signRelease(t *testing.T, downloads, key, bin, version string, seq int) fakeRelease {
	t.Helper()
	dist := filepath.Join(t.TempDir(), "dist-"+version)
	name := pki.BinaryName("bcd", version, "linux", runtime.GOARCH)
	os.MkdirAll(dist, 0o755)
	for _, dst := range []string{filepath.Join(dist, name), filepath.Join(downloads, name)} {
		copyFile(t, bin, dst)
	}
	if out, err := exec.Command(bcBin, "release", "sign", "--product", "bcd", "--version", version, "--sequence", fmt.Sprint(seq),
		"--expires", "2h", "--key", key, dist).CombinedOutput(); err != nil {
		t.Fatalf("release sign %s: %v\n%s", version, err, out)
	}
	return fakeRelease{version: version, bin: filepath.Join(dist, name), manifest: filepath.Join(dist, pki.ManifestFile)}
}

// updatingNode is a bcd node whose entrypoint and slots are its own.
type updatingNode struct {
	h     host
	id    string
	entry string
	proc  *agentProcess
}

// startUpdatingNode joins a node of site fsn1 (created by the caller) with
// bin copied to its entrypoint, [update] pinning pin, and starts bcd node
// from the entrypoint with env.
func startUpdatingNode(t *testing.T, cp *controlPlane, bin, pin string, env ...string) *updatingNode {
	t.Helper()
	h := newHost(t, cp, "fsn1")
	n := &updatingNode{h: h, entry: filepath.Join(h.dir, "usr-local-bin", "bcd")}
	os.MkdirAll(filepath.Dir(n.entry), 0o755)
	copyFile(t, bin, n.entry)
	appendFile(t, h.config, fmt.Sprintf("\n[update]\nrelease_pins = %q\nrelease_threshold = 1\nrelease_sequence = 1\nslots_dir = %q\nentrypoint = %q\n",
		pin, filepath.Join(h.dir, "slots"), n.entry))
	if r := run(t, n.entry, []string{"BCD_JOIN_TOKEN=" + cp.token("fsn1", "node")}, "", "join", "--config", h.config); r.code != 0 {
		t.Fatalf("bcd join: %s\nserve log:\n%s", r, cp.log)
	}
	n.id = identityNodeID(t, h.data)
	n.proc = startAgentBin(t, n.entry, env, "node", "--config", h.config)
	return n
}

// update is the node's bcd update -o json, run with its entrypoint.
func (n *updatingNode) update(t *testing.T) selfUpdateStatus {
	t.Helper()
	r := run(t, n.entry, nil, "", "update", "-o", "json", "--config", n.h.config)
	var st selfUpdateStatus
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st.Status) != nil {
		t.Fatalf("bcd update -o json: %s", r)
	}
	st.raw = r.stdout
	return st
}

// selfUpdateStatus is bcd update -o json and its text.
type selfUpdateStatus struct {
	selfupdate.Status
	raw string
}

func (s selfUpdateStatus) version(slot string) string { return s.Slots[slot].Version }

// rollout creates a rollout and waits for it to reach state.
func (cp *controlPlane) rollout(t *testing.T, state string, timeout time.Duration, logs func() string, args ...string) apitype.Rollout {
	t.Helper()
	out := cp.mustBC(append([]string{"rollouts", "create"}, args...)...)
	id, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(id, "ro_") {
		t.Fatalf("rollouts create printed %q, want ro_… on its first line", out)
	}
	var ro apitype.Rollout
	deadline := time.Now().Add(timeout)
	for {
		if err := json.Unmarshal([]byte(cp.mustBC("rollouts", "show", id, "-o", "json")), &ro); err != nil {
			t.Fatal(err)
		}
		if ro.State == state {
			return ro
		}
		if ro.State != "running" || time.Now().After(deadline) {
			t.Fatalf("rollout %s: %s (%s), want %s within %s: %+v\nserve log:\n%s\n%s", id, ro.State, ro.Reason, state, timeout, ro, cp.log, logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestSelfUpdateRollout: two nodes on 0.1.0 take a rollout of 0.1.1 in
// waves 50,100 (the real swap, the exec of the new binary and its Welcome),
// then a rollout of 0.1.2, a build that never reaches its Welcome, pauses
// with UpdateFailed once its first node swapped back by its (5 s) deadline.
func TestSelfUpdateRollout(t *testing.T) {
	t.Parallel()
	began := time.Now()
	key, pin := releaseKey(t)
	downloads := t.TempDir()
	v010 := fakehwVersion(t, "0.1.0", "")
	r011 := signRelease(t, downloads, key, fakehwVersion(t, "0.1.1", ""), "0.1.1", 2)
	r012 := signRelease(t, downloads, key, fakehwVersion(t, "0.1.2", "labfault_nowelcome"), "0.1.2", 3)
	t.Logf("builds: %s", time.Since(began).Round(time.Millisecond))

	cp := newControlPlane(t, "--release-pins", pin, "--downloads-dir", downloads)
	cp.mustBC("sites", "create", "fsn1")
	env := []string{"BCD_TEST_UPDATE_DEADLINE=5s"}
	nodes := []*updatingNode{startUpdatingNode(t, cp, v010, pin, env...), startUpdatingNode(t, cp, v010, pin, env...)}
	logs := func() string {
		var b strings.Builder
		for _, n := range nodes {
			fmt.Fprintf(&b, "--- node %s log:\n%s\n", n.id, n.proc.log)
		}
		return b.String()
	}
	for _, n := range nodes {
		cp.waitNode(n.id, 60*time.Second, "connected on 0.1.0", func(r nodeRow) bool { return r.Connected && r.DaemonVersion == "0.1.0" })
	}
	if out := cp.mustBC("releases", "add", r011.manifest); !strings.Contains(out, "release 0.1.1 (sequence 2) added") {
		t.Fatalf("releases add: %q", out)
	}
	at := time.Now()
	ro := cp.rollout(t, "succeeded", 90*time.Second, logs, "--version", "0.1.1", "--pool", "pool_e2e", "--waves", "50,100")
	t.Logf("rollout of 0.1.1 succeeded in %s: %s", time.Since(at).Round(time.Millisecond), ro.Reason)
	waves := map[int]bool{}
	for _, n := range ro.Nodes {
		waves[n.Wave] = true
		if n.State != "succeeded" {
			t.Errorf("rollout node %s: %s %s", n.Node, n.State, n.Reason)
		}
	}
	if len(ro.Nodes) != 2 || len(waves) != 2 {
		t.Errorf("rollout nodes %+v: want one in each of two waves", ro.Nodes)
	}
	for _, n := range nodes {
		// The new binary reports the section once welcomed, maybe just after
		// the rollout saw it rejoin.
		cp.waitNode(n.id, 30*time.Second, "connected on 0.1.1 with the daemon section SUCCEEDED", func(r nodeRow) bool {
			return r.DaemonVersion == "0.1.1" && r.Connected && r.DaemonSection != nil && r.DaemonSection.State == protocol.SectionSucceeded &&
				r.DaemonSection.Version == "0.1.1"
		})
		st := n.update(t)
		if st.version(st.Current) != "0.1.1" || st.version(st.Previous) != "0.1.0" || st.Floor != 2 || !st.EntrypointLinked || st.Pending != nil {
			t.Errorf("node %s: bcd update %s: want current 0.1.1, previous 0.1.0 (adopted), floor 2, the entrypoint linked", n.id, st.raw)
		}
		if target, err := os.Readlink(n.entry); err != nil || target != filepath.Join(n.h.dir, "slots", "current") {
			t.Errorf("node %s: entrypoint links to %q (%v), want the slots' current", n.id, target, err)
		}
	}
	if t.Failed() {
		t.Fatalf("serve log:\n%s\n%s", cp.log, logs())
	}

	// 0.1.2 never dials: the first wave's node swaps back, the rollout pauses.
	cp.mustBC("releases", "add", r012.manifest)
	at = time.Now()
	ro = cp.rollout(t, "paused", 90*time.Second, logs, "--version", "0.1.2", "--pool", "pool_e2e", "--waves", "50,100")
	t.Logf("rollout of 0.1.2 paused in %s: %s", time.Since(at).Round(time.Millisecond), ro.Reason)
	if !strings.Contains(ro.Reason, protocol.ReasonUpdateFailed) {
		t.Errorf("rollout paused with %q, want the reason to name %s", ro.Reason, protocol.ReasonUpdateFailed)
	}
	var failed *updatingNode
	for _, rn := range ro.Nodes {
		for _, n := range nodes {
			if rn.Node == n.id && rn.State == "failed" {
				failed = n
			}
		}
	}
	if failed == nil {
		t.Fatalf("rollout %+v: no failed node\n%s", ro, logs())
	}
	row := cp.waitNode(failed.id, 30*time.Second, "back on 0.1.1", func(r nodeRow) bool { return r.Connected && r.DaemonVersion == "0.1.1" })
	if s := row.DaemonSection; s == nil || s.State != protocol.SectionFailed || s.Reason != protocol.ReasonUpdateFailed || !strings.Contains(s.Message, "did not start") {
		t.Errorf("node %s: daemon section %+v, want FAILED UpdateFailed", failed.id, row.DaemonSection)
	}
	st := failed.update(t)
	if st.version(st.Current) != "0.1.1" || len(st.Failed) != 1 || st.Failed[0].Version != "0.1.2" || st.Floor != 2 {
		t.Errorf("node %s: bcd update %s: want back on 0.1.1 with 0.1.2 failed, floor 2", failed.id, st.raw)
	}
	for _, n := range nodes {
		if n != failed {
			if r := cp.node(t, n.id); r.DaemonVersion != "0.1.1" {
				t.Errorf("node %s of the second wave left 0.1.1 while the rollout paused: %+v", n.id, r)
			}
		}
	}
	if t.Failed() {
		t.Fatalf("serve log:\n%s\n%s", cp.log, logs())
	}
	t.Logf("TestSelfUpdateRollout: %s", time.Since(began).Round(time.Millisecond))
}

// TestSelfUpdateUpgradeRequired: behind a gateway whose minimum protocol
// version is 2, a node speaking 1 (BCD_TEST_PROTOCOL_VERSION) is
// upgrade_required: its session takes only daemon.upgrade, and the rollout
// controller sends it one; the node ends on the new version and the command
// SUCCEEDED (the new process inherits the variable, so it stays
// upgrade_required, but its Welcome still confirms the update).
func TestSelfUpdateUpgradeRequired(t *testing.T) {
	t.Parallel()
	key, pin := releaseKey(t)
	downloads := t.TempDir()
	v010 := fakehwVersion(t, "0.1.0", "")
	r011 := signRelease(t, downloads, key, fakehwVersion(t, "0.1.1", ""), "0.1.1", 2)
	cp := newControlPlane(t, "--release-pins", pin, "--downloads-dir", downloads, "--min-protocol-version", "2")
	cp.mustBC("sites", "create", "fsn1")
	n := startUpdatingNode(t, cp, v010, pin, "BCD_TEST_PROTOCOL_VERSION=1", "BCD_TEST_UPDATE_DEADLINE=20s")
	logs := func() string { return fmt.Sprintf("--- node %s log:\n%s\n", n.id, n.proc.log) }
	cp.waitNode(n.id, 60*time.Second, "connected on 0.1.0", func(r nodeRow) bool { return r.Connected && r.DaemonVersion == "0.1.0" })
	cp.mustBC("releases", "add", r011.manifest)
	at := time.Now()
	ro := cp.rollout(t, "succeeded", 90*time.Second, logs, "--version", "0.1.1", "--pool", "pool_e2e", "--waves", "100")
	if len(ro.Nodes) != 1 || ro.Nodes[0].CommandID == "" {
		t.Fatalf("rollout %+v: want its one node sent a daemon.upgrade", ro)
	}
	var cmd apitype.Command
	if err := json.Unmarshal([]byte(cp.mustBC("commands", "get", ro.Nodes[0].CommandID, "-o", "json")), &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.Kind != protocol.KindDaemonUpgrade || cmd.State != protocol.StateSucceeded {
		t.Errorf("command %s: %+v, want daemon.upgrade SUCCEEDED", ro.Nodes[0].CommandID, cmd)
	}
	row := cp.waitNode(n.id, 30*time.Second, "connected on 0.1.1", func(r nodeRow) bool { return r.Connected && r.DaemonVersion == "0.1.1" })
	if st := n.update(t); st.version(st.Current) != "0.1.1" || st.Floor != 2 || st.Pending != nil {
		t.Errorf("bcd update %s: want 0.1.1 confirmed (floor 2, nothing pending)", st.raw)
	}
	sent := false
	for _, e := range ro.Timeline {
		sent = sent || strings.Contains(e.Message, ro.Nodes[0].CommandID) && strings.Contains(e.Message, "below 2")
	}
	if !sent {
		t.Errorf("the rollout's timeline does not say it sent %s for protocol below 2: %+v", ro.Nodes[0].CommandID, ro.Timeline)
	}
	if l := n.proc.log.String(); !strings.Contains(l, "upgrade_required=true") && !strings.Contains(l, `"upgrade_required":true`) {
		t.Errorf("the node did not log that its session is upgrade_required")
	}
	if t.Failed() {
		t.Fatalf("node %+v\nserve log:\n%s\n%s", row, cp.log, logs())
	}
	t.Logf("upgrade_required node on 0.1.1 through daemon.upgrade %s in %s", ro.Nodes[0].CommandID, time.Since(at).Round(time.Millisecond))
}
