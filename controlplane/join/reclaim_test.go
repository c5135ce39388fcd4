package join

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// reclaimFixture is a node that joined with a token and a system UUID, and
// the key it holds: what a reclaim of that hardware must prove.
type reclaimFixture struct {
	*fixture
	old    *cptest.Agent
	nodeID string
}

const reclaimUUID = "4c4c4544-0000-1010-8000-b2c04fbbbbbb"

func newReclaimFixture(t *testing.T) *reclaimFixture {
	t.Helper()
	f := newFixture(t)
	_, tk := cptest.NewToken(t, f.st, nil)
	old := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, old.Request(t, f.b, "node", tk, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = reclaimUUID }))
	if err != nil {
		t.Fatal(err)
	}
	return &reclaimFixture{fixture: f, old: old, nodeID: old.Verify(t, f.b, resp).NodeID}
}

// reclaimToken is a pool-wide token that allows reclaim: not bound to a node.
func (f *reclaimFixture) reclaimToken(t *testing.T) (store.Token, string) {
	return cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true })
}

// join is a token join of the old node's hardware by a, with proof (nil for
// none).
func (f *reclaimFixture) join(t *testing.T, a *cptest.Agent, tok string, proof *protocol.ReclaimProof) (*protocol.JoinResponse, error) {
	return f.svc.Join(ctx, a.Request(t, f.b, "node", tok, func(r *protocol.JoinRequest) {
		r.Claims.SystemUUID = reclaimUUID
		r.ReclaimProof = proof
	}))
}

// unchanged fails unless the token is still unused and the node still has its
// old certificate key.
func (f *reclaimFixture) unchanged(t *testing.T, what string, tok store.Token) {
	t.Helper()
	if got, _ := f.st.GetToken(ctx, tok.ID); !got.UsedAt.IsZero() {
		t.Errorf("%s: the refused join used the token", what)
	}
	n, err := f.st.GetNode(ctx, f.nodeID)
	if err != nil {
		t.Fatal(err)
	}
	if want := KeySHA256(pubDER(t, f.old)); n.CertKeySHA256 != want {
		t.Errorf("%s: the node's key changed", what)
	}
}

func pubDER(t *testing.T, a *cptest.Agent) []byte {
	t.Helper()
	csr, err := pki.ParseCSRPEM(a.CSRPEM)
	if err != nil {
		t.Fatal(err)
	}
	return csr.RawSubjectPublicKeyInfo
}

// TestReclaimByClaimsRefused: a pool-wide allow-reclaim token whose join
// only claims the system UUID of an existing node does not take it over. The
// refusal names the node and the three ways, and quotes no secret.
func TestReclaimByClaimsRefused(t *testing.T) {
	f := newReclaimFixture(t)
	tok, secret := f.reclaimToken(t)
	_, err := f.join(t, cptest.NewAgent(t), secret, nil)
	refused(t, "claims only", err, protocol.CodeReclaimNotAllowed, "belongs to node "+f.nodeID)
	if err == nil {
		t.FailNow()
	}
	for _, want := range []string{
		"no proof of the old node's key",
		"the same TPM (bcd join --attestor tpm)",
		"the old node's key",
		"bcd join --reset keeps the key",
		"better-compute tokens create --allow-reclaim --node-id " + f.nodeID,
		"bcd join --node-id " + f.nodeID,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "bcjt_") || strings.Contains(err.Error(), secret[len(secret)-8:]) {
		t.Errorf("the refusal quotes the token: %v", err)
	}
	f.unchanged(t, "claims only", tok)
}

// TestReclaimWithOldKeyAdmitted: the same join with the old node's key's
// proof for this CSR takes the node over (same id, the new key), and the
// proof cannot be used again: the node's key is now the new one.
func TestReclaimWithOldKeyAdmitted(t *testing.T) {
	f := newReclaimFixture(t)
	var reclaimed []string
	f.svc.Reclaimed = func(id string) { reclaimed = append(reclaimed, id) }
	_, secret := f.reclaimToken(t)
	a := cptest.NewAgent(t)
	proof := a.ReclaimProof(t, f.old.Key, f.nodeID)
	resp, err := f.join(t, a, secret, proof)
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Verify(t, f.b, resp); res.NodeID != f.nodeID {
		t.Fatalf("the reclaim gave node %s, want %s", res.NodeID, f.nodeID)
	}
	if len(reclaimed) != 1 || reclaimed[0] != f.nodeID {
		t.Errorf("Reclaimed: %v", reclaimed)
	}
	n, _ := f.st.GetNode(ctx, f.nodeID)
	if n.CertKeySHA256 != KeySHA256(pubDER(t, a)) {
		t.Error("after the reclaim the node's key is not the new CSR's")
	}
	// The same request again (a replay of the whole join with a fresh token):
	// the proof's key is no longer the node's.
	tok2, secret2 := f.reclaimToken(t)
	_, err = f.join(t, a, secret2, proof)
	refused(t, "the proof used again", err, protocol.CodeReclaimNotAllowed, "not signed with the key of node "+f.nodeID+"'s current certificate")
	if got, _ := f.st.GetToken(ctx, tok2.ID); !got.UsedAt.IsZero() {
		t.Error("the refused join used the token")
	}
}

