package agent_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/protocol"
)

type sessionFixture struct {
	g *agenttest.Gateway
	s *agent.Session
	j *journal.Journal
}

func newSession(t *testing.T, g *agenttest.Gateway) *sessionFixture {
	t.Helper()
	dir := t.TempDir()
	id := g.Identity(t, dir, protocol.RoleNode, "node_a")
	j, err := journal.Open(filepath.Join(dir, journal.FileName), id.NodeID, journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	s := &agent.Session{
		GatewayURL:   g.URL,
		ServerName:   "127.0.0.1",
		ServingCAPin: g.Pins.ServingCA,
		Identity:     id,
		Journal:      j,
		Handlers:     map[string]agent.Handler{},
		Claims:       &protocol.Claims{Hostname: "testhost"},
		BootID:       "boot-1",
		Backoff:      agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}
	return &sessionFixture{g: g, s: s, j: j}
}

// run starts the session and stops it when the test ends.
func (f *sessionFixture) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
}

func readStatus(t *testing.T, ctx context.Context, c *agenttest.Conn) (protocol.Status, bool) {
	f, err := c.Read(ctx)
	if err != nil {
		return protocol.Status{}, false
	}
	if f.Type != protocol.FrameStatus {
		t.Errorf("frame %q, want status", f.Type)
		return protocol.Status{}, false
	}
	var st protocol.Status
	if err := f.Decode(&st); err != nil {
		t.Error(err)
		return st, false
	}
	return st, true
}

func TestSessionHelloAndUnsupported(t *testing.T) {
	g := agenttest.New(t)
	got := make(chan []protocol.Status, 1)
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_1", Kind: protocol.KindBMCPower})
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_2", Kind: "node.frobnicate"})
		var sts []protocol.Status
		for len(sts) < 2 {
			st, ok := readStatus(t, ctx, c)
			if !ok {
				return
			}
			sts = append(sts, st)
		}
		got <- sts
		agenttest.AckAll(ctx, c, nil)
	}
	f := newSession(t, g)
	f.run(t)
	var sts []protocol.Status
	select {
	case sts = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("no statuses")
	}
	for i, st := range sts {
		if st.State != protocol.StateUnsupported || st.CommandID != []string{"cmd_1", "cmd_2"}[i] || st.Reason != agent.ReasonUnsupported {
			t.Errorf("status %d = %+v, want UNSUPPORTED", i, st)
		}
		if st.Seq == 0 || st.Time.IsZero() {
			t.Errorf("status %d has no seq or time: %+v", i, st)
		}
	}
	h := g.Hellos()[0]
	if h.ProtocolVersion != protocol.Version || h.NodeID != "node_a" || h.Role != protocol.RoleNode ||
		h.DaemonVersion != version.Version || h.BootID != "boot-1" || h.Claims == nil || h.Claims.Hostname != "testhost" {
		t.Errorf("hello = %+v", h)
	}
	waitFor(t, func() bool { return f.s.State().Connected && f.s.State().NodeState == protocol.NodeReady })
}

