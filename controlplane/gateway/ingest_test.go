package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/protocol"
)

// welcomed joins a node of role and opens its session up to the Welcome.
func welcomed(t *testing.T, e *env, role string) (*wsClient, string) {
	t.Helper()
	_, res, cert := e.joined(role)
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	return c, res.NodeID
}

// gatedStore holds the first AddEvents until open is closed, and counts the calls;
// with fail set, that first call fails.
type gatedStore struct {
	Store
	open  chan struct{}
	fail  bool
	mu    sync.Mutex
	calls []int    // events per AddEvents call
	nodes []string // the node of each call
}

func (g *gatedStore) AddEvents(c context.Context, evs []store.Event) error {
	g.mu.Lock()
	first := len(g.calls) == 0
	g.calls = append(g.calls, len(evs))
	if len(evs) > 0 {
		g.nodes = append(g.nodes, evs[0].NodeID)
	}
	g.mu.Unlock()
	if first {
		<-g.open
		if g.fail {
			return errors.New("disk I/O error")
		}
	}
	return g.Store.AddEvents(c, evs)
}

func (in *ingester) queued() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.queue)
}

func (is *ingesters) queued() int { return is[0].queued() + is[1].queued() }

// TestEventsStoredInBatches: events that arrive while the store is busy are
// stored together, in order, in one transaction, and acknowledged with one ack
// for the last; a status among them keeps its place.
func TestEventsStoredInBatches(t *testing.T) {
	var g *gatedStore
	e := start(t, func(s *Server) {
		g = &gatedStore{Store: s.Store, open: make(chan struct{})}
		s.Store = g
	})
	c, _ := welcomed(t, e, protocol.RoleNode)

	c.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog, Time: time.Now(), Message: "first"})
	e.waitFor("the first event to reach the store", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.calls) == 1
	})
	const more = 150
	for seq := uint64(2); seq <= more+1; seq++ {
		if seq == 100 {
			c.send(protocol.FrameStatus, protocol.Status{Seq: seq, CommandID: "cmd_unknown", State: protocol.StateFailed, Time: time.Now()})
			continue
		}
		c.send(protocol.FrameEvent, protocol.Event{Seq: seq, Kind: protocol.EventLog, Time: time.Now(), Message: "more"})
	}
	e.waitFor("every frame to be queued", func() bool { return e.gw.ingest.queued() == more })
	close(g.open)

	var acks []uint64
	for len(acks) == 0 || acks[len(acks)-1] != more+1 {
		var ack protocol.Ack
		c.expect(protocol.FrameAck, &ack)
		acks = append(acks, ack.Seq)
	}
	g.mu.Lock()
	calls := append([]int(nil), g.calls...)
	g.mu.Unlock()
	// The first event alone; then the 98 events before the status, the status,
	// and the 51 after it, in one round.
	if len(calls) != 3 || calls[0] != 1 || calls[1] != 98 || calls[2] != 51 {
		t.Errorf("AddEvents calls of %v events, want [1 98 51]", calls)
	}
	// Two acks, or one when the writer had not sent the first before the second
	// replaced it (acks coalesce: the last one covers every entry before it).
	if len(acks) > 2 || (len(acks) == 2 && acks[0] != 1) {
		t.Errorf("acks %v, want 1 then %d, or %d alone", acks, more+1, more+1)
	}
}

// TestNothingStoredAfterAFailedBatch: once storing an event failed, the events the
// session read behind it are neither stored nor acknowledged (an ack of a later
// one would tell the agent to drop the one that failed), and the session ends.
func TestNothingStoredAfterAFailedBatch(t *testing.T) {
	var g *gatedStore
	e := start(t, func(s *Server) {
		g = &gatedStore{Store: s.Store, open: make(chan struct{}), fail: true}
		s.Store = g
	})
	c, _ := welcomed(t, e, protocol.RoleNode)
	c.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog, Time: time.Now(), Message: "fails"})
	e.waitFor("the first event to reach the store", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.calls) == 1
	})
	for seq := uint64(2); seq <= 11; seq++ {
		c.send(protocol.FrameEvent, protocol.Event{Seq: seq, Kind: protocol.EventLog, Time: time.Now(), Message: "behind it"})
	}
	e.waitFor("the events behind it to be queued", func() bool { return e.gw.ingest.queued() == 10 })
	close(g.open)
	var sawError bool
	for {
		f, err := c.recv()
		if err != nil {
			break // the session ended
		}
		switch f.Type {
		case protocol.FrameAck:
			t.Errorf("an ack after a failed store: %s", f.Data)
		case protocol.FrameError:
			sawError = true
		}
	}
	if !sawError {
		t.Error("the session ended without saying why")
	}
	e.waitFor("the ingester to finish", func() bool { return e.gw.ingest.queued() == 0 })
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.calls) != 1 {
		t.Errorf("AddEvents called %d times after the failure, want none", len(g.calls)-1)
	}
}