// TestReclaimProofByAnotherKeyRefused: a proof that names the node but is
// signed by another key (the attacker's) is no proof.
func TestReclaimProofByAnotherKeyRefused(t *testing.T) {
	f := newReclaimFixture(t)
	tok, secret := f.reclaimToken(t)
	a := cptest.NewAgent(t)
	_, err := f.join(t, a, secret, a.ReclaimProof(t, a.Key, f.nodeID))
	refused(t, "signed by the joining key", err, protocol.CodeReclaimNotAllowed, "not signed with the key of node "+f.nodeID+"'s current certificate")
	// The old key's public key with another key's signature.
	p := a.ReclaimProof(t, cptest.NewAgent(t).Key, f.nodeID)
	p.PublicKey = pubDER(t, f.old)
	_, err = f.join(t, a, secret, p)
	refused(t, "the old key's public key, another key's signature", err, protocol.CodeReclaimNotAllowed, "signature does not verify")
	// The old key's proof for another node id.
	_, err = f.join(t, a, secret, a.ReclaimProof(t, f.old.Key, "n_someone_else"))
	refused(t, "proof for another node", err, protocol.CodeReclaimNotAllowed, "by the key of node n_someone_else, not "+f.nodeID)
	f.unchanged(t, "another key", tok)
}

// TestReclaimProofReplayRefused: the old key's proof for another CSR (one
// captured from another join) does not reclaim for this one, nor does a
// proof too old or of another purpose.
func TestReclaimProofReplayRefused(t *testing.T) {
	f := newReclaimFixture(t)
	tok, secret := f.reclaimToken(t)
	a := cptest.NewAgent(t)
	captured := cptest.NewAgent(t).ReclaimProof(t, f.old.Key, f.nodeID)
	_, err := f.join(t, a, secret, captured)
	refused(t, "proof for another CSR", err, protocol.CodeReclaimNotAllowed, "for another CSR")

	sum := sha256.Sum256(a.CSRDER)
	old, err := protocol.SignReclaimProof(f.old.Key, f.nodeID, hex.EncodeToString(sum[:]), time.Now().Add(-protocol.ReclaimProofMaxAge-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.join(t, a, secret, old)
	refused(t, "proof too old", err, protocol.CodeReclaimNotAllowed, "more than 10m0s from the control plane's clock")
	f.unchanged(t, "replays", tok)
}

// TestReclaimByNodeBoundToken: the operator's decision for that node (a
// token bound to its id, provisioned attestor) reclaims it without the old
// key, where a pool-wide allow-reclaim token does not.
func TestReclaimByNodeBoundToken(t *testing.T) {
	f := newReclaimFixture(t)
	tok, secret := f.reclaimToken(t)
	_, err := f.join(t, cptest.NewAgent(t), secret, nil)
	refused(t, "pool-wide token", err, protocol.CodeReclaimNotAllowed, "belongs to node "+f.nodeID)
	f.unchanged(t, "pool-wide token", tok)

	_, bound := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true; t.NodeID = f.nodeID })
	a := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", bound, func(r *protocol.JoinRequest) {
		r.Claims.SystemUUID = reclaimUUID
		r.Attestor, r.NodeID = protocol.AttestorProvisioned, f.nodeID
	}))
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Verify(t, f.b, resp); res.NodeID != f.nodeID {
		t.Fatalf("the node-bound token gave %s, want %s", res.NodeID, f.nodeID)
	}
}

// TestUnknownFieldRefusalNamesTheField: the refusal of a field this control
// plane does not know names it as bcd join looks for it (a bcd newer than
// its control plane drops reclaim_proof on `unknown field "reclaim_proof"`).
func TestUnknownFieldRefusalNamesTheField(t *testing.T) {
	_, err := DecodeRequest(strings.NewReader(`{"protocol_version":1,"reclaim_proof_v9":{}}`))
	if code(err) != protocol.CodeInvalidInput || !strings.Contains(err.Error(), `unknown field "reclaim_proof_v9"`) {
		t.Errorf("unknown field: %v", err)
	}
}
