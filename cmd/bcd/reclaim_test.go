package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/gateway"
	cpjoin "github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/protocol"
)

// realJoin is bcd join against the control plane's own JoinService and
// gateway handler on a SQLite store, on loopback with the test bundle: the
// reclaim is decided as serve decides it.
type realJoin struct {
	st      store.Store
	cfgPath string
	dataDir string
}

const reclaimTestUUID = "4c4c4544-0000-1010-8000-b2c04fcccccc"

func newRealJoin(t *testing.T, keys func() agent.KeyStore) *realJoin {
	t.Helper()
	st := cptest.NewStore(t)
	svc := &cpjoin.Service{Bundle: testBundle, Store: st, Attestors: map[string]cpjoin.Attestor{
		protocol.AttestorJoinToken:   cpjoin.NewTokenAttestor(st),
		protocol.AttestorProvisioned: cpjoin.NewProvisionedAttestor(st),
	}}
	gw := &gateway.Server{Joiner: svc, Store: st, NodeCAs: testBundle.Public.NodeCAPool(), TrustDomain: testBundle.Public.TrustDomain}
	g := agenttest.NewFromBundle(t, testBundle)
	g.Server.Config.Handler = gw.Handler()
	r := &realJoin{st: st, dataDir: filepath.Join(t.TempDir(), "data")}
	r.cfgPath = g.WriteConfig(t, t.TempDir(), r.dataDir)
	// The machine's hardware: the same system UUID at every join. Root is
	// what --reset asks for; the test's data_dir is its own.
	prev := joinHooks
	joinHooks = func(o *join.Options) {
		prev(o)
		o.Claims = func(context.Context) protocol.Claims {
			return protocol.Claims{Hostname: "reclaim-host", SystemUUID: reclaimTestUUID}
		}
		o.IsRoot = func() bool { return true }
		if keys != nil {
			o.Keys, o.TPM = keys(), nil
		}
	}
	t.Cleanup(func() { joinHooks = prev })
	return r
}

// token is a join token of the store: allowReclaim, pool-wide (bound to no
// node) unless nodeID is set.
func (r *realJoin) token(t *testing.T, allowReclaim bool, nodeID string) string {
	_, secret := cptest.NewToken(t, r.st, func(tk *store.Token) { tk.AllowReclaim = allowReclaim; tk.NodeID = nodeID })
	return secret
}

