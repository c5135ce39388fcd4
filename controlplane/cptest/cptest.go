package cptest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Site is the site NewStore creates.
const Site = "fsn1"

// Pool is the pool tokens are for unless a test says otherwise.
const Pool = "pool_a"

// NewBundle creates a PKI bundle in a temporary directory and loads it.
func NewBundle(t testing.TB) *pki.Bundle {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := pki.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// NewStore opens a SQLite store in a temporary directory with site Site.
func NewStore(t testing.TB) store.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.CreateSite(context.Background(), store.Site{Name: Site, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return s
}

// NewToken stores a join token (role node, site Site, pool Pool, one hour,
// changed by mut) and returns its record and secret.
func NewToken(t testing.TB, s store.Tokens, mut func(*store.Token)) (store.Token, string) {
	t.Helper()
	now := time.Now()
	j := token.NewJoin(now)
	tok := store.Token{ID: j.ID, Hash: j.Hash, Pool: Pool, Site: Site, Role: protocol.RoleNode, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if mut != nil {
		mut(&tok)
	}
	if err := s.CreateToken(context.Background(), tok); err != nil {
		t.Fatal(err)
	}
	return tok, j.Token
}

// MAC is the first MAC of the machines NewMachine adds unless told
// otherwise.
const MAC = "52:54:00:12:34:56"

// NewMachine adds a machine (site Site, MAC MAC, boot mode ramdisk, changed
// by mut) and returns it as stored.
func NewMachine(t testing.TB, s store.Store, mut func(*store.Machine)) store.Machine {
	t.Helper()
	now := time.Now()
	m := store.Machine{ID: ids.New(ids.PrefixMachine, now), Site: Site,
		MachineSpec:   store.MachineSpec{MACs: []string{MAC}, BootOverride: protocol.BootRamdisk},
		MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: now}, CreatedAt: now, UpdatedAt: now}
	if mut != nil {
		mut(&m)
	}
	if err := s.CreateMachine(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetMachine(context.Background(), m.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// NewNonce stores a boot nonce for mac in site, as a site agent's
// boot.nonce event would, expiring after ttl, and returns the nonce.
func NewNonce(t testing.TB, s store.Store, site, mac string, ttl time.Duration) string {
	t.Helper()
	nonce, err := protocol.NewBootNonce()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	machine := ""
	if m, err := s.FindMachineByMAC(context.Background(), mac); err == nil {
		machine = m.ID
	}
	siteNode := EnsureSiteNode(t, s, site)
	if _, err := s.AddBootNonce(context.Background(), store.BootNonce{Hash: sha256.Sum256([]byte(nonce)), MAC: mac, Site: site,
		SiteNode: siteNode, MachineID: machine, CreatedAt: now, ExpiresAt: now.Add(ttl)}); err != nil {
		t.Fatal(err)
	}
	nonceMACs.Store(nonce, witnessed{mac: mac, node: siteNode})
	return nonce
}

// The site node NewNonce mints with: its key signs the witnesses
// DiscoveryRequest attaches.
var (
	siteKeyOnce sync.Once
	siteKey     *ecdsa.PrivateKey
	nonceMACs   sync.Map // nonce → witnessed
)

type witnessed struct{ mac, node string }

// SiteKey is the key of the site nodes EnsureSiteNode makes.
func SiteKey() *ecdsa.PrivateKey {
	siteKeyOnce.Do(func() {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		siteKey = k
	})
	return siteKey
}

// EnsureSiteNode adds site's site agent node ("n_site_<site>"), whose
// certificate key is SiteKey, unless it is there, and returns its id.
func EnsureSiteNode(t testing.TB, s store.Store, site string) string {
	t.Helper()
	id := "n_site_" + site
	if _, err := s.GetNode(context.Background(), id); err == nil {
		return id
	}
	der, err := x509.MarshalPKIXPublicKey(SiteKey().Public())
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(der)
	now := time.Now()
	n := store.Node{ID: id, Role: protocol.RoleSite, Site: site, SPIFFEID: "spiffe://test/site/" + id,
		CertSerial: "site-" + id, CertNotAfter: now.Add(24 * time.Hour), CertKeySHA256: hex.EncodeToString(h[:]), State: "ready"}
	if err := s.Admit(context.Background(), store.Admission{Node: n, Now: now}); err != nil {
		t.Fatal(err)
	}
	return id
}

// Witness is the witness the site node of NewNonce signs for nonce and
// csrSHA256, or nil for a nonce NewNonce did not make; mut changes the
// payload before it is signed.
func Witness(nonce, csrSHA256 string, mut func(*protocol.WitnessPayload)) *protocol.BootWitness {
	v, ok := nonceMACs.Load(nonce)
	if !ok {
		return nil
	}
	w := v.(witnessed)
	return SignWitness(SiteKey(), w.node, nonce, csrSHA256, w.mac, mut)
}

// SignWitness is site node nodeID's witness, signed with key, of a join for
// nonce, csrSHA256 and mac, as bcd site signs it; mut changes the payload
// before it is signed.
func SignWitness(key *ecdsa.PrivateKey, nodeID, nonce, csrSHA256, mac string, mut func(*protocol.WitnessPayload)) *protocol.BootWitness {
	h := sha256.Sum256([]byte(nonce))
	p := protocol.WitnessPayload{NodeID: nodeID, NonceSHA256: hex.EncodeToString(h[:]), CSRSHA256: csrSHA256, MAC: mac,
		IP: "10.20.0.50", Interface: "br0", Checked: true, Time: time.Now().UTC()}
	if mut != nil {
		mut(&p)
	}
	payload, _ := json.Marshal(p)
	digest := sha256.Sum256(payload)
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		panic(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(key.Public())
	return &protocol.BootWitness{Payload: payload, Signature: sig, PublicKey: der}
}

// DiscoveryRequest builds a ramdisk's join request: attestor discovery,
// the nonce, macs as its claims and, for a nonce of NewNonce, the minting
// site node's witness.
func (a *Agent) DiscoveryRequest(nonce string, macs ...string) *protocol.JoinRequest {
	return &protocol.JoinRequest{
		ProtocolVersion: protocol.Version,
		CSR:             string(a.CSRPEM),
		Role:            protocol.RoleRamdisk,
		Attestor:        protocol.AttestorDiscovery,
		BootNonce:       nonce,
		Witness:         Witness(nonce, pki.CSRSHA256(a.CSRDER), nil),
		Claims:          protocol.Claims{Hostname: "ramdisk", MACs: macs, SystemUUID: "4c4c4544-0000-1010-8000-b2c04f000001", CPUs: 8},
	}
}

// Agent is a joining agent's key and CSR.
type Agent struct {
	Key    *ecdsa.PrivateKey
	CSRPEM []byte
	CSRDER []byte
}

// NewAgent makes a key and CSR as bcd join does.
func NewAgent(t testing.TB) *Agent {
	t.Helper()
	key, csrPEM, err := pki.NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(csrPEM)
	return &Agent{Key: key, CSRPEM: csrPEM, CSRDER: blk.Bytes}
}

// Request builds a join-token request for role with tok sealed to the
// bundle's join encryption key; mut changes it before it is returned.
func (a *Agent) Request(t testing.TB, b *pki.Bundle, role, tok string, mut func(*protocol.JoinRequest)) *protocol.JoinRequest {
	t.Helper()
	req := &protocol.JoinRequest{
		ProtocolVersion: protocol.Version,
		CSR:             string(a.CSRPEM),
		Role:            role,
		Attestor:        protocol.AttestorJoinToken,
		Claims:          protocol.Claims{Hostname: "host1", SystemUUID: "4c4c4544-0000-1010-8000-b2c04f000001"},
	}
	if tok != "" {
		req.SealedToken = Seal(t, b, tok, pki.CSRSHA256(a.CSRDER))
	}
	if mut != nil {
		mut(req)
	}
	return req
}

// ReclaimProof is the proof that the agent holds key, node nodeID's key,
// for a join with this agent's CSR, signed now as bcd join signs it.
func (a *Agent) ReclaimProof(t testing.TB, key crypto.Signer, nodeID string) *protocol.ReclaimProof {
	t.Helper()
	p, err := protocol.SignReclaimProof(key, nodeID, pki.CSRSHA256(a.CSRDER), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Seal seals tok bound to csrSHA256 as bcd join does.
func Seal(t testing.TB, b *pki.Bundle, tok, csrSHA256 string) string {
	t.Helper()
	plain, err := json.Marshal(protocol.SealedToken{Token: tok, CSRSHA256: csrSHA256, IssuedAt: time.Now().Unix()})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := pki.Seal(b.Public.JoinEncryptionPublicKey(), plain)
	if err != nil {
		t.Fatal(err)
	}
	return sealed
}

// Verify checks a join response as bcd join does and returns its result:
// the JWS verifies under the pinned join signing key, is for this CSR, and
// the leaf chains to the node CA, certifies the agent's key and carries the
// SPIFFE id of the result.
func (a *Agent) Verify(t testing.TB, b *pki.Bundle, resp *protocol.JoinResponse) protocol.JoinResult {
	t.Helper()
	payload, _, err := pki.VerifyPinned(b.Public.JoinSigningKeyPin, protocol.PurposeJoinResponse, resp.Signed)
	if err != nil {
		t.Fatalf("join response does not verify: %v", err)
	}
	var res protocol.JoinResult
	if err := json.Unmarshal(payload, &res); err != nil {
		t.Fatal(err)
	}
	if res.CSRSHA256 != pki.CSRSHA256(a.CSRDER) {
		t.Fatalf("response is for CSR %s, not ours", res.CSRSHA256)
	}
	leaf := a.Leaf(t, res)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: b.Public.NodeCAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("leaf does not chain to the node CA: %v", err)
	}
	if !a.Key.PublicKey.Equal(leaf.PublicKey) {
		t.Fatal("leaf certifies another key")
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != res.SPIFFEID ||
		res.SPIFFEID != pki.SPIFFEID(b.Public.TrustDomain, res.Role, res.NodeID) {
		t.Fatalf("leaf URIs %v, result SPIFFE id %s", leaf.URIs, res.SPIFFEID)
	}
	return res
}

// Leaf parses the first certificate of the result's chain.
func (a *Agent) Leaf(t testing.TB, res protocol.JoinResult) *x509.Certificate {
	t.Helper()
	if len(res.CertChain) == 0 {
		t.Fatal("empty certificate chain")
	}
	blk, _ := pem.Decode([]byte(res.CertChain[0]))
	if blk == nil {
		t.Fatal("leaf is not PEM")
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// ClientCert is the agent's TLS client certificate from a join result.
func (a *Agent) ClientCert(t testing.TB, res protocol.JoinResult) tls.Certificate {
	t.Helper()
	var chain [][]byte
	for _, p := range res.CertChain {
		blk, _ := pem.Decode([]byte(p))
		chain = append(chain, blk.Bytes)
	}
	return tls.Certificate{Certificate: chain, PrivateKey: a.Key, Leaf: a.Leaf(t, res)}
}
