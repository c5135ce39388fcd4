package join

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/better-compute/bcd/protocol"
)

// The tpm attestor's tests run against swtpm, a real TPM 2.0 (libtpms) that
// each test starts on loopback, driven by the agent's own agent/tpm: the
// evidence is what a node sends.

// startSwtpm starts swtpm on a fresh state (so a new EK) and opens it.
func startSwtpm(t *testing.T) *tpm.TPM {
	t.Helper()
	sw := swtpmtest.Start(t, false)
	tp, err := tpm.OpenTCP(sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tp.Close() })
	return tp
}

// tpmNode is a node joining with its TPM: the node key in the TPM, its CSR,
// an attestation key, and the EK.
type tpmNode struct {
	tp     *tpm.TPM
	ek     tpm.EK
	ak     *tpm.AK
	key    *tpm.Key
	csrPEM []byte
	csrDER []byte
	macs   []string
}

func newTPMNode(t *testing.T, tp *tpm.TPM, macs ...string) *tpmNode {
	t.Helper()
	ek, err := tp.EK()
	if err != nil {
		t.Fatal(err)
	}
	ak, err := tp.CreateAK()
	if err != nil {
		t.Fatal(err)
	}
	n := &tpmNode{tp: tp, ek: ek, ak: ak, macs: macs}
	n.newKey(t)
	return n
}

// newKey makes a new node key and CSR, as bcd join --reset does.
func (n *tpmNode) newKey(t *testing.T) {
	t.Helper()
	key, _, err := n.tp.CreateNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{SignatureAlgorithm: x509.ECDSAWithSHA256}, key)
	if err != nil {
		t.Fatal(err)
	}
	n.key, n.csrDER = key, der
	n.csrPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func (n *tpmNode) ekHash() string { return tpmattest.EKSHA256(n.ek.PKIX) }

// request is round one's request: the TPM certifies the node key with the
// SHA-256 of the CSR as qualifying data.
func (n *tpmNode) request(t *testing.T) *protocol.JoinRequest {
	t.Helper()
	sum := sha256.Sum256(n.csrDER)
	info, sig, err := n.tp.Certify(n.key, n.ak, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	b := base64.StdEncoding.EncodeToString
	return &protocol.JoinRequest{
		ProtocolVersion: protocol.Version,
		CSR:             string(n.csrPEM),
		Role:            protocol.RoleNode,
		Site:            cptest.Site,
		Attestor:        protocol.AttestorTPM,
		Claims: protocol.Claims{Hostname: "tpm-host", MACs: n.macs, SystemUUID: "4c4c4544-0000-1010-8000-b2c04f0000aa",
			TPMEK: string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: n.ek.PKIX}))},
		TPM: &protocol.TPMAttestation{EKPublic: b(n.ek.PKIX), AKPublic: b(n.ak.TPMTPublic()), CertifyInfo: b(info), CertifySignature: b(sig)},
	}
}

// answer is round two's request: req again with the challenge's ID and the
// secret the TPM recovered from it.
func (n *tpmNode) answer(t *testing.T, req *protocol.JoinRequest, ch *protocol.TPMChallenge) *protocol.JoinRequest {
	t.Helper()
	blob, _ := base64.StdEncoding.DecodeString(ch.CredentialBlob)
	enc, _ := base64.StdEncoding.DecodeString(ch.EncryptedSecret)
	secret, err := n.tp.ActivateCredential(n.ak, blob, enc)
	if err != nil {
		t.Fatalf("ActivateCredential: %v", err)
	}
	out := *req
	a := *req.TPM
	a.ChallengeID, a.Secret = ch.ID, base64.StdEncoding.EncodeToString(secret)
	out.TPM = &a
	return &out
}

// challenge runs round one and wants a challenge.
func (n *tpmNode) challenge(t *testing.T, svc *Service, req *protocol.JoinRequest) *protocol.TPMChallenge {
	t.Helper()
	resp, err := svc.Join(ctx, req)
	if err != nil {
		t.Fatalf("round one: %v", err)
	}
	if resp.TPMChallenge == nil || resp.Signed != "" || resp.RetryAfterS != 0 {
		t.Fatalf("round one answered %+v, want a challenge", resp)
	}
	return resp.TPMChallenge
}

