package gateway

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// gatedStore holds the first AddEvents until open is closed, and counts the calls.
type gatedStore struct {
	Store
	open  chan struct{}
	mu    sync.Mutex
	calls []int // events per AddEvents call
}

func (g *gatedStore) AddEvents(c context.Context, evs []store.Event) error {
	g.mu.Lock()
	first := len(g.calls) == 0
	g.calls = append(g.calls, len(evs))
	g.mu.Unlock()
	if first {
		<-g.open
	}
	return g.Store.AddEvents(c, evs)
}

func (in *ingester) queued() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.queue)
}

// TestEventsStoredInBatches: events that arrive while the store is busy are
// stored together, in order, in one transaction, and acknowledged with one ack
// for the last; a status among them keeps its place.
func TestEventsStoredInBatches(t *testing.T) {
	var g *gatedStore
	e := start(t, func(s *Server) {
		g = &gatedStore{Store: s.Store, open: make(chan struct{})}
		s.Store = g
	})
	_, res, cert := e.joined("node")
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	var w protocol.Welcome
	c.expect(protocol.FrameWelcome, &w)

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
	if len(acks) > 2 || acks[0] != 1 {
		t.Errorf("acks %v, want 1 then %d", acks, more+1)
	}
}
