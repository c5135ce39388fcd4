package join

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

type fixture struct {
	b   *pki.Bundle
	st  store.Store
	svc *Service
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	b := cptest.NewBundle(t)
	st := cptest.NewStore(t)
	svc := &Service{Bundle: b, Store: st, Attestors: map[string]Attestor{
		protocol.AttestorJoinToken:   NewTokenAttestor(st),
		protocol.AttestorProvisioned: NewProvisionedAttestor(st),
	}}
	return &fixture{b, st, svc}
}

func code(err error) string {
	if e := httpjson.Response(err); e != nil {
		return e.Code
	}
	return ""
}

func TestJoinSucceeds(t *testing.T) {
	f := newFixture(t)
	tok, secret := cptest.NewToken(t, f.st, nil)
	a := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", secret, func(r *protocol.JoinRequest) { r.Site = cptest.Site }))
	if err != nil {
		t.Fatal(err)
	}
	res := a.Verify(t, f.b, resp)
	if res.Role != "node" || res.Site != cptest.Site || res.Pool != cptest.Pool || !strings.HasPrefix(res.NodeID, "n_") || len(res.NodeID) != 28 {
		t.Errorf("result %+v", res)
	}
	if !protocol.ValidNodeID(res.NodeID) {
		t.Errorf("node id %q is not valid", res.NodeID)
	}
	if len(res.CertChain) != 2 || res.CertChain[1] != f.b.Public.NodeCAPEM {
		t.Errorf("chain: want leaf then node CA")
	}
	if len(res.TrustBundle) != 2 || res.TrustBundle[0] != f.b.Public.NodeCAPEM || res.TrustBundle[1] != f.b.Public.ServingCAPEM {
		t.Errorf("trust bundle: want node CA then serving CA")
	}
	leaf := a.Leaf(t, res)
	if d := leaf.NotAfter.Sub(time.Now()); d < 89*24*time.Hour || d > 91*24*time.Hour {
		t.Errorf("certificate lasts %v, want 90 days", d)
	}
	if resp.SigningKey != f.b.Public.JoinSigningPublicPEM {
		t.Errorf("signing key is not the join signing public key")
	}
	// The JWS verifies under the signing key and no other.
	if _, err := pki.Verify(f.b.Public.JoinSigningPublicKey(), protocol.PurposeJoinResponse, resp.Signed); err != nil {
		t.Errorf("Verify with the join signing key: %v", err)
	}
	other := cptest.NewBundle(t)
	if _, err := pki.Verify(other.Public.JoinSigningPublicKey(), protocol.PurposeJoinResponse, resp.Signed); err == nil {
		t.Error("the join response verifies under another key")
	}
	n, err := f.st.GetNode(ctx, res.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if n.State != protocol.NodeAdopting || n.CertSerial != leaf.SerialNumber.Text(16) || n.SPIFFEID != res.SPIFFEID {
		t.Errorf("node record %+v", n)
	}
	if got, _ := f.st.GetToken(ctx, tok.ID); got.UsedBy != res.NodeID {
		t.Errorf("token used by %q, want %q", got.UsedBy, res.NodeID)
	}
}

func TestJoinRefusals(t *testing.T) {
	f := newFixture(t)
	st := f.st
	a := cptest.NewAgent(t)
	mk := func(mut func(*store.Token)) string { _, s := cptest.NewToken(t, st, mut); return s }

	used := mk(nil)
	if _, err := f.svc.Join(ctx, cptest.NewAgent(t).Request(t, f.b, "node", used, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "used-1" })); err != nil {
		t.Fatal(err)
	}
	revokedTok, revoked := cptest.NewToken(t, st, nil)
	st.RevokeToken(ctx, revokedTok.ID, time.Now())
	expired := mk(func(t *store.Token) { t.ExpiresAt = time.Now().Add(-time.Minute) })
	bound := mk(func(t *store.Token) { t.NodeID = "n_bound" })
	otherSite := "ams1"
	st.CreateSite(ctx, store.Site{Name: otherSite, CreatedAt: time.Now()})

	// A node already holds this machine's system UUID.
	holderTok := mk(nil)
	holderAgent := cptest.NewAgent(t)
	holderResp, err := f.svc.Join(ctx, holderAgent.Request(t, f.b, "node", holderTok, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "HOLDER-UUID" }))
	if err != nil {
		t.Fatal(err)
	}
	holder := holderAgent.Verify(t, f.b, holderResp)
	holderClaims := func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "holder-uuid" }
	// A reclaim with the holder's key: what is refused is the pool or site.
	holderProof := func(r *protocol.JoinRequest) {
		holderClaims(r)
		r.ReclaimProof = a.ReclaimProof(t, holderAgent.Key, holder.NodeID)
	}

	unknown := strings.Replace(mk(nil), "bcjt_jt_0", "bcjt_jt_1", 1)
	for _, tc := range []struct {
		name string
		req  *protocol.JoinRequest
		want string
	}{
		{"unknown token", a.Request(t, f.b, "node", unknown, nil), protocol.CodeTokenUnknown},
		{"garbage token", a.Request(t, f.b, "node", "bcjt_nonsense", nil), protocol.CodeTokenUnknown},
		{"wrong secret", a.Request(t, f.b, "node", used[:len(used)-4]+"aaaa", nil), protocol.CodeTokenUnknown},
		{"used", a.Request(t, f.b, "node", used, nil), protocol.CodeTokenUsed},
		{"expired", a.Request(t, f.b, "node", expired, nil), protocol.CodeTokenExpired},
		{"revoked", a.Request(t, f.b, "node", revoked, nil), protocol.CodeTokenRevoked},
		{"wrong role", a.Request(t, f.b, "site", mk(nil), nil), protocol.CodeWrongRole},
		{"wrong site", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) { r.Site = otherSite }), protocol.CodeWrongSite},
		{"reclaim not allowed", a.Request(t, f.b, "node", mk(nil), holderClaims), protocol.CodeReclaimNotAllowed},
		{"reclaim without proof", a.Request(t, f.b, "node", mk(func(t *store.Token) { t.AllowReclaim = true }), holderClaims), protocol.CodeReclaimNotAllowed},
		{"reclaim, other pool", a.Request(t, f.b, "node", mk(func(t *store.Token) { t.AllowReclaim = true; t.Pool = "pool_b" }), holderProof), protocol.CodeWrongPool},
		{"reclaim, other site", a.Request(t, f.b, "node", mk(func(t *store.Token) { t.AllowReclaim = true; t.Site = otherSite }), holderProof), protocol.CodeWrongSite},
		{"unknown attestor", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) { r.Attestor = "magic" }), protocol.CodeAttestorRefused},
		{"tpm not enabled", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) { r.Attestor = protocol.AttestorTPM }), protocol.CodeAttestorRefused},
		{"bound token without node id", a.Request(t, f.b, "node", bound, nil), protocol.CodeAttestorRefused},
		{"provisioned, unbound token", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) {
			r.Attestor, r.NodeID = protocol.AttestorProvisioned, "n_bound"
		}), protocol.CodeAttestorRefused},
		{"provisioned, other node id", a.Request(t, f.b, "node", bound, func(r *protocol.JoinRequest) {
			r.Attestor, r.NodeID = protocol.AttestorProvisioned, "n_other"
		}), protocol.CodeAttestorRefused},
		{"provisioned, no node id", a.Request(t, f.b, "node", bound, func(r *protocol.JoinRequest) { r.Attestor = protocol.AttestorProvisioned }), protocol.CodeInvalidInput},
		{"no token", a.Request(t, f.b, "node", "", nil), protocol.CodeInvalidInput},
		{"bad role", a.Request(t, f.b, "admin", mk(nil), nil), protocol.CodeInvalidInput},
		{"no protocol version", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) { r.ProtocolVersion = 0 }), protocol.CodeInvalidInput},
		{"bad csr", a.Request(t, f.b, "node", mk(nil), func(r *protocol.JoinRequest) {
			r.CSR = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
		}), protocol.CodeInvalidInput},
		{"token for another CSR", a.Request(t, f.b, "node", "", func(r *protocol.JoinRequest) {
			r.SealedToken = cptest.Seal(t, f.b, mk(nil), strings.Repeat("0", 64))
		}), protocol.CodeInvalidInput},
		{"sealed to another key", a.Request(t, f.b, "node", "", func(r *protocol.JoinRequest) {
			r.SealedToken = cptest.Seal(t, cptest.NewBundle(t), mk(nil), "x")
		}), protocol.CodeInvalidInput},
		{"bad node id", a.Request(t, f.b, "node", bound, func(r *protocol.JoinRequest) {
			r.Attestor, r.NodeID = protocol.AttestorProvisioned, "N/../x"
		}), protocol.CodeInvalidInput},
	} {
		_, err := f.svc.Join(ctx, tc.req)
		if got := code(err); got != tc.want {
			t.Errorf("%s: err %v, want code %s", tc.name, err, tc.want)
		}
		if err != nil && tc.req.SealedToken != "" && strings.Contains(err.Error(), "bcjt_") {
			t.Errorf("%s: the error quotes a token: %v", tc.name, err)
		}
	}
	// A refused join never consumed a token.
	toks, _ := st.ListTokens(ctx)
	usedCount := 0
	for _, tk := range toks {
		if !tk.UsedAt.IsZero() {
			usedCount++
		}
	}
	if usedCount != 2 {
		t.Errorf("%d tokens used, want 2 (the two successful joins)", usedCount)
	}
}