// join runs both rounds and returns the verified result.
func (n *tpmNode) join(t *testing.T, f *fixture) protocol.JoinResult {
	t.Helper()
	req := n.request(t)
	ch := n.challenge(t, f.svc, req)
	resp, err := f.svc.Join(ctx, n.answer(t, req, ch))
	if err != nil {
		t.Fatalf("round two: %v", err)
	}
	return n.verify(t, f.b, resp)
}

// verify checks a join response as bcd join does: signed by the join
// signing key, for this CSR, certifying the TPM's node key.
func (n *tpmNode) verify(t *testing.T, b *pki.Bundle, resp *protocol.JoinResponse) protocol.JoinResult {
	t.Helper()
	if resp.Signed == "" {
		t.Fatalf("answer %+v, want a signed result", resp)
	}
	payload, _, err := pki.VerifyPinned(b.Public.JoinSigningKeyPin, protocol.PurposeJoinResponse, resp.Signed)
	if err != nil {
		t.Fatal(err)
	}
	var res protocol.JoinResult
	if err := json.Unmarshal(payload, &res); err != nil {
		t.Fatal(err)
	}
	if res.CSRSHA256 != pki.CSRSHA256(n.csrDER) {
		t.Fatal("the result is for another CSR")
	}
	blk, _ := pem.Decode([]byte(res.CertChain[0]))
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !n.key.Public().(*ecdsa.PublicKey).Equal(leaf.PublicKey) {
		t.Fatal("the certificate is for another key than the TPM's node key")
	}
	return res
}

func newTPMFixture(t *testing.T) *fixture {
	f := newFixture(t)
	f.svc.Attestors[protocol.AttestorTPM] = NewTPMAttestor(f.st, TPMOptions{Bundle: f.b})
	return f
}

// refused wants err to be a refusal with code whose message says want.
func refused(t *testing.T, what string, err error, code_, want string) {
	t.Helper()
	if code(err) != code_ || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("%s: %v (code %q), want %s saying %q", what, err, code(err), code_, want)
	}
}

func TestTPMJoinEnrolled(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: n.ekHash(), Site: cptest.Site, Pool: "pool_tpm", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	res := n.join(t, f)
	if res.Role != protocol.RoleNode || res.Site != cptest.Site || res.Pool != "pool_tpm" {
		t.Errorf("result %+v", res)
	}
	node, err := f.st.GetNode(ctx, res.NodeID)
	if err != nil || node.TPMEKSHA256 != n.ekHash() {
		t.Errorf("node %+v %v: want its TPM EK %s", node, err, n.ekHash())
	}
}

func TestTPMJoinEnrolledForMachine(t *testing.T) {
	f := newTPMFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	n := newTPMNode(t, startSwtpm(t))
	if _, err := f.st.UpdateMachine(ctx, m.ID, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: n.ekHash()}, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var bound []string
	f.svc.Bound = func(machine, node string) { bound = append(bound, machine+" "+node) }
	res := n.join(t, f)
	if res.Pool != apitype.DefaultPool {
		t.Errorf("pool %s, want the default pool", res.Pool)
	}
	if got, _ := f.st.GetMachine(ctx, m.ID); got.BoundNode != res.NodeID {
		t.Errorf("machine's bound node %q, want %s", got.BoundNode, res.NodeID)
	}
	if len(bound) != 1 || bound[0] != m.ID+" "+res.NodeID {
		t.Errorf("Bound hook: %v", bound)
	}
}

