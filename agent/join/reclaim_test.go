package join

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http"
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

// checkProof wants req to carry a reclaim proof by the key of old (node
// old.NodeID) for req's own CSR.
func checkProof(t *testing.T, req protocol.JoinRequest, old *agent.Identity) {
	t.Helper()
	p := req.ReclaimProof
	if p == nil {
		t.Fatal("the join carries no reclaim proof")
	}
	payload, err := protocol.DecodeReclaimPayload(p.Payload)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode([]byte(req.CSR))
	if payload.Purpose != protocol.PurposeReclaimProof || payload.NodeID != old.NodeID || payload.CSRSHA256 != pki.CSRSHA256(blk.Bytes) ||
		time.Since(payload.Time) > time.Minute {
		t.Errorf("proof payload %+v, want node %s and the request's CSR", payload, old.NodeID)
	}
	if !bytes.Equal(p.PublicKey, old.Leaf().RawSubjectPublicKeyInfo) {
		t.Error("the proof's key is not the old node's")
	}
	pub, _ := x509.ParsePKIXPublicKey(p.PublicKey)
	digest := sha256.Sum256(p.Payload)
	if ec, ok := pub.(*ecdsa.PublicKey); !ok || !ecdsa.VerifyASN1(ec, digest[:], p.Signature) {
		t.Error("the proof's signature does not verify")
	}
}

// TestJoinAfterResetProvesTheOldKey: after --reset the next token join signs
// a reclaim proof with the moved-aside node.key, of the newest identity moved
// aside; a moved-aside identity whose key does not load is passed over.
func TestJoinAfterResetProvesTheOldKey(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	first, err := agent.LoadIdentity(f.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f.g.Joins()[0].ReclaimProof != nil {
		t.Error("a first join carries a reclaim proof")
	}
	f.o.Reset, f.o.Yes = true, true
	f.o.Now = func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }
	f.g.Tokens["bcjt_second"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f.env[EnvToken] = "bcjt_second"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	checkProof(t, f.g.Joins()[1], first)
	second, err := agent.LoadIdentity(f.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A second reset in the same second (-1): its identity is the newer.
	f.g.Tokens["bcjt_third"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f.env[EnvToken] = "bcjt_third"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, agent.IdentityFile+".reset-20250102T030405Z-1")); err != nil {
		t.Fatal(err)
	}
	checkProof(t, f.g.Joins()[2], second)

	// The newest moved-aside key is damaged: the one before proves.
	f.o.Now = func() time.Time { return time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC) }
	f.g.Tokens["bcjt_fourth"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f.env[EnvToken] = ""
	f.o.Stdin = strings.NewReader("")
	if err := f.run(t); exitCode(err) != 2 {
		t.Fatalf("reset without a token: %v", err)
	}
	if err := os.WriteFile(filepath.Join(f.dataDir, agent.KeyFile+".reset-20250102T030406Z"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	f.o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	f.o.Reset, f.o.Yes = false, false
	f.env[EnvToken] = "bcjt_fourth"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	checkProof(t, f.g.Joins()[3], second)
	if !strings.Contains(logs.String(), "does not load") {
		t.Errorf("no warning about the damaged identity:\n%s", logs.String())
	}
}

// TestReclaimProofDroppedForAnOlderControlPlane: a control plane that does
// not know reclaim_proof refuses it as an unknown field; bcd join joins again
// without it.
func TestReclaimProofDroppedForAnOlderControlPlane(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	inner := f.g.Server.Config.Handler
	refusedN := 0
	f.g.Server.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == protocol.PathJoin && bytes.Contains(body, []byte(`"reclaim_proof"`)) {
			refusedN++
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(protocol.ErrorResponse{Code: protocol.CodeInvalidInput, Message: `request body: json: unknown field "reclaim_proof"`})
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		inner.ServeHTTP(w, r)
	})
	f.o.Reset, f.o.Yes = true, true
	f.g.Tokens["bcjt_second"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f.env[EnvToken] = "bcjt_second"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	joins := f.g.Joins()
	if refusedN != 1 || len(joins) != 2 || joins[1].ReclaimProof != nil {
		t.Errorf("%d refused, %d joins; want the proof refused once and the join again without it", refusedN, len(joins))
	}
}
