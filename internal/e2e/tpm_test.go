package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/better-compute/bcd/protocol"
)

// TestTPMJoin: a machine whose TPM is swtpm (a real TPM 2.0) joins with
// --attestor tpm through a real serve: refused while its EK is not enrolled
// (the refusal names the EK's hash, which is what an operator enrolls), then
// admitted once enrolled, with the node key in the TPM (node.key holds only
// its record) and a node that becomes ready over mutual TLS signed by the TPM.
// A second join returns at once; --reset and a tpm join again reclaim the same
// node; a token join into a pool that requires tpm is refused.
func TestTPMJoin(t *testing.T) {
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	sw := swtpmtest.Start(t, true)
	tp, err := tpm.OpenTCP(sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ek, err := tp.EK()
	tp.Close() // swtpm serves one client at a time
	if err != nil {
		t.Fatal(err)
	}
	ekHash := tpmattest.EKSHA256(ek.PKIX)

	cp := newControlPlane(t)
	cp.mustBC("sites", "create", "fsn1")
	h := newHost(t, cp, "fsn1")
	env := []string{nodekey.EnvTPMTCP + "=" + sw.Addr()}
	join := func(args ...string) result {
		t.Helper()
		return run(t, bcdFakeBin, env, "", append([]string{"join", "--config", h.config, "--attestor", "tpm"}, args...)...)
	}

	r := join()
	if r.code != 1 || !strings.Contains(r.stderr, protocol.CodeAttestorRefused) || !strings.Contains(r.stderr, ekHash) {
		t.Fatalf("tpm join before enrollment: %s", r)
	}
	if _, err := os.Stat(filepath.Join(h.data, "identity.json")); err == nil {
		t.Error("a refused join stored an identity")
	}

	cp.mustBC("tpm", "enroll", "--site", "fsn1", "--pool", "tpm-pool", "--ek-sha256", ekHash)
	r = join()
	if r.code != 0 || !strings.Contains(r.stdout, "joined as ") {
		t.Fatalf("tpm join after enrollment: %s\nserve log:\n%s", r, cp.log)
	}
	id := identityNodeID(t, h.data)
	key, err := os.ReadFile(filepath.Join(h.data, "node.key"))
	if err != nil || !strings.HasPrefix(string(key), "-----BEGIN BCD TPM NODE KEY-----") {
		t.Fatalf("node.key is not a TPM key's record: %v\n%.80s", err, key)
	}
	if fi, _ := os.Stat(filepath.Join(h.data, "node.key")); fi.Mode().Perm() != 0o600 {
		t.Errorf("node.key mode %v, want 0600", fi.Mode().Perm())
	}

	start := time.Now()
	if r := join(); r.code != 0 || !strings.Contains(r.stdout, "already joined as "+id) {
		t.Errorf("tpm join of a joined machine: %s", r)
	} else if d := time.Since(start); d > 10*time.Second {
		t.Errorf("tpm join of a joined machine took %s; it should return at once", d)
	}

	node := startAgentBin(t, bcdFakeBin, env, "node", "--config", h.config)
	n := cp.waitNode(id, 60*time.Second, "ready and connected with its TPM key", func(n nodeRow) bool {
		return n.State == protocol.NodeReady && n.Connected
	})
	if n.Pool != "tpm-pool" || n.Site != "fsn1" {
		t.Errorf("node %+v, want pool tpm-pool and site fsn1 from the enrollment", n)
	}
	node.stop() // it holds swtpm's one connection

	// The same TPM joins again after --reset: the proven EK reclaims the node.
	if os.Geteuid() == 0 {
		r = join("--reset", "--yes")
		if r.code != 0 || !strings.Contains(r.stdout, "joined as "+id) {
			t.Errorf("tpm join after --reset: %s\nserve log:\n%s", r, cp.log)
		}
	}

	// A pool whose policy wants tpm refuses a token join.
	cp.mustBC("pools", "set-policy", "pool_e2e", "--join-attestors", "tpm")
	h2 := newHost(t, cp, "fsn1")
	tok := cp.token("fsn1", "node")
	if r := bcd(t, []string{"BCD_JOIN_TOKEN=" + tok}, "", "join", "--config", h2.config); r.code != 1 ||
		!strings.Contains(r.stderr, protocol.CodeAttestorNotAllowed) {
		t.Errorf("token join into a tpm-only pool: %s", r)
	}

	// Without a TPM, --attestor tpm stops before anything is made or sent.
	if _, err := os.Stat(tpm.DefaultPath); err != nil {
		h3 := newHost(t, cp, "fsn1")
		r := run(t, bcdBin, nil, "", "join", "--config", h3.config, "--attestor", "tpm")
		if r.code != 1 || !strings.Contains(r.stderr, "needs a TPM") {
			t.Errorf("tpm join without a TPM: %s", r)
		}
		if _, err := os.Stat(filepath.Join(h3.data, "node.key")); err == nil {
			t.Error("a tpm join without a TPM wrote node.key")
		}
	}
}