func TestTPMJoinDeferredThenApproved(t *testing.T) {
	f := newTPMFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	n := newTPMNode(t, startSwtpm(t), strings.ToUpper(m.MACs[0]))
	req := n.request(t)
	for i := 0; i < 2; i++ {
		resp, err := f.svc.Join(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.RetryAfterS != 5 || resp.TPMChallenge != nil || resp.Signed != "" {
			t.Fatalf("try %d before approval: %+v, want a deferral of 5 s", i, resp)
		}
	}
	evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
	deferred := 0
	for _, e := range evs {
		if e.Kind == protocol.MachineEventJoinDeferred {
			deferred++
			if !strings.Contains(e.Message, "machines approve "+m.ID) || !strings.Contains(e.Message, n.ekHash()) {
				t.Errorf("join.deferred says %q", e.Message)
			}
		}
	}
	if deferred != 1 {
		t.Errorf("%d join.deferred entries on the timeline, want 1", deferred)
	}
	if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 0 {
		t.Fatal("a deferred join wrote a node")
	}

	if _, err := f.st.UpdateMachine(ctx, m.ID, store.MachineUpdate{Approve: true, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	ch := n.challenge(t, f.svc, req)
	resp, err := f.svc.Join(ctx, n.answer(t, req, ch))
	if err != nil {
		t.Fatal(err)
	}
	res := n.verify(t, f.b, resp)
	got, _ := f.st.GetMachine(ctx, m.ID)
	if got.TPMEKSHA256 != n.ekHash() || got.BoundNode != res.NodeID {
		t.Errorf("approved machine after the join: ek %q bound %q", got.TPMEKSHA256, got.BoundNode)
	}
	if e, err := f.st.GetTPMEnrollment(ctx, n.ekHash()); err != nil || e.MachineID != m.ID {
		t.Errorf("enrollment %+v %v", e, err)
	}
}

func TestTPMJoinNotEnrolled(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t), "52:54:00:99:99:99")
	_, err := f.svc.Join(ctx, n.request(t))
	refused(t, "not enrolled", err, protocol.CodeAttestorRefused, "the TPM's endorsement key "+n.ekHash()+" is not enrolled")
	refused(t, "not enrolled, hint", err, protocol.CodeAttestorRefused, "better-compute machines enroll-tpm")
	// A machine of another site does not count.
	m := cptest.NewMachine(t, f.st, nil)
	if err := f.st.CreateSite(ctx, store.Site{Name: "ams1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	n.macs = m.MACs
	req := n.request(t)
	req.Site = "ams1"
	_, err = f.svc.Join(ctx, req)
	refused(t, "machine of another site", err, protocol.CodeAttestorRefused, "is not enrolled")
}

func TestTPMJoinRefusesBadEvidence(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: n.ekHash(), Site: cptest.Site, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	flip := func(v string) string {
		b, _ := base64.StdEncoding.DecodeString(v)
		b[len(b)-1] ^= 1
		return base64.StdEncoding.EncodeToString(b)
	}
	for _, tc := range []struct {
		name       string
		mut        func(*protocol.JoinRequest)
		code, want string
	}{
		{"tampered certification", func(r *protocol.JoinRequest) { r.TPM.CertifyInfo = flip(r.TPM.CertifyInfo) },
			protocol.CodeAttestorRefused, "certification of the node key does not verify"},
		{"tampered signature", func(r *protocol.JoinRequest) { r.TPM.CertifySignature = flip(r.TPM.CertifySignature) },
			protocol.CodeAttestorRefused, "certification of the node key does not verify"},
		{"no certification", func(r *protocol.JoinRequest) { r.TPM.CertifyInfo, r.TPM.CertifySignature = "", "" },
			protocol.CodeInvalidInput, "tpm.certify_info is missing"},
		{"bad base64", func(r *protocol.JoinRequest) { r.TPM.AKPublic = "not base64!" }, protocol.CodeInvalidInput, "tpm.ak_public is not standard base64"},
		{"bad AK structure", func(r *protocol.JoinRequest) { r.TPM.AKPublic = "AAEC" }, protocol.CodeInvalidInput, "tpm.ak_public is not a TPMT_PUBLIC"},
		{"bad EK", func(r *protocol.JoinRequest) { r.TPM.EKPublic = "AAEC" }, protocol.CodeInvalidInput, "tpm.ek_public is not a PKIX public key"},
		{"claims of another EK", func(r *protocol.JoinRequest) {
			r.Claims.TPMEK = "-----BEGIN PUBLIC KEY-----\nAAEC\n-----END PUBLIC KEY-----\n"
		}, protocol.CodeInvalidInput, "claims.tpm_ek is not the PEM of tpm.ek_public"},
		{"no evidence", func(r *protocol.JoinRequest) { r.TPM = nil }, protocol.CodeInvalidInput, "tpm: the tpm attestor needs"},
		{"site role", func(r *protocol.JoinRequest) { r.Role = protocol.RoleSite }, protocol.CodeWrongRole, "admits role node only"},
		{"another site", func(r *protocol.JoinRequest) { r.Site = "ams1" }, protocol.CodeWrongSite, "enrolled in site " + cptest.Site},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := n.request(t)
			tc.mut(req)
			_, err := f.svc.Join(ctx, req)
			refused(t, tc.name, err, tc.code, tc.want)
		})
	}

	// A certification of the TPM's node key presented with the CSR of
	// another key (a software key), even with that CSR's hash.
	t.Run("certification of another key", func(t *testing.T) {
		other := cptest.NewAgent(t)
		sum := sha256.Sum256(other.CSRDER)
		info, sig, err := n.tp.Certify(n.key, n.ak, sum[:])
		if err != nil {
			t.Fatal(err)
		}
		req := n.request(t)
		req.CSR = string(other.CSRPEM)
		req.TPM.CertifyInfo, req.TPM.CertifySignature = base64.StdEncoding.EncodeToString(info), base64.StdEncoding.EncodeToString(sig)
		_, err = f.svc.Join(ctx, req)
		refused(t, "another key", err, protocol.CodeAttestorRefused, "certification of the node key does not verify")
	})
	if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 0 {
		t.Errorf("refused joins wrote %d nodes", len(nodes))
	}
}

func TestTPMRoundTwoRefusals(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	m := newTPMNode(t, startSwtpm(t))
	for _, x := range []*tpmNode{n, m} {
		if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: x.ekHash(), Site: cptest.Site, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	req := n.request(t)
	ch := n.challenge(t, f.svc, req)

	t.Run("wrong secret", func(t *testing.T) {
		bad := n.answer(t, req, ch)
		bad.TPM.Secret = base64.StdEncoding.EncodeToString(make([]byte, 32))
		_, err := f.svc.Join(ctx, bad)
		refused(t, "wrong secret", err, protocol.CodeAttestorRefused, "tpm.secret is not the challenge's")
	})
	t.Run("another CSR", func(t *testing.T) {
		good := n.answer(t, req, ch)
		n2 := *n
		n2.newKey(t)
		other := n2.request(t)
		other.TPM.ChallengeID, other.TPM.Secret = good.TPM.ChallengeID, good.TPM.Secret
		_, err := f.svc.Join(ctx, other)
		refused(t, "another CSR", err, protocol.CodeAttestorRefused, "issued for another CSR")
	})
	t.Run("expired", func(t *testing.T) {
		ans := n.answer(t, req, ch)
		f.svc.Now = func() time.Time { return time.Now().Add((protocol.TPMChallengeLifetime + 5) * time.Second) }
		defer func() { f.svc.Now = nil }()
		_, err := f.svc.Join(ctx, ans)
		refused(t, "expired", err, protocol.CodeAttestorRefused, "the TPM challenge expired")
	})
	t.Run("from another EK", func(t *testing.T) {
		mreq := m.request(t)
		mch := m.challenge(t, f.svc, mreq)
		ans := m.answer(t, mreq, mch)
		mine := n.request(t)
		mine.TPM.ChallengeID, mine.TPM.Secret = ans.TPM.ChallengeID, ans.TPM.Secret
		_, err := f.svc.Join(ctx, mine)
		refused(t, "another EK", err, protocol.CodeAttestorRefused, "issued for another endorsement key")
	})
	t.Run("not a challenge", func(t *testing.T) {
		ans := n.answer(t, req, ch)
		ans.TPM.ChallengeID = cptest.Seal(t, f.b, "bcjt_x", pki.CSRSHA256(n.csrDER))
		_, err := f.svc.Join(ctx, ans)
		refused(t, "a sealed token as challenge", err, protocol.CodeAttestorRefused, "not a TPM challenge")
		ans.TPM.ChallengeID = "garbage"
		_, err = f.svc.Join(ctx, ans)
		refused(t, "garbage", err, protocol.CodeAttestorRefused, "not a challenge of this control plane")
	})
	t.Run("an enrollment revoked in between", func(t *testing.T) {
		ans := n.answer(t, req, ch)
		if err := f.st.RevokeTPMEnrollment(ctx, n.ekHash(), time.Now()); err != nil {
			t.Fatal(err)
		}
		defer f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: n.ekHash(), Site: cptest.Site, CreatedAt: time.Now()})
		_, err := f.svc.Join(ctx, ans)
		refused(t, "revoked", err, protocol.CodeAttestorRefused, "is not enrolled")
	})
	if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 0 {
		t.Fatalf("refused joins wrote %d nodes", len(nodes))
	}
	// The good answer still joins.
	resp, err := f.svc.Join(ctx, n.answer(t, req, ch))
	if err != nil {
		t.Fatal(err)
	}
	n.verify(t, f.b, resp)
}