// TestSiteSessionStoredFirst: a site agent's events sent behind a full queue of a
// node's are stored in the next round, ahead of them: its stream carries the
// nonces every ramdisk of its site waits for.
func TestSiteSessionStoredFirst(t *testing.T) {
	var g *gatedStore
	e := start(t, func(s *Server) {
		g = &gatedStore{Store: s.Store, open: make(chan struct{})}
		s.Store = g
	})
	node, nodeID := welcomed(t, e, protocol.RoleNode)
	site, siteID := welcomed(t, e, protocol.RoleSite)
	node.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog, Time: time.Now(), Message: "first"})
	e.waitFor("the first event to reach the store", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.calls) == 1
	})
	const behind = ingestQueue // the others' queue full: the site's reader must not wait for it
	for seq := uint64(2); seq <= behind+1; seq++ {
		node.send(protocol.FrameEvent, protocol.Event{Seq: seq, Kind: protocol.EventLog, Time: time.Now(), Message: "status"})
	}
	e.waitFor("the node's events to be queued", func() bool { return e.gw.ingest.queued() == behind })
	site.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog, Time: time.Now(), Message: "nonce"})
	// Stored while the node's first store still holds the one write
	// connection's turn, and with a full queue of the node's behind it.
	e.waitFor("the site's event to be stored", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.nodes) == 2 && g.nodes[1] == siteID
	})
	close(g.open)
	e.waitFor("everything to be stored", func() bool { return e.gw.ingest.queued() == 0 })
	var ack protocol.Ack
	site.expect(protocol.FrameAck, &ack)
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.nodes) < 3 || g.nodes[0] != nodeID || g.nodes[1] != siteID {
		t.Errorf("stored in the order %v, want %s's first event, then %s's, then the rest", g.nodes, nodeID, siteID)
	}
}

// failingNonces is a store whose first AddBootNonces waits for open and then
// fails, counting the calls and the nonces they carried.
type failingNonces struct {
	store.Store
	open   chan struct{}
	mu     sync.Mutex
	calls  int
	nonces int
}

func (f *failingNonces) AddBootNonces(c context.Context, site string, ns []store.BootNonce) ([]bool, error) {
	f.mu.Lock()
	f.calls++
	f.nonces += len(ns)
	first := f.calls == 1
	f.mu.Unlock()
	if first {
		<-f.open
		return nil, errors.New("disk I/O error")
	}
	return f.Store.AddBootNonces(c, site, ns)
}

// TestNoNonceStoredAfterAFailedBatch: a site agent's boot nonces follow the
// ingester's rules: once storing a round of them failed, the nonces read behind
// it are neither stored nor acknowledged, the node's events of that round are
// not stored either, and the session ends.
func TestNoNonceStoredAfterAFailedBatch(t *testing.T) {
	var f *failingNonces
	var log *eventLog
	e := start(t, func(s *Server) {
		st := s.Store.(store.Store)
		f = &failingNonces{Store: st, open: make(chan struct{})}
		s.Events = &machines.Events{Store: f}
		log = &eventLog{Store: s.Store}
		s.Store = log
	})
	cptest.NewMachine(t, e.st, nil)
	c, _ := welcomed(t, e, protocol.RoleSite)
	now := time.Now()
	var hashes []token.Hash
	send := func(seq uint64) {
		nonce, err := protocol.NewBootNonce()
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, sha256.Sum256([]byte(nonce)))
		c.send(protocol.FrameEvent, protocol.Event{Seq: seq, Kind: protocol.EventBootNonce, Time: now,
			Data: mustJSON(t, protocol.BootNonce{MAC: cptest.MAC, Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)})})
	}
	send(1)
	e.waitFor("the first nonce to reach the store", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.calls == 1
	})
	for seq := uint64(2); seq <= 11; seq++ {
		send(seq)
	}
	e.waitFor("the nonces behind it to be queued", func() bool { return e.gw.ingest.queued() == 10 })
	close(f.open)
	var sawError bool
	for {
		fr, err := c.recv()
		if err != nil {
			break // the session ended
		}
		switch fr.Type {
		case protocol.FrameAck:
			t.Errorf("an ack after a failed store: %s", fr.Data)
		case protocol.FrameError:
			sawError = true
		}
	}
	if !sawError {
		t.Error("the session ended without saying why")
	}
	e.waitFor("the ingester to finish", func() bool { return e.gw.ingest.queued() == 0 })
	f.mu.Lock()
	calls, nonces := f.calls, f.nonces
	f.mu.Unlock()
	if calls != 1 || nonces != 1 {
		t.Errorf("AddBootNonces called %d times with %d nonces, want once with the first", calls, nonces)
	}
	for i, h := range hashes {
		if _, err := e.st.GetBootNonce(ctx, h); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("nonce %d: %v, want none stored", i+1, err)
		}
	}
	if evs := log.stored(); len(evs) != 0 {
		t.Errorf("%d events stored, want none", len(evs))
	}
}
