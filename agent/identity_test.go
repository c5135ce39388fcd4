package agent_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	if _, err := agent.LoadIdentity(t.TempDir(), nil); !errors.Is(err, agent.ErrNotJoined) {
		t.Errorf("empty data dir: %v, want ErrNotJoined", err)
	}
	g := agenttest.New(t)

	dir := t.TempDir()
	g.Identity(t, dir, protocol.RoleNode, "node_a")
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := pki.MarshalPKCS8PEM(k)
	os.WriteFile(filepath.Join(dir, agent.KeyFile), other, 0o600)
	if _, err := agent.LoadIdentity(dir, nil); err == nil || !strings.Contains(err.Error(), "is not the key") {
		t.Errorf("mismatched key: %v", err)
	}

	dir = t.TempDir()
	g.Identity(t, dir, protocol.RoleNode, "node_a")
	os.Chmod(filepath.Join(dir, agent.KeyFile), 0o644)
	if _, err := agent.LoadIdentity(dir, nil); err == nil || !strings.Contains(err.Error(), "0644") {
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
	if _, err := agent.LoadIdentity(dir, nil); err == nil || !strings.Contains(err.Error(), "node_a") {
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

// opaqueSigner hides the *ecdsa.PrivateKey behind crypto.Signer, as a TPM key
// does: nothing may type-assert its way to the private key.
type opaqueSigner struct{ k *ecdsa.PrivateKey }

func (s opaqueSigner) Public() crypto.PublicKey { return s.k.Public() }
func (s opaqueSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.k.Sign(r, digest, opts)
}

// recordKeys is a KeyStore whose node.key is a record of its own, not PKCS#8.
type recordKeys struct{}

const recordType = "TEST NODE KEY RECORD"

func (recordKeys) New() (crypto.Signer, []byte, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, _ := x509.MarshalECPrivateKey(k)
	return opaqueSigner{k}, pem.EncodeToMemory(&pem.Block{Type: recordType, Bytes: der}), nil
}

func (recordKeys) Load(file []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(file)
	if b == nil || b.Type != recordType {
		return nil, errors.New("not a test record")
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	return opaqueSigner{k}, nil
}

// TestIdentityWithAnotherKeyStore: a key store whose key is only a crypto.Signer
// and whose node.key is not PKCS#8 joins, saves, loads and presents its
// certificate in a real mutual TLS handshake.
func TestIdentityWithAnotherKeyStore(t *testing.T) {
	g := agenttest.New(t)
	key, err := agent.NewNodeKey(recordKeys{})
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err := pki.NewCSR(key.Signer)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	der, err := g.Bundle.IssueNodeCert(csr, protocol.RoleNode, "node_r", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	id := &agent.Identity{
		NodeID: "node_r", Role: protocol.RoleNode,
		SPIFFEID:    pki.SPIFFEID(g.Bundle.Public.TrustDomain, protocol.RoleNode, "node_r"),
		CertChain:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		TrustBundle: g.Bundle.Public.NodeCAPEM + g.Bundle.Public.ServingCAPEM,
		GatewayURL:  g.URL,
	}
	if err := agent.SaveIdentity(dir, id, key); err != nil {
		t.Fatal(err)
	}
	file, _ := os.ReadFile(filepath.Join(dir, agent.KeyFile))
	if !strings.Contains(string(file), recordType) {
		t.Fatalf("node.key = %q, want the store's record", file)
	}
	if _, err := agent.LoadIdentity(dir, nil); err == nil {
		t.Error("the PKCS#8 store loaded a record it does not know")
	}
	loaded, err := agent.LoadIdentity(dir, recordKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := loaded.Key().(opaqueSigner); !ok {
		t.Fatalf("key is %T, want the store's signer", loaded.Key())
	}
	// A real handshake against a server that requires and verifies the client
	// certificate: the signer signs the CertificateVerify.
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.TLS.PeerCertificates[0].URIs[0].String())
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: g.Bundle.Public.NodeCAPool()}
	srv.StartTLS()
	defer srv.Close()
	cert := loaded.TLSCertificate()
	c := srv.Client()
	c.Transport.(*http.Transport).TLSClientConfig.Certificates = []tls.Certificate{cert}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != loaded.SPIFFEID {
		t.Errorf("server saw %q, want %s", body, loaded.SPIFFEID)
	}
}