// TestTPMReclaimAfterReset: the same TPM joins again with a new node key
// (bcd join --reset) and gets its node back: the EK is proven.
func TestTPMReclaimAfterReset(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: n.ekHash(), Site: cptest.Site, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	first := n.join(t, f)
	var reclaimed []string
	f.svc.Reclaimed = func(id string) { reclaimed = append(reclaimed, id) }
	n.newKey(t)
	again := n.join(t, f)
	if again.NodeID != first.NodeID {
		t.Fatalf("after --reset the TPM joined as %s, want its node %s", again.NodeID, first.NodeID)
	}
	if len(reclaimed) != 1 || reclaimed[0] != first.NodeID {
		t.Errorf("Reclaimed: %v", reclaimed)
	}
	// A node that holds the machine's system UUID but another TPM is not
	// taken over by a tpm join.
	o := newTPMNode(t, startSwtpm(t))
	if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: o.ekHash(), Site: cptest.Site, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	req := o.request(t)
	ch := o.challenge(t, f.svc, req)
	_, err := f.svc.Join(ctx, o.answer(t, req, ch))
	refused(t, "UUID of a node of another TPM", err, protocol.CodeReclaimNotAllowed, "another TPM")
}

// TestPoolPolicyRefusesTokenJoin: a pool whose policy lists only tpm refuses
// a token join with ATTESTOR_NOT_ALLOWED, and leaves the token unused.
func TestPoolPolicyRefusesTokenJoin(t *testing.T) {
	f := newFixture(t)
	if err := f.st.SetPoolPolicy(ctx, store.PoolPolicy{Pool: cptest.Pool, JoinAttestors: []string{protocol.AttestorTPM}, UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	tok, secret := cptest.NewToken(t, f.st, nil)
	a := cptest.NewAgent(t)
	_, err := f.svc.Join(ctx, a.Request(t, f.b, "node", secret, nil))
	refused(t, "token join into a tpm pool", err, protocol.CodeAttestorNotAllowed, "pool "+cptest.Pool+" admits joins with the tpm attestor only, not join-token")
	if got, _ := f.st.GetToken(ctx, tok.ID); !got.UsedAt.IsZero() {
		t.Error("the refused join used the token")
	}
	if err := f.st.SetPoolPolicy(ctx, store.PoolPolicy{Pool: cptest.Pool, JoinAttestors: []string{protocol.AttestorTPM, protocol.AttestorJoinToken}, UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", secret, nil))
	if err != nil {
		t.Fatalf("join-token allowed: %v", err)
	}
	a.Verify(t, f.b, resp)
}

// TestTokenJoinOfTPMHardwareNeedsAllowReclaim: a token join whose claims
// carry the EK of an existing node is a reclaim, which the token must allow
// (and the old node's key prove: the EK was only claimed).
func TestTokenJoinOfTPMHardwareNeedsAllowReclaim(t *testing.T) {
	f := newFixture(t)
	ekPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: cptest.NewAgent(t).CSRDER}))
	claims := func(r *protocol.JoinRequest) { r.Claims.TPMEK = ekPEM; r.Claims.SystemUUID = "" }
	_, first := cptest.NewToken(t, f.st, nil)
	a := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", first, claims))
	if err != nil {
		t.Fatal(err)
	}
	res := a.Verify(t, f.b, resp)
	_, second := cptest.NewToken(t, f.st, nil)
	_, err = f.svc.Join(ctx, cptest.NewAgent(t).Request(t, f.b, "node", second, claims))
	refused(t, "without allow_reclaim", err, protocol.CodeReclaimNotAllowed, "TPM endorsement key")
	_, third := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true })
	b := cptest.NewAgent(t)
	resp, err = f.svc.Join(ctx, b.Request(t, f.b, "node", third, func(r *protocol.JoinRequest) {
		claims(r)
		r.ReclaimProof = b.ReclaimProof(t, a.Key, res.NodeID)
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Verify(t, f.b, resp); got.NodeID != res.NodeID {
		t.Errorf("reclaim gave %s, want %s", got.NodeID, res.NodeID)
	}
}

// TestProvenEKReclaimedOnlyByTheTPM: a node whose EK the tpm attestor proved
// is not taken over by a token join that claims its EK and proves its old
// node key (signed in the TPM) but not the TPM; the same TPM reclaims it, and
// so does a token bound to the node.
func TestProvenEKReclaimedOnlyByTheTPM(t *testing.T) {
	f := newTPMFixture(t)
	n := newTPMNode(t, startSwtpm(t))
	if err := f.st.EnrollTPM(ctx, store.TPMEnrollment{EKSHA256: n.ekHash(), Site: cptest.Site, Pool: cptest.Pool, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	first := n.join(t, f)
	if got, _ := f.st.GetNode(ctx, first.NodeID); !got.TPMEKProven || got.TPMEKSHA256 != n.ekHash() {
		t.Fatalf("after a tpm join: EK %s proven %v, want %s proven", got.TPMEKSHA256, got.TPMEKProven, n.ekHash())
	}
	ekPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: n.ek.PKIX}))
	tok, secret := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true })
	a := cptest.NewAgent(t)
	_, err := f.svc.Join(ctx, a.Request(t, f.b, "node", secret, func(r *protocol.JoinRequest) {
		r.Claims.TPMEK = ekPEM
		r.ReclaimProof = a.ReclaimProof(t, n.key, first.NodeID) // the old node key, in the TPM
	}))
	refused(t, "old key without the TPM", err, protocol.CodeReclaimNotAllowed, "whose TPM endorsement key the tpm attestor proved")
	if err != nil && !strings.Contains(err.Error(), "--node-id "+first.NodeID) {
		t.Errorf("the refusal does not name the node-bound token: %v", err)
	}
	if got, _ := f.st.GetToken(ctx, tok.ID); !got.UsedAt.IsZero() {
		t.Error("the refused join used the token")
	}

	// The same TPM, a new node key (bcd join --reset; bcd join --attestor tpm).
	n.newKey(t)
	if again := n.join(t, f); again.NodeID != first.NodeID {
		t.Fatalf("the same TPM joined as %s, want %s", again.NodeID, first.NodeID)
	}

	// The operator's token bound to the node, with the EK claimed.
	_, bound := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true; t.NodeID = first.NodeID })
	b := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, b.Request(t, f.b, "node", bound, func(r *protocol.JoinRequest) {
		r.Claims.TPMEK = ekPEM
		r.Attestor, r.NodeID = protocol.AttestorProvisioned, first.NodeID
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Verify(t, f.b, resp); got.NodeID != first.NodeID {
		t.Fatalf("the node-bound token gave %s, want %s", got.NodeID, first.NodeID)
	}
	// The same EK, now only claimed, keeps its proof: the key proof still
	// does not take the node over.
	if got, _ := f.st.GetNode(ctx, first.NodeID); !got.TPMEKProven {
		t.Error("a node-bound reclaim with the same EK dropped its proven EK")
	}
	_, secret2 := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true })
	c := cptest.NewAgent(t)
	_, err = f.svc.Join(ctx, c.Request(t, f.b, "node", secret2, func(r *protocol.JoinRequest) {
		r.Claims.TPMEK = ekPEM
		r.ReclaimProof = c.ReclaimProof(t, b.Key, first.NodeID)
	}))
	refused(t, "old key after the node-bound reclaim", err, protocol.CodeReclaimNotAllowed, "whose TPM endorsement key the tpm attestor proved")
}