func TestSessionReplaysUntilAcked(t *testing.T) {
	g := agenttest.New(t)
	type seen struct {
		session int
		sts     []protocol.Status
	}
	results := make(chan seen, 10)
	var mu sync.Mutex
	n := 0
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		mu.Lock()
		n++
		this := n
		mu.Unlock()
		switch this {
		case 1:
			// Run a command, read both statuses, acknowledge neither, hang up.
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_1", Kind: protocol.KindNodeReboot})
			var sts []protocol.Status
			for len(sts) < 2 {
				st, ok := readStatus(t, ctx, c)
				if !ok {
					return
				}
				sts = append(sts, st)
			}
			results <- seen{this, sts}
			c.Close()
		case 2:
			// The replay: both again, same seqs. Acknowledge the first only.
			var sts []protocol.Status
			for len(sts) < 2 {
				st, ok := readStatus(t, ctx, c)
				if !ok {
					return
				}
				sts = append(sts, st)
			}
			c.Send(ctx, protocol.FrameAck, protocol.Ack{Seq: sts[0].Seq})
			results <- seen{this, sts}
			// Give the ack time to land, then go away.
			time.Sleep(100 * time.Millisecond)
			c.Close()
		case 3:
			st, ok := readStatus(t, ctx, c)
			if !ok {
				return
			}
			c.Send(ctx, protocol.FrameAck, protocol.Ack{Seq: st.Seq})
			results <- seen{this, []protocol.Status{st}}
			agenttest.AckAll(ctx, c, nil)
		}
	}
	f := newSession(t, g)
	f.s.Handlers[protocol.KindNodeReboot] = func(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error {
		if err := report(protocol.Status{State: protocol.StateRunning}); err != nil {
			return err
		}
		return report(protocol.Status{State: protocol.StateSucceeded})
	}
	f.run(t)
	var all []seen
	for len(all) < 3 {
		select {
		case r := <-results:
			all = append(all, r)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d sessions' statuses, want 3", len(all))
		}
	}
	first, second, third := all[0].sts, all[1].sts, all[2].sts
	if first[0].State != protocol.StateRunning || first[1].State != protocol.StateSucceeded {
		t.Errorf("first session: %+v", first)
	}
	for i := range first {
		if second[i].Seq != first[i].Seq || second[i].State != first[i].State || second[i].CommandID != "cmd_1" {
			t.Errorf("replay %d = %+v, want %+v", i, second[i], first[i])
		}
	}
	if len(third) != 1 || third[0].Seq != first[1].Seq {
		t.Errorf("third session replayed %+v, want only the unacknowledged SUCCEEDED", third)
	}
	waitFor(t, func() bool { return f.j.Len() == 0 })
	if g.Sessions() < 3 {
		t.Errorf("%d sessions, want 3 (reconnect after each close)", g.Sessions())
	}
}

// TestSessionAnswersARepeatedFinishedCommand: a gateway that restarted before it
// stored a command's end sends the command again; the agent answers with the
// status it journaled and does not run the command a second time.
func TestSessionAnswersARepeatedFinishedCommand(t *testing.T) {
	g := agenttest.New(t)
	got := make(chan protocol.Status, 4)
	var mu sync.Mutex
	n := 0
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		mu.Lock()
		n++
		this := n
		mu.Unlock()
		switch this {
		case 1:
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_1", Kind: protocol.KindNodeReboot})
			if st, ok := readStatus(t, ctx, c); ok {
				got <- st
				c.Send(ctx, protocol.FrameAck, protocol.Ack{Seq: st.Seq})
			}
			time.Sleep(50 * time.Millisecond)
			c.Close()
		case 2:
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_1", Kind: protocol.KindNodeReboot})
			if st, ok := readStatus(t, ctx, c); ok {
				got <- st
			}
			agenttest.AckAll(ctx, c, nil)
		}
	}
	f := newSession(t, g)
	var count int
	f.s.Handlers[protocol.KindNodeReboot] = func(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error {
		mu.Lock()
		count++
		mu.Unlock()
		return report(protocol.Status{State: protocol.StateSucceeded, Message: "rebooted once"})
	}
	f.run(t)
	var sts []protocol.Status
	for len(sts) < 2 {
		select {
		case st := <-got:
			sts = append(sts, st)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d statuses, want 2", len(sts))
		}
	}
	for i, st := range sts {
		if st.CommandID != "cmd_1" || st.State != protocol.StateSucceeded || st.Message != "rebooted once" {
			t.Errorf("status %d = %+v, want cmd_1 SUCCEEDED", i, st)
		}
	}
	if sts[1].Seq == sts[0].Seq {
		t.Errorf("the answer to the repeat reuses seq %d; want a new journal entry", sts[1].Seq)
	}
	mu.Lock()
	defer mu.Unlock()
	if count != 1 {
		t.Errorf("the handler ran %d times, want once", count)
	}
}

func TestSessionHandlerErrorIsFailed(t *testing.T) {
	g := agenttest.New(t)
	got := make(chan protocol.Status, 1)
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_1", Kind: protocol.KindNodeReboot})
		if st, ok := readStatus(t, ctx, c); ok {
			got <- st
		}
		agenttest.AckAll(ctx, c, nil)
	}
	f := newSession(t, g)
	f.s.Handlers[protocol.KindNodeReboot] = func(context.Context, protocol.Command, func(protocol.Status) error) error {
		return errors.New("no reboot today")
	}
	f.run(t)
	select {
	case st := <-got:
		if st.State != protocol.StateFailed || st.Message != "no reboot today" {
			t.Errorf("status = %+v", st)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no status")
	}
}

