package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// BenchmarkBootNonceIngest is what serve spends on one boot.nonce event of a site
// agent relaying a flood of iPXE script GETs: the frame queued on the site's
// ingester (ingest.go), stored in its round by the session (machines.Events, then
// the node's events) in a real SQLite store with 1,000 machines registered, and
// acknowledged. An op is one nonce; the frames are built before the timer starts.
func BenchmarkBootNonceIngest(b *testing.B) {
	st := cptest.NewStore(b)
	const machineCount = 1000
	macs := make([]string, machineCount)
	for i := range macs {
		macs[i] = fmt.Sprintf("52:54:00:01:%02x:%02x", i>>8, i&0xff)
		cptest.NewMachine(b, st, func(m *store.Machine) { m.MACs = []string{macs[i]} })
	}
	srv := &Server{Store: st, Events: &machines.Events{Store: st}}
	sctx, cancel := context.WithCancel(store.WithPriority(context.Background()))
	defer cancel()
	node := store.Node{ID: "node_site", Role: protocol.RoleSite, Site: cptest.Site}
	ss := &session{srv: srv, nodeID: node.ID, role: node.Role, site: node.Site, node: node, id: 1,
		log: slog.New(slog.DiscardHandler), ctx: sctx, cancel: cancel, ackKick: make(chan struct{}, 1)}

	frames := make([]protocol.Frame, b.N)
	now := time.Now()
	for i := range frames {
		nonce, err := protocol.NewBootNonce()
		if err != nil {
			b.Fatal(err)
		}
		f, err := protocol.NewFrame(protocol.FrameEvent, protocol.Event{Seq: uint64(i + 1), Kind: protocol.EventBootNonce,
			Time: now, Level: "info", Message: "boot nonce", Data: mustJSON(b, protocol.BootNonce{MAC: macs[i%machineCount],
				Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime), IP: "10.20.0.17", Interface: "eth1"})})
		if err != nil {
			b.Fatal(err)
		}
		frames[i] = f
	}
	acked := func() uint64 {
		ss.ackMu.Lock()
		defer ss.ackMu.Unlock()
		return ss.ackSeq
	}
	b.ReportAllocs()
	b.ResetTimer()
	for _, f := range frames {
		srv.ingest.put(ss, f)
	}
	for acked() < uint64(b.N) {
		select {
		case <-ss.ackKick:
		case <-time.After(10 * time.Second):
			if ss.failed.Load() {
				b.Fatal("the session failed")
			}
		}
	}
	b.StopTimer()
	srv.wg.Wait()
	if ss.failed.Load() {
		b.Fatal("the session failed")
	}
}

func mustJSON(tb testing.TB, v any) json.RawMessage {
	tb.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return data
}
