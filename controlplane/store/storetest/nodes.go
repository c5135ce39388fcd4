package storetest

import (
	"crypto/sha256"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

func newToken(t *testing.T, s store.Store, mut func(*store.Token)) (store.Token, string) {
	t.Helper()
	now := time.Now()
	j := token.NewJoin(now)
	tok := store.Token{ID: j.ID, Hash: j.Hash, Pool: "pool_a", Site: "fsn1", Role: "node", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if mut != nil {
		mut(&tok)
	}
	if err := s.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	return tok, j.Token
}

func newNode(id string) store.Node {
	return store.Node{ID: id, Role: "node", Site: "fsn1", Pool: "pool_a", SPIFFEID: "spiffe://x/node/" + id,
		Claims: []byte(`{"system_uuid":"u1"}`), SystemUUID: "u1", CertSerial: "1", CertNotAfter: time.Now().Add(time.Hour), State: "adopting"}
}

func testSitesAndTokens(t *testing.T, s store.Store) {
	if _, err := s.GetSite(ctx, "fsn1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetSite of a missing site: %v", err)
	}
	j := token.NewJoin(time.Now())
	err := s.CreateToken(ctx, store.Token{ID: j.ID, Hash: j.Hash, Site: "fsn1", Role: "node", CreatedAt: time.Now(), ExpiresAt: time.Now()})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("token for a missing site: %v, want ErrNotFound", err)
	}
	if err := s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second site fsn1: %v, want ErrExists", err)
	}
	tok, _ := newToken(t, s, func(t *store.Token) { t.AllowReclaim = true; t.NodeID = "n_1" })
	got, err := s.GetToken(ctx, tok.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Hash.Equal(tok.Hash) || !got.AllowReclaim || got.NodeID != "n_1" || got.Pool != "pool_a" {
		t.Errorf("GetToken = %+v, want %+v", got, tok)
	}
	if err := s.RevokeToken(ctx, tok.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeToken(ctx, tok.ID, time.Now()); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if err := s.RevokeToken(ctx, "jt_missing", time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("revoking a missing token: %v", err)
	}
	list, err := s.ListTokens(ctx)
	if err != nil || len(list) != 1 || list[0].RevokedAt.IsZero() {
		t.Fatalf("ListTokens = %+v, %v", list, err)
	}
}

func testAdmitConsumesTokenOnce(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	tok, _ := newToken(t, s, nil)
	const n = 32
	var ok, used atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Admit(ctx, store.Admission{TokenID: tok.ID, Node: newNode(ids.New(ids.PrefixNode, time.Now())), Now: time.Now()})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrTokenUsed):
				used.Add(1)
			default:
				t.Errorf("Admit: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || used.Load() != n-1 {
		t.Fatalf("%d admitted, %d refused as used; want 1 and %d", ok.Load(), used.Load(), n-1)
	}
	nodes, err := s.ListNodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("ListNodes = %d nodes, %v; want 1", len(nodes), err)
	}
	got, _ := s.GetToken(ctx, tok.ID)
	if got.UsedBy != nodes[0].ID {
		t.Errorf("token used by %q, want %q", got.UsedBy, nodes[0].ID)
	}
}

// testAdmitConsumesNonceOnce: of joins racing on one boot nonce, one writes
// its node and the others get ErrNonceUsed.
func testAdmitConsumesNonceOnce(t *testing.T, s store.Store) {
	now := time.Now()
	h := token.Hash(sha256.Sum256([]byte("nonce-race")))
	if added, err := s.AddBootNonce(ctx, store.BootNonce{Hash: h, MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		CreatedAt: now, ExpiresAt: now.Add(time.Minute)}); !added || err != nil {
		t.Fatalf("AddBootNonce = %v, %v", added, err)
	}
	const n = 32
	var ok, used atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := h
			err := s.Admit(ctx, store.Admission{Node: newNode(ids.New(ids.PrefixNode, time.Now())), BootNonce: &h, Now: time.Now()})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, store.ErrNonceUsed):
				used.Add(1)
			default:
				t.Errorf("Admit: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || used.Load() != n-1 {
		t.Fatalf("%d admitted, %d refused as used; want 1 and %d", ok.Load(), used.Load(), n-1)
	}
	if nodes, err := s.ListNodes(ctx); err != nil || len(nodes) != 1 {
		t.Fatalf("ListNodes = %d nodes, %v; want 1", len(nodes), err)
	}
	if got, err := s.GetBootNonce(ctx, h); err != nil || got.UsedAt.IsZero() {
		t.Errorf("the nonce after the race: %+v %v", got, err)
	}
}