func TestSessionReconnectsWhenPingsGoUnanswered(t *testing.T) {
	g := agenttest.New(t)
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		// Read nothing: coder/websocket answers pings only while reading, so
		// the agent's heartbeat times out.
		<-ctx.Done()
	}
	f := newSession(t, g)
	f.s.PingInterval = 20 * time.Millisecond
	f.s.PingTimeout = 50 * time.Millisecond
	f.run(t)
	waitFor(t, func() bool { return g.Sessions() >= 2 })
}

func TestSessionEventJournaledAndAcked(t *testing.T) {
	g := agenttest.New(t)
	events := make(chan protocol.Frame, 1)
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		agenttest.AckAll(ctx, c, func(f protocol.Frame) {
			if f.Type == protocol.FrameEvent {
				events <- f
			}
		})
	}
	f := newSession(t, g)
	// Journaled before any connection: replayed after the first Welcome.
	if err := f.s.Event(protocol.Event{Kind: protocol.EventLog, Message: "before the session"}); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	select {
	case fr := <-events:
		var ev protocol.Event
		fr.Decode(&ev)
		if ev.Message != "before the session" || ev.Seq != 1 {
			t.Errorf("event = %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}
	waitFor(t, func() bool { return f.j.Len() == 0 })
}

// TestSessionFailedSendIsNotOvertaken: an event whose send failed while the
// connection stayed up must still reach the gateway. The events after it went
// out and were acknowledged, and an Ack covers every entry up to its seq, so a
// session that carried on over the same connection lost the failed one from its
// journal without it ever being sent (a site agent's boot.nonce, and that
// machine's ramdisk could not join).
func TestSessionFailedSendIsNotOvertaken(t *testing.T) {
	g := agenttest.New(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		agenttest.AckAll(ctx, c, func(f protocol.Frame) {
			var ev protocol.Event
			if f.Type == protocol.FrameEvent && f.Decode(&ev) == nil {
				mu.Lock()
				seen[ev.Message] = true
				mu.Unlock()
			}
		})
	}
	f := newSession(t, g)
	f.run(t)
	waitFor(t, func() bool { return f.s.State().Connected })
	var failed sync.Once
	f.s.SetFailSend(func() bool {
		fail := false
		failed.Do(func() { fail = true })
		return fail
	})
	for _, m := range []string{"nonce", "after 1", "after 2"} {
		if err := f.s.Event(protocol.Event{Kind: protocol.EventLog, Message: m}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen["after 2"] && f.j.Len() == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if !seen["nonce"] {
		t.Fatalf("the event whose send failed never reached the gateway; it saw %v and the journal is empty", seen)
	}
}

func TestSessionRefusesUnpinnedGateway(t *testing.T) {
	g := agenttest.New(t)
	other := agenttest.New(t)
	f := newSession(t, g)
	f.s.ServingCAPin = other.Pins.ServingCA
	f.run(t)
	waitFor(t, func() bool { return strings.Contains(f.s.State().LastError, "serving_ca_spki_pin") })
	if g.Sessions() != 0 {
		t.Error("a session reached a gateway that fails the pin")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSessionEventsBatchAndAcks: a batch of events reaches the gateway in order
// and, acknowledged one by one, leaves the journal empty.
func TestSessionEventsBatchAndAcks(t *testing.T) {
	g := agenttest.New(t)
	var mu sync.Mutex
	var seqs []uint64
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		agenttest.AckAll(ctx, c, func(f protocol.Frame) {
			if f.Type == protocol.FrameEvent {
				mu.Lock()
				seqs = append(seqs, agenttest.Seq(f))
				mu.Unlock()
			}
		})
	}
	f := newSession(t, g)
	f.run(t)
	waitFor(t, func() bool { return f.s.State().Connected })
	const batches, per = 20, 25
	for b := range batches {
		evs := make([]protocol.Event, per)
		for i := range evs {
			evs[i] = protocol.Event{Kind: protocol.EventLog, Message: fmt.Sprintf("event %d.%d", b, i)}
		}
		if err := f.s.Events(evs); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seqs) == batches*per && f.j.Len() == 0
	})
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("event %d arrived with seq %d: out of order", i, s)
		}
	}
}
