package operator

import (
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// releaseKey makes a release signing key and returns it with its pin.
func releaseKey(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "release.key")
	pin, err := pki.GenerateReleaseKey(path)
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.LoadReleaseKey(path)
	if err != nil {
		t.Fatal(err)
	}
	return k, pin
}

// manifestFile signs a release of bcd version (sequence seq, expiring at
// expires) with an amd64 binary and writes its manifest.json.
func manifestFile(t *testing.T, k *ecdsa.PrivateKey, version string, seq int64, expires time.Time) string {
	t.Helper()
	data, err := pki.SignRelease(pki.Release{Product: "bcd", Version: version, Sequence: seq, Expires: expires,
		Artifacts: []pki.Artifact{{Name: pki.BinaryName("bcd", version, "linux", "amd64"), Size: 3, SHA256: strings.Repeat("ab", 32)}}},
		[]*ecdsa.PrivateKey{k})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "manifest.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestReleasesAddNeedsPins(t *testing.T) {
	controlPlane(t)
	k, _ := releaseKey(t)
	code, _, errOut := runCLI(t, "", "releases", "add", manifestFile(t, k, "0.1.1", 2, time.Now().Add(time.Hour)))
	if code != 1 || !strings.Contains(errOut, "serve has no --release-pins: releases add verifies every manifest under the operator's release pins") {
		t.Errorf("releases add without pins: %d %s", code, errOut)
	}
}

