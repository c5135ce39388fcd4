package agent_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

func TestIdentitySaveLoad(t *testing.T) {
	g := agenttest.New(t)
	dir := filepath.Join(t.TempDir(), "data")
	id := g.Identity(t, dir, protocol.RoleSite, "site_1")
	if id.NodeID != "site_1" || id.Role != "site" || id.Key() == nil || len(id.TrustBundleCerts()) != 2 {
		t.Errorf("identity = %+v", id)
	}
	for name, want := range map[string]os.FileMode{".": 0o700, agent.KeyFile: 0o600, agent.IdentityFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %04o, want %04o", name, fi.Mode().Perm(), want)
		}
	}
	cert := id.TLSCertificate()
	if len(cert.Certificate) != 1 || cert.PrivateKey == nil {
		t.Errorf("TLS certificate = %+v", cert)
	}
}

func TestLoadIdentityRefusals(t *testing.T) {
	if _, err := agent.LoadIdentity(t.TempDir()); !errors.Is(err, agent.ErrNotJoined) {
		t.Errorf("empty data dir: %v, want ErrNotJoined", err)
	}
	g := agenttest.New(t)

	dir := t.TempDir()
	g.Identity(t, dir, protocol.RoleNode, "node_a")
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := pki.MarshalPKCS8PEM(k)
	os.WriteFile(filepath.Join(dir, agent.KeyFile), other, 0o600)
	if _, err := agent.LoadIdentity(dir); err == nil || !strings.Contains(err.Error(), "is not the key") {
		t.Errorf("mismatched key: %v", err)
	}

	dir = t.TempDir()
	g.Identity(t, dir, protocol.RoleNode, "node_a")
	os.Chmod(filepath.Join(dir, agent.KeyFile), 0o644)
	if _, err := agent.LoadIdentity(dir); err == nil || !strings.Contains(err.Error(), "0644") {
		t.Errorf("readable key: %v", err)
	}

	dir = t.TempDir()
	g.Identity(t, dir, protocol.RoleNode, "node_a")
	data, _ := os.ReadFile(filepath.Join(dir, agent.IdentityFile))
	var m map[string]any
	json.Unmarshal(data, &m)
	m["node_id"] = "node_b" // the certificate still says node_a
	data, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(dir, agent.IdentityFile), data, 0o600)
	if _, err := agent.LoadIdentity(dir); err == nil || !strings.Contains(err.Error(), "node_a") {
		t.Errorf("identity naming another node: %v", err)
	}
}

func FuzzDecodeIdentity(f *testing.F) {
	g := agenttest.New(f)
	dir := f.TempDir()
	g.Identity(f, dir, protocol.RoleNode, "node_a")
	good, err := os.ReadFile(filepath.Join(dir, agent.IdentityFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"node_id":"n","role":"node","cert_chain":"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, err := agent.DecodeIdentity(data)
		if err != nil {
			return
		}
		if !protocol.ValidNodeID(id.NodeID) || !protocol.ValidRole(id.Role) || id.Leaf() == nil {
			t.Fatalf("accepted %+v", id)
		}
		if err := agent.CheckLeafIdentity(id.Leaf(), id.SPIFFEID, id.Role, id.NodeID); err != nil {
			t.Fatalf("accepted an identity whose leaf disagrees: %v", err)
		}
	})
}
