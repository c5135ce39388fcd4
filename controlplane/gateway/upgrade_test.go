package gateway

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

type sections struct{ got chan string }

func (s *sections) SectionChanged(node, section string) { s.got <- node + "/" + section }

// A node's arch and its daemon target reach the store and its spec; its
// section.status reports are its latest daemon section, a replay of an
// older one changing nothing.
func TestDaemonSectionAndSectionStatus(t *testing.T) {
	obs := &sections{got: make(chan string, 8)}
	var e *env
	e = start(t, func(s *Server) {
		s.Specs = &machines.Specs{Store: s.Store.(store.Store), GatewayURL: "https://gw.test"}
		s.Sections = obs
	})
	_, res, cert := e.joined("node")
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	h := hello(res)
	h.DaemonArch = "arm64"
	c.send(protocol.FrameHello, h)
	var w protocol.Welcome
	c.expect(protocol.FrameWelcome, &w)
	if w.UpgradeRequired || len(w.Spec.Sections) != 0 {
		t.Fatalf("welcome %+v", w)
	}
	e.waitFor("the arch", func() bool { n, _ := e.st.GetNode(ctx, res.NodeID); return n.DaemonArch == "arm64" })

	sec := protocol.DaemonSection{Version: "0.1.1", URL: "https://cp.test/downloads/bcd/0.1.1/linux-arm64", SHA256: "ab", Signature: "{}"}
	n, err := e.st.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: res.NodeID, Section: &sec}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e.gw.NodeSpecChanged(res.NodeID)
	var spec protocol.Spec
	c.expect(protocol.FrameSpec, &spec)
	var got protocol.DaemonSection
	if spec.Revision != n.SpecRevision || json.Unmarshal(spec.Sections[protocol.SectionDaemon], &got) != nil || got != sec {
		t.Fatalf("spec %d %s, want revision %d with %+v", spec.Revision, spec.Sections[protocol.SectionDaemon], n.SpecRevision, sec)
	}

	report := func(seq uint64, at time.Time, state, reason string) {
		t.Helper()
		data, _ := json.Marshal(protocol.SectionStatus{Section: protocol.SectionDaemon, Revision: spec.Revision, State: state, Reason: reason,
			Message: "m " + state, Version: "0.1.1"})
		c.send(protocol.FrameEvent, protocol.Event{Seq: seq, Kind: protocol.EventSectionStatus, Time: at, Data: data})
		var ack protocol.Ack
		c.expect(protocol.FrameAck, &ack)
	}
	t0 := time.Now()
	report(1, t0, protocol.SectionRunning, "")
	report(2, t0.Add(time.Second), protocol.SectionFailed, protocol.ReasonUpdateFailed)
	report(3, t0, protocol.SectionRunning, "") // a replay of the first
	st, err := e.st.GetSectionStatus(ctx, res.NodeID, protocol.SectionDaemon)
	if err != nil || st.State != protocol.SectionFailed || st.Reason != protocol.ReasonUpdateFailed || st.Version != "0.1.1" || st.Revision != spec.Revision {
		t.Fatalf("section status %+v, %v", st, err)
	}
	for range 2 {
		select {
		case s := <-obs.got:
			if s != res.NodeID+"/daemon" {
				t.Errorf("observer told %s", s)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the observer was not told")
		}
	}
	select {
	case s := <-obs.got:
		t.Errorf("the replay was observed: %s", s)
	default:
	}
	// A malformed report is acknowledged and stored as an event only.
	c.send(protocol.FrameEvent, protocol.Event{Seq: 4, Kind: protocol.EventSectionStatus, Time: t0, Data: json.RawMessage(`{"state":"MAYBE"}`)})
	var ack protocol.Ack
	c.expect(protocol.FrameAck, &ack)
	if st2, _ := e.st.GetSectionStatus(ctx, res.NodeID, protocol.SectionDaemon); st2.State != protocol.SectionFailed {
		t.Errorf("a malformed report changed the status: %+v", st2)
	}
}

// Below the gateway's minimum protocol version the Welcome says
// upgrade_required and only daemon.upgrade is delivered.
func TestMinProtocolVersion(t *testing.T) {
	e := start(t, func(s *Server) { s.MinProtocolVersion = protocol.Version + 1 })
	_, res, cert := e.joined("node")
	reboot := e.enqueue(res.NodeID, protocol.KindNodeReboot)
	upgrade := e.enqueue(res.NodeID, protocol.KindDaemonUpgrade)
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	var w protocol.Welcome
	c.expect(protocol.FrameWelcome, &w)
	if !w.UpgradeRequired || w.MinProtocolVersion != protocol.Version+1 {
		t.Fatalf("welcome %+v", w)
	}
	var cmd protocol.Command
	c.expect(protocol.FrameCommand, &cmd)
	if cmd.ID != upgrade {
		t.Fatalf("delivered %s (%s), want only the daemon.upgrade %s", cmd.ID, cmd.Kind, upgrade)
	}
	if got, _ := e.st.GetCommand(ctx, reboot); got.State != store.CommandPending {
		t.Errorf("node.reboot was sent to an upgrade_required session: %s", got.State)
	}
}