func testAdmitRefusals(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	expired, _ := newToken(t, s, func(t *store.Token) { t.ExpiresAt = time.Now().Add(-time.Second) })
	revoked, _ := newToken(t, s, nil)
	s.RevokeToken(ctx, revoked.ID, time.Now())
	for _, tc := range []struct {
		id   string
		want error
	}{{expired.ID, store.ErrTokenExpired}, {revoked.ID, store.ErrTokenRevoked}, {"jt_nope", store.ErrNotFound}} {
		err := s.Admit(ctx, store.Admission{TokenID: tc.id, Node: newNode("n_x"), Now: time.Now()})
		if !errors.Is(err, tc.want) {
			t.Errorf("Admit with token %s: %v, want %v", tc.id, err, tc.want)
		}
	}
	if _, err := s.GetNode(ctx, "n_x"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a refused admission wrote the node: %v", err)
	}
	// Reclaiming a node that does not exist (or was deleted) is refused and
	// leaves the token unused.
	tok, _ := newToken(t, s, nil)
	if err := s.Admit(ctx, store.Admission{TokenID: tok.ID, Node: newNode("n_gone"), Reclaim: true, Now: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("reclaim of a missing node: %v", err)
	}
	if got, _ := s.GetToken(ctx, tok.ID); !got.UsedAt.IsZero() {
		t.Error("a failed admission consumed the token")
	}
}

func testReclaimAndFind(t *testing.T, s store.Store) {
	n := newNode("n_a")
	n.TPMEKSHA256 = "ek1"
	if err := s.Admit(ctx, store.Admission{Node: n, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit(ctx, store.Admission{Node: n, Now: time.Now()}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("inserting n_a twice: %v", err)
	}
	s.SetNodeState(ctx, "n_a", "adopting", "ready", time.Now())
	for _, q := range [][2]string{{"u1", ""}, {"", "ek1"}, {"other", "ek1"}} {
		got, err := s.FindNodeByClaims(ctx, q[0], q[1])
		if err != nil || got.ID != "n_a" {
			t.Errorf("FindNodeByClaims(%q, %q) = %q, %v", q[0], q[1], got.ID, err)
		}
	}
	if _, err := s.FindNodeByClaims(ctx, "", ""); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("empty claims matched: %v", err)
	}
	n.CertSerial = "2"
	n.State = "adopting"
	if err := s.Admit(ctx, store.Admission{Node: n, Reclaim: true, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetNode(ctx, "n_a")
	if got.CertSerial != "2" || got.State != "adopting" {
		t.Errorf("after reclaim: serial %q state %q", got.CertSerial, got.State)
	}
	if err := s.DeleteNode(ctx, "n_a", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNode(ctx, "n_a", time.Now()); !errors.Is(err, store.ErrNodeDeleted) {
		t.Errorf("deleting twice: %v", err)
	}
	if _, err := s.FindNodeByClaims(ctx, "u1", "ek1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a deleted node matched claims: %v", err)
	}
	if err := s.Admit(ctx, store.Admission{Node: n, Reclaim: true, Now: time.Now()}); !errors.Is(err, store.ErrNodeDeleted) {
		t.Errorf("reclaiming a deleted node: %v", err)
	}
	if list, _ := s.ListNodes(ctx); len(list) != 0 {
		t.Errorf("ListNodes lists a deleted node: %+v", list)
	}
	if err := s.SetCordoned(ctx, "n_missing", true, time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cordoning a missing node: %v", err)
	}
}

func testSessionsAndCommands(t *testing.T, s store.Store) {
	s.Admit(ctx, store.Admission{Node: newNode("n_a"), Now: time.Now()})
	id1, err := s.OpenSession(ctx, store.Session{NodeID: "n_a", Role: "node", DaemonVersion: "1.0", BootID: "b", ProtocolVersion: 1, ConnectedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	id2, err := s.OpenSession(ctx, store.Session{NodeID: "n_a", Role: "node", DaemonVersion: "1.1", BootID: "b", ProtocolVersion: 1, ConnectedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	// The older session ending leaves the newer one current.
	s.CloseSession(ctx, id1, time.Now())
	n, _ := s.GetNode(ctx, "n_a")
	if n.SessionID != id2 || n.DaemonVersion != "1.1" {
		t.Fatalf("node session %d version %q, want %d and 1.1", n.SessionID, n.DaemonVersion, id2)
	}
	s.CloseSession(ctx, id2, time.Now())
	if n, _ := s.GetNode(ctx, "n_a"); n.SessionID != 0 || n.LastSeenAt.IsZero() {
		t.Fatalf("after close: session %d, last seen %v", n.SessionID, n.LastSeenAt)
	}
	if _, err := s.OpenSession(ctx, store.Session{NodeID: "n_missing", ConnectedAt: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("session of a missing node: %v", err)
	}

	now := time.Now()
	c := store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: "n_a", Kind: "node.reboot", State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	if err := s.CreateCommand(ctx, c); err != nil {
		t.Fatal(err)
	}
	open, _ := s.OpenCommands(ctx, "n_a")
	if len(open) != 1 || open[0].ID != c.ID {
		t.Fatalf("OpenCommands = %+v", open)
	}
	s.MarkSent(ctx, c.ID, now)
	if got, _ := s.GetCommand(ctx, c.ID); got.State != store.CommandSent || got.SentAt.IsZero() {
		t.Errorf("after MarkSent: %+v", got)
	}
	if ok, _ := s.ApplyStatus(ctx, store.StatusUpdate{CommandID: c.ID, NodeID: "n_other", State: "RUNNING", At: now}); ok {
		t.Error("another node's status was applied")
	}
	for _, st := range []string{"RUNNING", "SUCCEEDED"} {
		if ok, err := s.ApplyStatus(ctx, store.StatusUpdate{CommandID: c.ID, NodeID: "n_a", State: st, Result: []byte(`{"x":1}`), At: now}); !ok || err != nil {
			t.Fatalf("ApplyStatus %s: %v %v", st, ok, err)
		}
	}
	if ok, _ := s.ApplyStatus(ctx, store.StatusUpdate{CommandID: c.ID, NodeID: "n_a", State: "RUNNING", At: now}); ok {
		t.Error("a terminal command went back to RUNNING")
	}
	got, _ := s.GetCommand(ctx, c.ID)
	if got.State != "SUCCEEDED" || string(got.Result) != `{"x":1}` {
		t.Errorf("command after statuses: %+v", got)
	}
	if open, _ := s.OpenCommands(ctx, "n_a"); len(open) != 0 {
		t.Errorf("a finished command is still open: %+v", open)
	}
	if err := s.AddEvent(ctx, store.Event{NodeID: "n_a", Seq: 3, Kind: protocol.EventLog, Time: now, Message: "hi", ReceivedAt: now}); err != nil {
		t.Fatal(err)
	}
}

func testOperatorToken(t *testing.T, s store.Store) {
	a, b := token.NewOperator(), token.NewOperator()
	if created, err := s.EnsureOperatorToken(ctx, a.Hash, time.Now()); !created || err != nil {
		t.Fatalf("first EnsureOperatorToken = %v, %v", created, err)
	}
	if created, err := s.EnsureOperatorToken(ctx, b.Hash, time.Now()); created || err != nil {
		t.Fatalf("second EnsureOperatorToken = %v, %v", created, err)
	}
	hs, err := s.OperatorTokenHashes(ctx)
	if err != nil || len(hs) != 1 || !hs[0].Equal(a.Hash) {
		t.Fatalf("OperatorTokenHashes = %x, %v", hs, err)
	}
}
