package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// eventLog is the gateway's Store with the events it stores recorded.
type eventLog struct {
	Store
	mu     sync.Mutex
	events []store.Event
}

func (l *eventLog) AddEvent(c context.Context, ev store.Event) error {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
	return l.Store.AddEvent(c, ev)
}

func (l *eventLog) AddEvents(c context.Context, evs []store.Event) error {
	l.mu.Lock()
	l.events = append(l.events, evs...)
	l.mu.Unlock()
	return l.Store.AddEvents(c, evs)
}

func (l *eventLog) stored() []store.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]store.Event(nil), l.events...)
}

// testGatewayURL is the gateway URL site specs are built with.
const testGatewayURL = "https://gw.example.test:8444"

func startWithMachines(t *testing.T) (*env, *eventLog) {
	t.Helper()
	var log *eventLog
	e := start(t, func(s *Server) {
		st := s.Store.(store.Store)
		s.Specs = &machines.Specs{Store: st, GatewayURL: testGatewayURL}
		s.Events = &machines.Events{Store: st}
		log = &eventLog{Store: s.Store}
		s.Store = log
	})
	return e, log
}

func decodeSection(t *testing.T, spec *protocol.Spec, name string, v any) {
	t.Helper()
	raw, ok := spec.Sections[name]
	if !ok {
		t.Fatalf("spec %d has no %s section", spec.Revision, name)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestSiteSpecOnWelcomeAndOnChange(t *testing.T) {
	e, _ := startWithMachines(t)
	a := cptest.NewMachine(t, e.st, func(m *store.Machine) {
		m.BMC = &store.MachineBMC{Address: "10.0.0.5", Username: "admin", Password: "pw-1", CipherSuite: 3}
	})
	if _, err := e.st.SetSiteHTTPProxy(ctx, cptest.Site, &protocol.HTTPProxySection{Listen: "10.20.0.2:3128"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	_, res, cert := e.joined(protocol.RoleSite)
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	var w protocol.Welcome
	c.expect(protocol.FrameWelcome, &w)
	if w.Spec == nil || w.Spec.Revision < 2 {
		t.Fatalf("welcome spec %+v", w.Spec)
	}
	var boot protocol.BootSection
	decodeSection(t, w.Spec, protocol.SectionBoot, &boot)
	if len(boot.Entries) != 1 || boot.Entries[0].MAC != cptest.MAC || boot.Entries[0].Mode != protocol.BootRamdisk {
		t.Errorf("boot %+v", boot)
	}
	var bmcs protocol.BMCHostsSection
	decodeSection(t, w.Spec, protocol.SectionBMCHosts, &bmcs)
	if len(bmcs.Hosts) != 1 || bmcs.Hosts[0].Password != "pw-1" || bmcs.Hosts[0].Machine != a.ID {
		t.Errorf("bmc_hosts %+v", bmcs)
	}
	var proxy protocol.HTTPProxySection
	decodeSection(t, w.Spec, protocol.SectionHTTPProxy, &proxy)
	if gw := strings.TrimPrefix(testGatewayURL, "https://"); proxy.Listen != "10.20.0.2:3128" || len(proxy.Allow) != 1 || proxy.Allow[0] != gw {
		t.Errorf("http_proxy %+v, want the gateway %s allowed", proxy, gw)
	}

	// A node of role node of the same site: its own revision, no sections,
	// and no pushes.
	_, nres, ncert := e.joined(protocol.RoleNode)
	nc, _, _ := e.dial(&ncert)
	nc.send(protocol.FrameHello, hello(nres))
	var nw protocol.Welcome
	nc.expect(protocol.FrameWelcome, &nw)
	if nw.Spec == nil || len(nw.Spec.Sections) != 0 {
		t.Errorf("a node's welcome spec %+v", nw.Spec)
	}

	// A change pushes a new spec with a higher revision.
	b := cptest.NewMachine(t, e.st, func(m *store.Machine) { m.MACs = []string{"52:54:00:00:00:02"}; m.BootOverride = protocol.BootLocal })
	e.gw.SpecChanged(cptest.Site)
	var spec protocol.Spec
	c.expect(protocol.FrameSpec, &spec)
	if spec.Revision <= w.Spec.Revision {
		t.Errorf("pushed revision %d, welcome had %d", spec.Revision, w.Spec.Revision)
	}
	decodeSection(t, &spec, protocol.SectionBoot, &boot)
	if len(boot.Entries) != 2 || boot.Entries[1].MAC != b.MACs[0] || boot.Entries[1].Mode != protocol.BootLocal {
		t.Errorf("pushed boot %+v", boot)
	}
	// Nothing changed: nothing is sent (the next frame is the event's ack).
	e.gw.SpecChanged(cptest.Site)
	e.gw.SpecChanged("ams1")
	c.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog})
	c.expect(protocol.FrameAck, nil)
	nc.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog})
	nc.expect(protocol.FrameAck, nil)

	// A deleted machine leaves both tables.
	if err := e.st.DeleteMachine(ctx, a.ID, false); err != nil {
		t.Fatal(err)
	}
	e.gw.SpecChanged(cptest.Site)
	c.expect(protocol.FrameSpec, &spec)
	decodeSection(t, &spec, protocol.SectionBMCHosts, &bmcs)
	decodeSection(t, &spec, protocol.SectionBoot, &boot)
	if len(bmcs.Hosts) != 0 || len(boot.Entries) != 1 {
		t.Errorf("after delete: bmc %+v boot %+v", bmcs, boot)
	}
}

