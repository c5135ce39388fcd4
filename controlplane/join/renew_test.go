package join

import (
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/protocol"
)

// joined joins a node and returns its agent, its result and its certificate's
// serial in the store's form.
func (f *fixture) joined(t *testing.T) (*cptest.Agent, protocol.JoinResult, string) {
	t.Helper()
	_, secret := cptest.NewToken(t, f.st, nil)
	a := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, a.Request(t, f.b, "node", secret, nil))
	if err != nil {
		t.Fatal(err)
	}
	res := a.Verify(t, f.b, resp)
	return a, res, a.Leaf(t, res).SerialNumber.Text(16)
}

func renewal(node protocol.JoinResult, serial string, next *cptest.Agent) Renewal {
	return Renewal{NodeID: node.NodeID, Role: node.Role, Serial: serial,
		Request: &protocol.RenewRequest{ProtocolVersion: protocol.Version, CSR: string(next.CSRPEM)}}
}

func TestRenewCertifiesTheNextKey(t *testing.T) {
	f := newFixture(t)
	f.svc.CertTTL = 3 * time.Minute
	_, res, serial := f.joined(t)
	before, _ := f.st.GetNode(ctx, res.NodeID)

	next := cptest.NewAgent(t)
	resp, err := f.svc.Renew(ctx, renewal(res, serial, next))
	if err != nil {
		t.Fatal(err)
	}
	got := next.Verify(t, f.b, resp) // the CSR's hash, the new key, the SPIFFE id
	if got.NodeID != res.NodeID || got.Role != res.Role || got.Site != res.Site || got.Pool != res.Pool {
		t.Errorf("renewal result %+v, joined as %+v", got, res)
	}
	leaf := next.Leaf(t, got)
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 3*time.Minute+10*time.Minute {
		t.Errorf("lifetime %s, want about CertTTL", life)
	}
	after, _ := f.st.GetNode(ctx, res.NodeID)
	if after.CertSerial != leaf.SerialNumber.Text(16) || !after.CertNotAfter.Equal(leaf.NotAfter.Truncate(time.Millisecond)) ||
		after.PrevCertSerial != serial || after.CertKeySHA256 != KeySHA256(leaf.RawSubjectPublicKeyInfo) {
		t.Errorf("store after renewal: %+v (leaf serial %s not_after %v)", after, leaf.SerialNumber.Text(16), leaf.NotAfter)
	}
	if after.State != before.State || after.JoinedAt != before.JoinedAt {
		t.Errorf("renewal changed the node: before %+v after %+v", before, after)
	}

	// The old certificate asks again for the same key (its answer was lost):
	// certified again. For another key: refused.
	if resp, err := f.svc.Renew(ctx, renewal(res, serial, next)); err != nil {
		t.Errorf("a retried renewal for the same key: %v", err)
	} else {
		next.Verify(t, f.b, resp)
	}
	if _, err := f.svc.Renew(ctx, renewal(res, serial, cptest.NewAgent(t))); code(err) != protocol.CodeCertReplaced {
		t.Errorf("the replaced certificate renewing for another key: %v, want CERT_REPLACED", err)
	}
}

func TestRenewRefusals(t *testing.T) {
	f := newFixture(t)
	_, res, serial := f.joined(t)

	// A certificate a later renewal replaced cannot renew (beyond the retry of
	// that same renewal), nor can an unknown serial.
	n1 := cptest.NewAgent(t)
	resp, err := f.svc.Renew(ctx, renewal(res, serial, n1))
	if err != nil {
		t.Fatal(err)
	}
	s1 := n1.Leaf(t, n1.Verify(t, f.b, resp)).SerialNumber.Text(16)
	n2 := cptest.NewAgent(t)
	if _, err := f.svc.Renew(ctx, renewal(res, s1, n2)); err != nil {
		t.Fatal(err)
	}
	for name, serial := range map[string]string{"twice replaced": serial, "replaced once": s1, "unknown": "abc"} {
		_, err := f.svc.Renew(ctx, renewal(res, serial, cptest.NewAgent(t)))
		if code(err) != protocol.CodeCertReplaced || !strings.Contains(err.Error(), "replaced by a later join or renewal") {
			t.Errorf("%s certificate: %v, want CERT_REPLACED", name, err)
		}
	}

	// A CSR that does not parse, or whose signature is not its key's.
	bad := renewal(res, s1, n2)
	bad.Request.CSR = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"
	if _, err := f.svc.Renew(ctx, bad); code(err) != protocol.CodeInvalidInput || !strings.Contains(err.Error(), "CSR does not parse") {
		t.Errorf("garbage CSR: %v, want INVALID_INPUT", err)
	}
	bad.Request.CSR = ""
	if _, err := f.svc.Renew(ctx, bad); code(err) != protocol.CodeInvalidInput {
		t.Errorf("no CSR: %v, want INVALID_INPUT", err)
	}

	// Another role than the node's.
	wrongRole := renewal(res, s1, n2)
	wrongRole.Role = protocol.RoleSite
	if _, err := f.svc.Renew(ctx, wrongRole); code(err) != protocol.CodeNodeRevoked {
		t.Errorf("wrong role: %v, want NODE_REVOKED", err)
	}

	// A deleted node is refused with the way back, and so is an unknown one.
	cur, _ := f.st.GetNode(ctx, res.NodeID)
	if err := f.st.DeleteNode(ctx, res.NodeID, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, err = f.svc.Renew(ctx, renewal(res, cur.CertSerial, cptest.NewAgent(t)))
	if code(err) != protocol.CodeNodeRevoked || !strings.Contains(err.Error(), "was deleted") ||
		!strings.HasSuffix(err.Error(), "bcd join --reset --yes, then bcd join") {
		t.Errorf("deleted node: %v, want NODE_REVOKED with the reset hint", err)
	}
	if after, _ := f.st.GetNode(ctx, res.NodeID); after.CertSerial != cur.CertSerial {
		t.Errorf("a refused renewal changed the serial to %s", after.CertSerial)
	}
	unknown := renewal(res, cur.CertSerial, cptest.NewAgent(t))
	unknown.NodeID = "n_nobody"
	if _, err := f.svc.Renew(ctx, unknown); code(err) != protocol.CodeNodeRevoked {
		t.Errorf("unknown node: %v, want NODE_REVOKED", err)
	}
}
