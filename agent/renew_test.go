package agent_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/gateway"
	cpjoin "github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// controlPlane is the real JoinService behind the real gateway on loopback TLS,
// on a SQLite store: what a renewal talks to.
type controlPlane struct {
	b   *pki.Bundle
	st  store.Store
	url string
}

func newControlPlane(t *testing.T, ttl time.Duration) *controlPlane {
	t.Helper()
	b := cptest.NewBundle(t)
	st := cptest.NewStore(t)
	svc := &cpjoin.Service{Bundle: b, Store: st, CertTTL: ttl, Attestors: map[string]cpjoin.Attestor{
		protocol.AttestorJoinToken: cpjoin.NewTokenAttestor(st),
	}}
	gw := &gateway.Server{Joiner: svc, Renewer: svc, Store: st, NodeCAs: b.Public.NodeCAPool(), TrustDomain: b.Public.TrustDomain}
	cert, err := b.IssueServingCert([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw.Handler(), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() { srv.Close(); gw.Close(context.Background()) })
	return &controlPlane{b: b, st: st, url: "https://" + l.Addr().String()}
}

// join joins a node through the real join client and stores its identity in a
// new data directory.
func (cp *controlPlane) join(t *testing.T) (string, *agent.Identity) {
	t.Helper()
	_, secret := cptest.NewToken(t, cp.st, nil)
	c := &join.Client{GatewayURL: cp.url, ServerName: "127.0.0.1", Pins: cp.b.Public.Pins(),
		EncryptionKey: cp.b.Public.JoinEncryptionPublicKey(), GiveUpAfter: 5 * time.Second}
	id, key, err := c.Join(context.Background(), join.Request{Role: protocol.RoleNode, Attestor: protocol.AttestorJoinToken, Token: secret, Site: cptest.Site})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "data")
	if err := agent.SaveIdentity(dir, id, key); err != nil {
		t.Fatal(err)
	}
	loaded, err := agent.LoadIdentity(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dir, loaded
}

func (cp *controlPlane) renewer(dir string, id *agent.Identity) *agent.Renewer {
	return &agent.Renewer{DataDir: dir, Identity: id, GatewayURL: cp.url, ServerName: "127.0.0.1",
		ServingCAPin: cp.b.Public.ServingCASPKIPin, JoinSigningPin: cp.b.Public.JoinSigningKeyPin,
		Backoff: agent.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}}
}

func (cp *controlPlane) serial(t *testing.T, nodeID string) string {
	t.Helper()
	n, err := cp.st.GetNode(context.Background(), nodeID)
	if err != nil {
		t.Fatal(err)
	}
	return n.CertSerial
}