func TestSiteEvents(t *testing.T) {
	e, log := startWithMachines(t)
	m := cptest.NewMachine(t, e.st, nil)
	_, res, cert := e.joined(protocol.RoleSite)
	c, _, _ := e.dial(&cert)
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)

	now := time.Now().UTC().Truncate(time.Millisecond)
	data, _ := json.Marshal(protocol.MachineBooted{MAC: cptest.MAC, Stage: protocol.StageScript, IP: "10.20.0.50", File: "/ipxe/52-54-00-12-34-56.ipxe", Time: now})
	c.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventMachineBooted, Time: now, Data: data})
	c.expect(protocol.FrameAck, nil)
	got, _ := e.st.GetMachine(ctx, m.ID)
	if got.LastBootStage != protocol.StageScript || !got.LastBootAt.Equal(now) {
		t.Errorf("machine's last boot %q at %v", got.LastBootStage, got.LastBootAt)
	}

	nonce := "Zm9vYmFyYmF6cXV4cXV1eA"
	data, _ = json.Marshal(protocol.BootNonce{MAC: cptest.MAC, Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)})
	c.send(protocol.FrameEvent, protocol.Event{Seq: 2, Kind: protocol.EventBootNonce, Time: now, Message: "boot nonce " + nonce, Data: data})
	c.expect(protocol.FrameAck, nil)
	sum := sha256.Sum256([]byte(nonce))
	n, err := e.st.GetBootNonce(ctx, sum)
	if err != nil || n.MachineID != m.ID || n.SiteNode != res.NodeID || n.Site != cptest.Site {
		t.Errorf("nonce %+v %v", n, err)
	}
	// Both events are stored, the nonce's without the nonce.
	evs := log.stored()
	if len(evs) != 2 {
		t.Fatalf("%d events stored, want 2", len(evs))
	}
	if s := string(evs[1].Data) + evs[1].Message; strings.Contains(s, nonce) || !strings.Contains(s, hex.EncodeToString(sum[:])) {
		t.Errorf("stored boot.nonce event %q %s", evs[1].Message, evs[1].Data)
	}
	timeline, _ := e.st.MachineEvents(ctx, m.ID, 0)
	var kinds []string
	for _, ev := range timeline {
		kinds = append(kinds, ev.Kind)
	}
	if strings.Join(kinds, ",") != "machine.added,machine.booted,boot.nonce" {
		t.Errorf("timeline %v", kinds)
	}
}