func TestReclaim(t *testing.T) {
	f := newFixture(t)
	_, first := cptest.NewToken(t, f.st, nil)
	claims := func(r *protocol.JoinRequest) {
		r.Claims.TPMEK = "-----BEGIN PUBLIC KEY-----\nAAEC\n-----END PUBLIC KEY-----\n"
	}
	a1 := cptest.NewAgent(t)
	r1, err := f.svc.Join(ctx, a1.Request(t, f.b, "node", first, claims))
	if err != nil {
		t.Fatal(err)
	}
	res1 := a1.Verify(t, f.b, r1)
	f.st.SetNodeState(ctx, res1.NodeID, protocol.NodeAdopting, protocol.NodeReady, time.Now())

	var reclaimed []string
	f.svc.Reclaimed = func(id string) { reclaimed = append(reclaimed, id) }
	_, again := cptest.NewToken(t, f.st, func(t *store.Token) { t.AllowReclaim = true })
	a2 := cptest.NewAgent(t)
	r2, err := f.svc.Join(ctx, a2.Request(t, f.b, "node", again, func(r *protocol.JoinRequest) {
		claims(r)
		r.Claims.SystemUUID = "a-new-board"
		r.ReclaimProof = a2.ReclaimProof(t, a1.Key, res1.NodeID)
	}))
	if err != nil {
		t.Fatal(err)
	}
	res2 := a2.Verify(t, f.b, r2)
	if res2.NodeID != res1.NodeID {
		t.Fatalf("reclaim gave node %s, want %s", res2.NodeID, res1.NodeID)
	}
	if len(reclaimed) != 1 || reclaimed[0] != res1.NodeID {
		t.Errorf("Reclaimed hook called with %v", reclaimed)
	}
	n, _ := f.st.GetNode(ctx, res1.NodeID)
	if n.CertSerial != a2.Leaf(t, res2).SerialNumber.Text(16) || n.State != protocol.NodeAdopting {
		t.Errorf("after reclaim: serial %s state %s", n.CertSerial, n.State)
	}
	// Placeholder UUIDs never match.
	for i := 0; i < 2; i++ {
		_, tk := cptest.NewToken(t, f.st, nil)
		if _, err := f.svc.Join(ctx, cptest.NewAgent(t).Request(t, f.b, "node", tk, func(r *protocol.JoinRequest) {
			r.Claims.SystemUUID = "03000200-0400-0500-0006-000700080009"
		})); err != nil {
			t.Fatalf("join %d with a placeholder UUID: %v", i, err)
		}
	}
}