func serialOf(id *agent.Identity) string { return id.Leaf().SerialNumber.Text(16) }

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func TestRenewalReplacesThePair(t *testing.T) {
	cp := newControlPlane(t, time.Hour)
	dir, id := cp.join(t)
	oldKey, _ := os.ReadFile(filepath.Join(dir, agent.KeyFile))
	r := cp.renewer(dir, id)
	if err := r.RenewOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	cur := r.Current()
	if serialOf(cur) == serialOf(id) || cp.serial(t, id.NodeID) != serialOf(cur) {
		t.Fatalf("after renewal: old %s, current %s, store %s", serialOf(id), serialOf(cur), cp.serial(t, id.NodeID))
	}
	if agent.SamePublicKey(cur.Key().Public(), id.Key().Public()) {
		t.Error("the renewal kept the old key")
	}
	newKey, _ := os.ReadFile(filepath.Join(dir, agent.KeyFile))
	if string(newKey) == string(oldKey) || exists(filepath.Join(dir, agent.KeyNextFile)) {
		t.Errorf("node.key unchanged (%v) or node.key.next left behind", string(newKey) == string(oldKey))
	}
	if fi, _ := os.Stat(filepath.Join(dir, agent.KeyFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("node.key mode %04o", fi.Mode().Perm())
	}
	loaded, err := agent.LoadIdentity(dir, nil)
	if err != nil || serialOf(loaded) != serialOf(cur) || loaded.Next != nil || loaded.CertIssuedAt.IsZero() || loaded.RenewedAt.IsZero() {
		t.Fatalf("loaded after renewal: %v %+v", err, loaded)
	}
	if loaded.NodeID != id.NodeID || loaded.SPIFFEID != id.SPIFFEID || loaded.GatewayURL != id.GatewayURL || !loaded.JoinedAt.Equal(id.JoinedAt) {
		t.Errorf("the renewal changed who the node is: %+v, was %+v", loaded, id)
	}
	// A second renewal from the renewed pair.
	if err := r.RenewOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if cp.serial(t, id.NodeID) != serialOf(r.Current()) || serialOf(r.Current()) == serialOf(cur) {
		t.Error("the second renewal did not move on")
	}
}

var errStopped = errors.New("stopped by the test")

// TestRenewalCrashStates stops a renewal after each step, as a crash would, then
// loads the identity as a restarted agent does: before the chain is stored the
// old pair loads and the next run redoes the renewal (with the same next key,
// which the control plane already certified after "answered"); after it the
// renewed pair loads and the next run finishes the promotion. Each ends with the
// store's certificate being the one the node holds.
func TestRenewalCrashStates(t *testing.T) {
	cp := newControlPlane(t, time.Hour)
	for _, tc := range []struct {
		step      string
		renewed   bool // the load after the crash gives the renewed pair
		keyNext   bool // node.key.next is on disk after the crash
		storeMove bool // the control plane moved on already
	}{
		{agent.RenewStepKeyWritten, false, true, false},
		{agent.RenewStepAnswered, false, true, true},
		{agent.RenewStepStored, true, true, true},
		{agent.RenewStepPromoted, true, false, true},
	} {
		t.Run(tc.step, func(t *testing.T) {
			dir, id := cp.join(t)
			r := cp.renewer(dir, id)
			r.Hook = func(step string) {
				if step == tc.step {
					panic(errStopped)
				}
			}
			func() {
				defer func() {
					if v := recover(); v != errStopped {
						panic(v)
					}
				}()
				r.RenewOnce(context.Background())
				t.Fatal("the renewal did not stop")
			}()
			if got := exists(filepath.Join(dir, agent.KeyNextFile)); got != tc.keyNext {
				t.Errorf("node.key.next on disk: %v, want %v", got, tc.keyNext)
			}
			if moved := cp.serial(t, id.NodeID) != serialOf(id); moved != tc.storeMove {
				t.Errorf("store moved on: %v, want %v", moved, tc.storeMove)
			}

			// The restart.
			loaded, err := agent.LoadIdentity(dir, nil)
			if err != nil {
				t.Fatalf("the identity does not load after a crash at %s: %v", tc.step, err)
			}
			if renewed := serialOf(loaded) != serialOf(id); renewed != tc.renewed {
				t.Errorf("loaded the renewed pair: %v, want %v", renewed, tc.renewed)
			}
			if !agent.SamePublicKey(loaded.Key().Public(), loaded.Leaf().PublicKey) {
				t.Fatal("the loaded key is not the loaded certificate's")
			}
			if tc.renewed && cp.serial(t, id.NodeID) != serialOf(loaded) {
				t.Errorf("the loaded renewed certificate is not the store's")
			}

			r2 := cp.renewer(dir, loaded)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- r2.Run(ctx) }()
			deadline := time.Now().Add(10 * time.Second)
			for {
				disk, err := agent.LoadIdentity(dir, nil)
				ok := err == nil && disk.Next == nil && !exists(filepath.Join(dir, agent.KeyNextFile)) &&
					serialOf(disk) == cp.serial(t, id.NodeID) && serialOf(r2.Current()) == serialOf(disk) && serialOf(disk) != serialOf(id)
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after a crash at %s the renewal did not finish: load %v, status %+v, store %s, current %s",
						tc.step, err, r2.Status(), cp.serial(t, id.NodeID), serialOf(r2.Current()))
				}
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			<-done
		})
	}
}

func TestRenewalOfADeletedNodeIsRefused(t *testing.T) {
	cp := newControlPlane(t, time.Hour)
	dir, id := cp.join(t)
	if err := cp.st.DeleteNode(context.Background(), id.NodeID, time.Now()); err != nil {
		t.Fatal(err)
	}
	r := cp.renewer(dir, id)
	err := r.RenewOnce(context.Background())
	var refused *agent.RenewalRefusedError
	if !errors.As(err, &refused) || refused.Response.Code != protocol.CodeNodeRevoked {
		t.Fatalf("renewal of a deleted node: %v, want a NODE_REVOKED refusal", err)
	}
	// The node keeps its pair; the next key waits for a later attempt.
	if loaded, err := agent.LoadIdentity(dir, nil); err != nil || serialOf(loaded) != serialOf(id) {
		t.Errorf("after the refusal: %v", err)
	}

	// Run: the refusal shows in the status, and is not retried at once.
	r = cp.renewer(dir, id)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(r.Status().State, "refused: NODE_REVOKED: ") {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want a refusal", r.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	st := r.Status()
	if !strings.Contains(st.State, "was deleted") || time.Until(st.Next) < 15*time.Minute || !st.NotAfter.Equal(id.Leaf().NotAfter) {
		t.Errorf("status %+v: want the reason, a retry a third of the lifetime away (the slow rate), the certificate's expiry", st)
	}
}

func TestRenewAt(t *testing.T) {
	cp := newControlPlane(t, 3*time.Minute)
	_, id := cp.join(t)
	issued := id.CertIssuedAt
	if issued.IsZero() {
		t.Fatal("no cert_issued_at after a join")
	}
	if life := agent.CertLifetime(id); life < 3*time.Minute-time.Second || life > 3*time.Minute+time.Second {
		t.Errorf("lifetime %s, want 3m (not counting the backdated NotBefore)", life)
	}
	for jitter, want := range map[float64]time.Duration{0: 2 * time.Minute, 1: 2*time.Minute + 9*time.Second, -1: 2*time.Minute - 9*time.Second, 5: 2*time.Minute + 9*time.Second} {
		if got := agent.RenewAt(id, jitter).Sub(issued); got < want-time.Second || got > want+time.Second {
			t.Errorf("RenewAt(jitter %v) = issue + %s, want %s", jitter, got, want)
		}
	}
}