func TestReleasesAndRollouts(t *testing.T) {
	k, pin := releaseKey(t)
	other, _ := releaseKey(t)
	s, _ := controlPlaneWith(t, func(s *controlplane.Server) {
		s.ReleasePins, s.RolloutTick = []string{pin}, 50*time.Millisecond
	})
	good := manifestFile(t, k, "0.1.1", 2, time.Now().Add(time.Hour))

	// Refusals: an unpinned key, an expired manifest, an http URL base.
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unpinned key", []string{"releases", "add", manifestFile(t, other, "0.1.1", 2, time.Now().Add(time.Hour))}, 1, "RELEASE_UNTRUSTED"},
		{"expired", []string{"releases", "add", manifestFile(t, k, "0.1.1", 2, time.Now().Add(-time.Minute))}, 1, "RELEASE_EXPIRED"},
		{"http url base", []string{"releases", "add", good, "--url-base", "http://x"}, 1, "INVALID_INPUT"},
	} {
		if code, _, errOut := runCLI(t, "", c.args...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %d %s, want %d %s", c.name, code, errOut, c.code, c.want)
		}
	}
	code, out, errOut := runCLI(t, "", "releases", "add", good)
	if code != 0 || out != "release 0.1.1 (sequence 2) added\n" {
		t.Fatalf("releases add: %d %q %s", code, out, errOut)
	}
	if code, out, _ = runCLI(t, "", "releases", "add", good); code != 0 || out != "release 0.1.1 (sequence 2) added\n" {
		t.Errorf("the same manifest again: %d %q", code, out)
	}
	if code, _, errOut = runCLI(t, "", "releases", "add", manifestFile(t, k, "0.1.1", 3, time.Now().Add(2*time.Hour))); code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") {
		t.Errorf("another manifest for 0.1.1: %d %s", code, errOut)
	}
	code, out, _ = runCLI(t, "", "releases", "list", "-o", "json")
	var rels []apitype.Release
	if code != 0 || json.Unmarshal([]byte(out), &rels) != nil || len(rels) != 1 || rels[0].Binaries[0].URL != s.APIURL()+"/downloads/bcd/0.1.1/linux-amd64" {
		t.Fatalf("releases list: %d %s", code, out)
	}

	// A connected node at 0.1.0 on amd64.
	ctx := context.Background()
	st := s.Store()
	now := time.Now()
	st.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: now})
	const node = "n_01jz0000000000000000000001"
	if err := st.Admit(ctx, store.Admission{Node: store.Node{ID: node, Role: "node", Site: "fsn1", Pool: "pool_a", SPIFFEID: "spiffe://x/node/n",
		CertSerial: "1", CertNotAfter: now.Add(time.Hour), State: protocol.NodeReady}, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.OpenSession(ctx, store.Session{NodeID: node, Role: "node", DaemonVersion: "0.1.0", DaemonArch: "amd64", ProtocolVersion: 1, ConnectedAt: now}); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"rollouts", "create", "--version", "9.9.9"}, 1, "NOT_FOUND"},
		{[]string{"rollouts", "create", "--version", "0.1.1", "--waves", "50,10,100"}, 1, "INVALID_INPUT"},
		{[]string{"rollouts", "create", "--version", "0.1.1", "--waves", "10,50"}, 1, "the last wave must be 100"},
		{[]string{"rollouts", "create", "--version", "0.1.1", "--role", "ramdisk"}, 2, "want node or site"},
		{[]string{"rollouts", "create"}, 2, "--version"},
	} {
		if code, _, errOut := runCLI(t, "", c.args...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: %d %s, want %d %s", c.args, code, errOut, c.code, c.want)
		}
	}
	code, out, errOut = runCLI(t, "", "rollouts", "create", "--version", "0.1.1", "--pool", "pool_a", "--waves", "50,100", "--wave-timeout", "10m")
	if code != 0 || !regexp.MustCompile(`^ro_[0-9a-z]{26}\n`).MatchString(out) {
		t.Fatalf("rollouts create: %d %q %s", code, out, errOut)
	}
	id := strings.SplitN(out, "\n", 2)[0]
	if code, _, errOut = runCLI(t, "", "rollouts", "create", "--version", "0.1.1"); code != 1 || !strings.Contains(errOut, "ALREADY_EXISTS") || !strings.Contains(errOut, id) {
		t.Errorf("a second rollout over the same nodes: %d %s", code, errOut)
	}
	// The controller starts the node: its daemon target is set.
	var ro apitype.Rollout
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, out, _ = runCLI(t, "", "rollouts", "show", id, "-o", "json")
		if code != 0 || json.Unmarshal([]byte(out), &ro) != nil {
			t.Fatalf("rollouts show: %d %s", code, out)
		}
		if len(ro.Nodes) == 1 && ro.Nodes[0].State == apitype.RolloutNodeUpdating {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not start:\n%s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ro.Version != "0.1.1" || ro.Pool != "pool_a" || ro.WaveTimeout != "10m0s" || ro.FailureThreshold != 10 || ro.State != "running" || len(ro.Timeline) < 2 {
		t.Errorf("rollout %+v", ro)
	}
	for _, key := range []string{`"id"`, `"version"`, `"role"`, `"pool"`, `"site"`, `"waves"`, `"max_unavailable"`, `"failure_threshold"`,
		`"wave_timeout"`, `"state"`, `"reason"`, `"created_at"`, `"nodes"`, `"node"`, `"wave"`, `"message"`, `"started_at"`, `"timeline"`, `"at"`} {
		if !strings.Contains(out, key) {
			t.Errorf("rollouts show -o json lacks %s", key)
		}
	}
	if n, _ := st.GetNode(ctx, node); n.DaemonTarget == nil || n.DaemonTarget.URL != s.APIURL()+"/downloads/bcd/0.1.1/linux-amd64" {
		t.Errorf("the node's target: %+v", n.DaemonTarget)
	}
	if code, out, _ = runCLI(t, "", "rollouts", "show", id); code != 0 || !strings.Contains(out, "STATE:") || !strings.Contains(out, "NODE") ||
		!strings.Contains(out, "TIMELINE") || !strings.Contains(out, node) {
		t.Errorf("rollouts show: %d\n%s", code, out)
	}
	for _, c := range []struct{ action, want string }{{"pause", "paused"}, {"pause", "paused"}, {"resume", "running"}, {"abort", "aborted"}} {
		if code, out, errOut = runCLI(t, "", "rollouts", c.action, id); code != 0 || out != "rollout "+id+" "+c.want+"\n" {
			t.Errorf("rollouts %s: %d %q %s", c.action, code, out, errOut)
		}
	}
	if code, _, errOut = runCLI(t, "", "rollouts", "resume", id); code != 1 || !strings.Contains(errOut, "aborted") {
		t.Errorf("resume an aborted rollout: %d %s", code, errOut)
	}
	if code, out, _ = runCLI(t, "", "rollouts", "list"); code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "aborted") {
		t.Errorf("rollouts list: %d %s", code, out)
	}

	// nodes upgrade: from the release, and from a manifest.
	code, out, errOut = runCLI(t, "", "nodes", "upgrade", node, "--version", "0.1.1")
	if code != 0 || !regexp.MustCompile(`^cmd_[0-9a-z]{26}\n$`).MatchString(out) {
		t.Fatalf("nodes upgrade --version: %d %q %s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "", "commands", "get", strings.TrimSpace(out), "-o", "json")
	var cmd apitype.Command
	var params protocol.DaemonSection
	if code != 0 || json.Unmarshal([]byte(out), &cmd) != nil || cmd.Kind != protocol.KindDaemonUpgrade || json.Unmarshal(cmd.Params, &params) != nil ||
		params.Version != "0.1.1" || params.SHA256 != strings.Repeat("ab", 32) || !strings.Contains(params.Signature, `"manifest_version"`) {
		t.Errorf("the daemon.upgrade: %d %s", code, out)
	}
	// A manifest signed by a key serve does not pin: the node judges it.
	unpinned := manifestFile(t, other, "0.1.2", 3, time.Now().Add(time.Hour))
	code, out, errOut = runCLI(t, "", "nodes", "upgrade", node, "--manifest", unpinned, "--url", "https://mirror.example.test/bcd")
	if code != 0 || !strings.HasPrefix(out, "cmd_") {
		t.Fatalf("nodes upgrade --manifest: %d %q %s", code, out, errOut)
	}
	c2, _ := st.GetCommand(ctx, strings.TrimSpace(out))
	json.Unmarshal(c2.Params, &params)
	if params.URL != "https://mirror.example.test/bcd" || params.Version != "0.1.2" {
		t.Errorf("--manifest --url params: %+v", params)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"nodes", "upgrade", node}, 2, "--version"},
		{[]string{"nodes", "upgrade", node, "--version", "0.1.1", "--url", "https://x"}, 2, "--url goes with --manifest"},
		{[]string{"nodes", "upgrade", node, "--version", "0.0.9"}, 1, "NOT_FOUND"},
		{[]string{"nodes", "upgrade", node, "--manifest", unpinned, "--url", "http://x"}, 1, "INVALID_INPUT"},
		{[]string{"nodes", "upgrade", "n_missing", "--version", "0.1.1"}, 1, "NOT_FOUND"},
	} {
		if code, _, errOut := runCLI(t, "", c.args...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: %d %s, want %d %s", c.args, code, errOut, c.code, c.want)
		}
	}

	// nodes list: the daemon fields and the UPDATE column.
	st.ApplySectionStatus(ctx, store.SectionStatus{NodeID: node, Section: protocol.SectionDaemon, State: "FAILED", Reason: "UpdateFailed",
		Message: "bcd 0.1.1 did not start", Version: "0.1.1", Revision: 2, At: now, ReceivedAt: now})
	code, out, _ = runCLI(t, "", "nodes", "list", "-o", "json")
	var nodes []map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 1 || nodes[0]["daemon_version"] != "0.1.0" || nodes[0]["daemon_arch"] != "amd64" {
		t.Fatalf("nodes list -o json: %d %s", code, out)
	}
	sec, _ := nodes[0]["daemon_section"].(map[string]any)
	if sec["state"] != "FAILED" || sec["reason"] != "UpdateFailed" || sec["version"] != "0.1.1" || sec["revision"] != float64(2) {
		t.Errorf("daemon_section %v", nodes[0]["daemon_section"])
	}
	if code, out, _ = runCLI(t, "", "nodes", "list"); code != 0 || !strings.Contains(out, "UPDATE") || !strings.Contains(out, "FAILED UpdateFailed") {
		t.Errorf("nodes list:\n%s", out)
	}
}