func TestProvisioned(t *testing.T) {
	f := newFixture(t)
	const id = "n_01jabcdefghjkmnpqrstvwxyz0"
	prov := func(r *protocol.JoinRequest) { r.Attestor, r.NodeID = protocol.AttestorProvisioned, id }
	_, tk := cptest.NewToken(t, f.st, func(t *store.Token) { t.NodeID = id })
	a := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", tk, prov))
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Verify(t, f.b, resp); res.NodeID != id {
		t.Fatalf("provisioned join gave %s, want %s", res.NodeID, id)
	}
	// The installed OS joins again (a reinstall): same id, no allow_reclaim needed.
	_, tk2 := cptest.NewToken(t, f.st, func(t *store.Token) { t.NodeID = id })
	a2 := cptest.NewAgent(t)
	resp, err = f.svc.Join(ctx, a2.Request(t, f.b, "node", tk2, prov))
	if err != nil {
		t.Fatal(err)
	}
	if res := a2.Verify(t, f.b, resp); res.NodeID != id {
		t.Fatalf("second provisioned join gave %s, want %s", res.NodeID, id)
	}
	// Bound to a node of another pool: WRONG_POOL.
	_, tk3 := cptest.NewToken(t, f.st, func(t *store.Token) { t.NodeID = id; t.Pool = "pool_z" })
	if _, err := f.svc.Join(ctx, cptest.NewAgent(t).Request(t, f.b, "node", tk3, prov)); code(err) != protocol.CodeWrongPool {
		t.Errorf("provisioned, other pool: %v", err)
	}
	// A deleted node's id never joins again.
	f.st.DeleteNode(ctx, id, time.Now())
	_, tk4 := cptest.NewToken(t, f.st, func(t *store.Token) { t.NodeID = id })
	if _, err := f.svc.Join(ctx, cptest.NewAgent(t).Request(t, f.b, "node", tk4, prov)); code(err) != protocol.CodeNodeRevoked {
		t.Errorf("provisioned, deleted node: %v", err)
	}
}