func (r *realJoin) nodeKey(t *testing.T, id string) string {
	t.Helper()
	n, err := r.st.GetNode(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n.CertKeySHA256
}

// TestJoinResetReclaimsWithTheOldKey: bcd join --reset moves the identity
// aside, and the next bcd join with a pool-wide allow-reclaim token signs the
// reclaim with the moved-aside node.key: the machine gets its node back, in
// the same run or in the next (the two runs bcd's hints spell). Another
// machine claiming the same hardware with such a token and no key is refused,
// naming the node and the three ways.
func TestJoinResetReclaimsWithTheOldKey(t *testing.T) {
	t.Run("pkcs8", func(t *testing.T) { testResetReclaim(t, nil) })
	t.Run("tpm", func(t *testing.T) {
		sw := swtpmtest.Start(t, false)
		host := &nodekey.Host{RequireTPM: true, OpenTPM: func() (*tpm.TPM, error) { return tpm.OpenTCP(sw.Addr()) }}
		t.Cleanup(func() { host.Close() })
		testResetReclaim(t, func() agent.KeyStore { return host })
	})
}

func testResetReclaim(t *testing.T, keys func() agent.KeyStore) {
	r := newRealJoin(t, keys)
	code, stdout, stderr := runBcdIn(t, r.token(t, false, "")+"\n", "join", "--config", r.cfgPath)
	if code != 0 {
		t.Fatalf("first join: exit %d\n%s%s", code, stdout, stderr)
	}
	id, err := agent.LoadIdentity(r.dataDir, keysOf(keys))
	if err != nil {
		t.Fatal(err)
	}
	if keys != nil {
		if b, _ := os.ReadFile(filepath.Join(r.dataDir, agent.KeyFile)); !strings.HasPrefix(string(b), "-----BEGIN BCD TPM NODE KEY-----") {
			t.Fatalf("node.key is not a TPM key's record: %.60s", b)
		}
	}

	// --reset and the join in one run.
	code, stdout, stderr = runBcdIn(t, r.token(t, true, "")+"\n", "join", "--config", r.cfgPath, "--reset", "--yes")
	if code != 0 || !strings.Contains(stdout, "joined as "+id.NodeID+" ") {
		t.Fatalf("join --reset --yes with an allow-reclaim token: exit %d, want joined as %s\n%s%s", code, id.NodeID, stdout, stderr)
	}
	again, err := agent.LoadIdentity(r.dataDir, keysOf(keys))
	if err != nil {
		t.Fatal(err)
	}
	if r.nodeKey(t, id.NodeID) != cpjoin.KeySHA256(again.Leaf().RawSubjectPublicKeyInfo) {
		t.Error("after the reclaim the node's key is not the new node.key")
	}
	moved, _ := filepath.Glob(filepath.Join(r.dataDir, agent.KeyFile+".reset-*"))
	if len(moved) != 1 {
		t.Errorf("moved-aside keys %v, want the one --reset moved (nothing is deleted)", moved)
	}

	// The two runs: --reset --yes (no token: it moves, then wants one), then
	// bcd join. Two identities are moved aside now; the newest proves.
	code, stdout, stderr = runBcdIn(t, "", "join", "--config", r.cfgPath, "--reset", "--yes")
	if code != 2 || !strings.Contains(stdout, "moved ") {
		t.Fatalf("join --reset --yes without a token: exit %d, want 2 after the move\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = runBcdIn(t, r.token(t, true, "")+"\n", "join", "--config", r.cfgPath)
	if code != 0 || !strings.Contains(stdout, "joined as "+id.NodeID+" ") {
		t.Fatalf("join after --reset: exit %d, want joined as %s\n%s%s", code, id.NodeID, stdout, stderr)
	}

	// Another machine with the same system UUID and no key of the node.
	other := newRealJoinDir(t, r)
	code, stdout, stderr = runBcdIn(t, r.token(t, true, "")+"\n", "join", "--config", other)
	if code != 1 || !strings.Contains(stderr, protocol.CodeReclaimNotAllowed) || !strings.Contains(stderr, "belongs to node "+id.NodeID) ||
		!strings.Contains(stderr, "--node-id "+id.NodeID) || !strings.Contains(stderr, "the same TPM") || !strings.Contains(stderr, "the old node's key") {
		t.Errorf("join of the same hardware without the node's key: exit %d, want RECLAIM_NOT_ALLOWED naming %s and the three ways\n%s%s", code, id.NodeID, stdout, stderr)
	}
	if strings.Contains(stdout+stderr, "bcjt_") {
		t.Error("the refusal quotes the token")
	}
	// The operator's decision for that node: a token bound to it.
	code, stdout, stderr = runBcdIn(t, r.token(t, true, id.NodeID)+"\n", "join", "--config", other, "--node-id", id.NodeID)
	if code != 0 || !strings.Contains(stdout, "joined as "+id.NodeID+" ") {
		t.Errorf("join with a token bound to %s: exit %d\n%s%s", id.NodeID, code, stdout, stderr)
	}
}

func keysOf(keys func() agent.KeyStore) agent.KeyStore {
	if keys == nil {
		return nil
	}
	return keys()
}

// newRealJoinDir is a second machine's config.toml for r's control plane:
// another data_dir, the same gateway.
func newRealJoinDir(t *testing.T, r *realJoin) string {
	t.Helper()
	b, err := os.ReadFile(r.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	dir, data := t.TempDir(), filepath.Join(t.TempDir(), "data")
	cfg := strings.ReplaceAll(string(b), r.dataDir, data)
	jwk, err := os.ReadFile(filepath.Join(filepath.Dir(r.cfgPath), join.JWKFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, join.JWKFile), jwk, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "config.toml")
}