func TestTokenSingleUseUnderConcurrency(t *testing.T) {
	f := newFixture(t)
	_, tk := cptest.NewToken(t, f.st, nil)
	const n = 24
	reqs := make([]*protocol.JoinRequest, n)
	for i := range reqs {
		reqs[i] = cptest.NewAgent(t).Request(t, f.b, "node", tk, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "" })
	}
	var ok, usedN atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, req := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := f.svc.Join(ctx, req)
			switch code(err) {
			case "":
				if err != nil {
					t.Errorf("join: %v", err)
					return
				}
				ok.Add(1)
			case protocol.CodeTokenUsed:
				usedN.Add(1)
			default:
				t.Errorf("join: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if ok.Load() != 1 || usedN.Load() != n-1 {
		t.Fatalf("%d joins succeeded and %d got TOKEN_USED; want 1 and %d", ok.Load(), usedN.Load(), n-1)
	}
	if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 1 {
		t.Fatalf("%d nodes, want 1", len(nodes))
	}
}

// approvals is a test attestor that defers a CSR until it is approved.
type approvals struct {
	mu       sync.Mutex
	approved map[string]bool
	calls    int
}

func (a *approvals) Attest(_ context.Context, r *Request) (Verdict, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls++
	if !a.approved[r.CSRSHA256] {
		return Verdict{RetryAfter: 1500 * time.Millisecond}, nil
	}
	return Verdict{Admit: &Admission{Role: r.Join.Role, Site: cptest.Site, Pool: "pool_approved"}}, nil
}

func TestDeferralThenApproval(t *testing.T) {
	f := newFixture(t)
	att := &approvals{approved: map[string]bool{}}
	f.svc.Attestors["approval"] = att
	a := cptest.NewAgent(t)
	req := a.Request(t, f.b, "node", "", func(r *protocol.JoinRequest) { r.Attestor = "approval" })
	resp, err := f.svc.Join(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Signed != "" || resp.RetryAfterS != 2 {
		t.Fatalf("first answer %+v, want a deferral of 2 s", resp)
	}
	if nodes, _ := f.st.ListNodes(ctx); len(nodes) != 0 {
		t.Fatal("a deferred join wrote a node")
	}
	att.mu.Lock()
	att.approved[pki.CSRSHA256(a.CSRDER)] = true
	att.mu.Unlock()
	resp, err = f.svc.Join(ctx, req) // the same CSR, retried
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Verify(t, f.b, resp); res.Pool != "pool_approved" {
		t.Errorf("approved join: %+v", res)
	}
}

func TestStoreFailureIsNotARefusal(t *testing.T) {
	f := newFixture(t)
	_, tk := cptest.NewToken(t, f.st, nil)
	req := cptest.NewAgent(t).Request(t, f.b, "node", tk, nil)
	f.st.Close()
	_, err := f.svc.Join(ctx, req)
	if err == nil || code(err) != "" {
		t.Fatalf("join on a closed store: %v; want a plain error (answered as retryable)", err)
	}
}

func TestDecodeRequest(t *testing.T) {
	good, _ := json.Marshal(protocol.JoinRequest{ProtocolVersion: 1, Role: "node"})
	if _, err := DecodeRequest(bytes.NewReader(good)); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"unknown field": `{"protocol_version":1,"surprise":true}`,
		"trailing":      string(good) + `{}`,
		"not json":      `role=node`,
		"array":         `[]`,
		"too large":     `{"csr":"` + strings.Repeat("a", protocol.MaxJoinRequestSize) + `"}`,
		"wrong type":    `{"protocol_version":"1"}`,
	} {
		if _, err := DecodeRequest(strings.NewReader(body)); code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
	}
}

func FuzzDecodeJoinRequest(f *testing.F) {
	good, _ := json.Marshal(protocol.JoinRequest{ProtocolVersion: 1, CSR: "x", Role: "node", Attestor: "join-token",
		Claims: protocol.Claims{MACs: []string{"aa:bb"}, Disks: []protocol.Disk{{Name: "nvme0n1"}}}})
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"claims":{"gpus":[{"index":0,"name":"H100"}]}}`))
	f.Add([]byte(`{"protocol_version":1} x`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(bytes.NewReader(data))
		if err != nil {
			if code(err) != protocol.CodeInvalidInput {
				t.Fatalf("error without INVALID_INPUT: %v", err)
			}
			return
		}
		if len(data) > protocol.MaxJoinRequestSize {
			t.Fatalf("accepted %d bytes", len(data))
		}
		// What decodes re-encodes and decodes to the same request.
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeRequest(bytes.NewReader(again)); err != nil && len(again) <= protocol.MaxJoinRequestSize {
			t.Fatalf("re-encoded request refused: %v", err)
		}
	})
}
