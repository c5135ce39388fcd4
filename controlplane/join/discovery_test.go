package join

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

func discoveryFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFixture(t)
	f.svc.Attestors[protocol.AttestorDiscovery] = NewDiscoveryAttestor(f.st, TPMOptions{Bundle: f.b})
	return f
}

func TestDiscoveryJoin(t *testing.T) {
	f := discoveryFixture(t)
	m := cptest.NewMachine(t, f.st, func(m *store.Machine) { m.MACs = []string{cptest.MAC, "52:54:00:00:00:02"} })
	// The installed OS's node holds the machine's system UUID: the ramdisk,
	// which claims the same, must still join, as a node of its own.
	os := store.Node{ID: "n_installed", Role: "node", Site: cptest.Site, Pool: "p", SPIFFEID: "spiffe://x/node/n_installed",
		SystemUUID: "4c4c4544-0000-1010-8000-b2c04f000001", CertSerial: "1", CertNotAfter: time.Now().Add(time.Hour), State: "ready"}
	if err := f.st.Admit(ctx, store.Admission{Node: os, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for boot := 0; boot < 2; boot++ {
		nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, 10*time.Minute)
		a := cptest.NewAgent(t)
		// The claims may spell the MAC in another case or form.
		req := a.DiscoveryRequest(nonce, "52-54-00-00-00-09", strings.ToUpper(cptest.MAC))
		req.Site = cptest.Site // as bcd ramdisk sends bcd.site
		resp, err := f.svc.Join(ctx, req)
		if err != nil {
			t.Fatalf("boot %d: %v", boot, err)
		}
		res := a.Verify(t, f.b, resp)
		if res.Role != protocol.RoleRamdisk || res.Site != cptest.Site || res.Pool != "" {
			t.Errorf("result %+v", res)
		}
		ids = append(ids, res.NodeID)
		got, _ := f.st.GetMachine(ctx, m.ID)
		if got.BoundRamdisk != res.NodeID || !strings.Contains(string(got.Inventory), `"cpus":8`) || got.InventoryAt.IsZero() {
			t.Errorf("boot %d: machine %+v", boot, got)
		}
		n, _ := f.st.GetNode(ctx, res.NodeID)
		if n.SystemUUID != "" || n.Role != protocol.RoleRamdisk {
			t.Errorf("ramdisk node %+v: its hardware must not be matched for reclaims", n)
		}
	}
	if ids[0] == ids[1] {
		t.Error("two boots joined as the same node")
	}
	// The first boot's ramdisk node is retired by the second.
	if n, _ := f.st.GetNode(ctx, ids[0]); !n.Deleted() {
		t.Error("the previous ramdisk node was not retired")
	}
	evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
	joins := 0
	for _, e := range evs {
		if e.Kind == protocol.MachineEventJoin {
			joins++
		}
	}
	if joins != 2 {
		t.Errorf("%d join events on the timeline, want 2: %+v", joins, evs)
	}
}

func TestDiscoveryRefusals(t *testing.T) {
	f := discoveryFixture(t)
	cptest.NewMachine(t, f.st, nil)
	a := cptest.NewAgent(t)

	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(strings.Repeat("z", 40), cptest.MAC)); code(err) != protocol.CodeNonceUnknown {
		t.Errorf("unknown nonce: %v", err)
	} else if !httpjson.Response(err).Retryable {
		t.Error("NONCE_UNKNOWN is not retryable")
	}

	expired := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, -time.Second)
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(expired, cptest.MAC)); code(err) != protocol.CodeNonceExpired {
		t.Errorf("expired nonce: %v", err)
	}

	nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute)
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, "52:54:00:99:99:99")); code(err) != protocol.CodeNonceWrongMAC {
		t.Errorf("nonce for another MAC: %v", err)
	}
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce)); code(err) != protocol.CodeNonceWrongMAC {
		t.Errorf("no MACs in the claims: %v", err)
	}

	wrongSite := a.DiscoveryRequest(nonce, cptest.MAC)
	wrongSite.Site = "ams9"
	if _, err := f.svc.Join(ctx, wrongSite); code(err) != protocol.CodeWrongSite {
		t.Errorf("join naming another site: %v", err)
	}

	unregistered := cptest.NewNonce(t, f.st, cptest.Site, "52:54:00:77:77:77", time.Minute)
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(unregistered, "52:54:00:77:77:77")); code(err) != protocol.CodeMachineNotRegistered {
		t.Errorf("MAC of no machine: %v", err)
	}
	// A machine of another site is not the nonce's site's machine.
	if err := f.st.CreateSite(ctx, store.Site{Name: "ams1", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	cptest.NewMachine(t, f.st, func(m *store.Machine) { m.Site = "ams1"; m.MACs = []string{"52:54:00:66:66:66"} })
	other := cptest.NewNonce(t, f.st, cptest.Site, "52:54:00:66:66:66", time.Minute)
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(other, "52:54:00:66:66:66")); code(err) != protocol.CodeMachineNotRegistered {
		t.Errorf("machine of another site: %v", err)
	}

	for name, mut := range map[string]func(*protocol.JoinRequest){
		"role node":   func(r *protocol.JoinRequest) { r.Role = protocol.RoleNode },
		"no nonce":    func(r *protocol.JoinRequest) { r.BootNonce = "" },
		"bad nonce":   func(r *protocol.JoinRequest) { r.BootNonce = "has a space in it, quite long" },
		"with a node": func(r *protocol.JoinRequest) { r.NodeID = "n_x" },
	} {
		req := a.DiscoveryRequest(nonce, cptest.MAC)
		mut(req)
		_, err := f.svc.Join(ctx, req)
		want := protocol.CodeInvalidInput
		if name == "role node" {
			want = protocol.CodeWrongRole
		}
		if code(err) != want {
			t.Errorf("%s: %v, want %s", name, err, want)
		}
		if err != nil && strings.Contains(err.Error(), nonce) {
			t.Errorf("%s: the refusal quotes the nonce", name)
		}
	}

	// The nonce still works after all that, once; a replay is refused.
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, cptest.MAC)); err != nil {
		t.Fatalf("good join: %v", err)
	}
	b := cptest.NewAgent(t)
	if _, err := f.svc.Join(ctx, b.DiscoveryRequest(nonce, cptest.MAC)); code(err) != protocol.CodeNonceUsed {
		t.Errorf("replay with another key: %v", err)
	}
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, cptest.MAC)); code(err) != protocol.CodeNonceUsed {
		t.Errorf("replay of the same request: %v", err)
	}
}

func TestDiscoveryNonceSingleUseUnderConcurrency(t *testing.T) {
	f := discoveryFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute)
	const n = 8
	agents := make([]*cptest.Agent, n)
	for i := range agents {
		agents[i] = cptest.NewAgent(t)
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = f.svc.Join(ctx, agents[i].DiscoveryRequest(nonce, cptest.MAC))
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case code(err) != protocol.CodeNonceUsed:
			t.Errorf("join %d: %v, want success or NONCE_USED", i, err)
		}
	}
	if won != 1 {
		t.Fatalf("%d joins won, want exactly 1", won)
	}
	got, _ := f.st.GetMachine(ctx, m.ID)
	all, _ := f.st.ListNodes(ctx)
	var nodes []store.Node
	for _, n := range all {
		if n.Role == protocol.RoleRamdisk {
			nodes = append(nodes, n)
		}
	}
	if len(nodes) != 1 || got.BoundRamdisk != nodes[0].ID {
		t.Errorf("nodes %d, machine's bound ramdisk %s", len(nodes), got.BoundRamdisk)
	}
}

func TestDiscoveryManualApproval(t *testing.T) {
	f := discoveryFixture(t)
	if err := f.st.CreateSite(ctx, store.Site{Name: "man1", Approval: store.ApprovalManual, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	m := cptest.NewMachine(t, f.st, func(m *store.Machine) { m.Site = "man1" })
	nonce := cptest.NewNonce(t, f.st, "man1", cptest.MAC, time.Minute)

	a := cptest.NewAgent(t)
	for i := 0; i < 2; i++ {
		resp, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, cptest.MAC))
		if err != nil || resp.Signed != "" || resp.RetryAfterS != 5 {
			t.Fatalf("try %d before approval: %+v %v, want a 5 s deferral", i, resp, err)
		}
	}
	// Another key cannot take the nonce the waiting ramdisk presented.
	if _, err := f.svc.Join(ctx, cptest.NewAgent(t).DiscoveryRequest(nonce, cptest.MAC)); code(err) != protocol.CodeNonceUsed {
		t.Errorf("another key with the waiting nonce: %v", err)
	}
	evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
	deferred := 0
	for _, e := range evs {
		if e.Kind == protocol.MachineEventJoinDeferred {
			deferred++
		}
	}
	if deferred != 1 {
		t.Errorf("%d join.deferred events, want 1 however often the ramdisk retries", deferred)
	}
	if _, err := f.st.UpdateMachine(ctx, m.ID, store.MachineUpdate{Approve: true, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// Approval may come after the nonce's lifetime: the waiting CSR still
	// gets in.
	f.svc.Now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	resp, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, cptest.MAC))
	if err != nil || resp.Signed == "" {
		t.Fatalf("after approval: %+v %v", resp, err)
	}
	res := a.Verify(t, f.b, resp)
	if res.Site != "man1" {
		t.Errorf("site %s", res.Site)
	}
	if got, _ := f.st.GetMachine(ctx, m.ID); got.BoundRamdisk != res.NodeID {
		t.Errorf("machine's bound ramdisk %s, want %s", got.BoundRamdisk, res.NodeID)
	}
}

func TestProvisionedBindsTheMachine(t *testing.T) {
	f := discoveryFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute)
	rd := cptest.NewAgent(t)
	resp, err := f.svc.Join(ctx, rd.DiscoveryRequest(nonce, cptest.MAC))
	if err != nil {
		t.Fatal(err)
	}
	ramdisk := rd.Verify(t, f.b, resp).NodeID
	_, secret := cptest.NewToken(t, f.st, func(tk *store.Token) { tk.NodeID = "n_installed"; tk.MachineID = m.ID })
	a := cptest.NewAgent(t)
	resp, err = f.svc.Join(ctx, a.Request(t, f.b, "node", secret, func(r *protocol.JoinRequest) {
		r.Attestor = protocol.AttestorProvisioned
		r.NodeID = "n_installed"
	}))
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Verify(t, f.b, resp); res.NodeID != "n_installed" {
		t.Errorf("node %s", res.NodeID)
	}
	got, _ := f.st.GetMachine(ctx, m.ID)
	// The join records the binding; the lifecycle adopts it into the status.
	if got.BoundNode != "n_installed" || got.BoundRamdisk != "" || got.Node != "" || !got.PendingBindings() {
		t.Errorf("machine bound node %q bound ramdisk %q node %q", got.BoundNode, got.BoundRamdisk, got.Node)
	}
	if n, _ := f.st.GetNode(ctx, ramdisk); !n.Deleted() {
		t.Error("the ramdisk node outlived the installed OS's join")
	}
	// A deploy's token whose machine was deleted meanwhile still joins.
	if err := f.st.DeleteMachine(ctx, m.ID, false); err != nil {
		t.Fatal(err)
	}
	_, secret = cptest.NewToken(t, f.st, func(tk *store.Token) { tk.NodeID = "n_orphan"; tk.MachineID = m.ID })
	b := cptest.NewAgent(t)
	if _, err := f.svc.Join(ctx, b.Request(t, f.b, "node", secret, func(r *protocol.JoinRequest) {
		r.Attestor = protocol.AttestorProvisioned
		r.NodeID = "n_orphan"
		r.Claims.SystemUUID = ""
	})); err != nil {
		t.Errorf("join of a deleted machine's OS: %v", err)
	}
}

// TestDiscoveryWitness: a join whose nonce the minting site agent did not
// countersign for this key and this MAC is refused with NONCE_NOT_WITNESSED,
// on the machine's timeline, and the nonce stays usable by the witnessed join.
func TestDiscoveryWitness(t *testing.T) {
	f := discoveryFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	nonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute)
	a := cptest.NewAgent(t)
	csr := pki.CSRSHA256(a.CSRDER)
	other := cptest.NewAgent(t)
	otherNonce := cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute)
	forged, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		w    func() *protocol.BootWitness
		want string
	}{
		{"none", func() *protocol.BootWitness { return nil }, "carries no witness"},
		{"another key's", func() *protocol.BootWitness { return cptest.Witness(nonce, pki.CSRSHA256(other.CSRDER), nil) }, "another key"},
		{"another nonce's", func() *protocol.BootWitness { return cptest.Witness(otherNonce, csr, nil) }, "another boot nonce"},
		{"another MAC seen", func() *protocol.BootWitness {
			return cptest.Witness(nonce, csr, func(p *protocol.WitnessPayload) { p.MAC = "52:54:00:de:ad:01" })
		}, "the site saw the caller as"},
		{"another site node", func() *protocol.BootWitness {
			return cptest.Witness(nonce, csr, func(p *protocol.WitnessPayload) { p.NodeID = "n_other" })
		}, "signed by node"},
		{"stale", func() *protocol.BootWitness {
			return cptest.Witness(nonce, csr, func(p *protocol.WitnessPayload) { p.Time = time.Now().Add(-time.Hour) })
		}, "more than"},
		{"tampered payload", func() *protocol.BootWitness {
			w := cptest.Witness(nonce, csr, nil)
			w.Payload = []byte(strings.Replace(string(w.Payload), "10.20.0.50", "10.20.0.66", 1))
			return w
		}, "does not verify"},
		{"a key not the site's", func() *protocol.BootWitness {
			w := cptest.Witness(nonce, csr, nil)
			digest := sha256.Sum256(w.Payload)
			w.Signature, _ = ecdsa.SignASN1(rand.Reader, forged, digest[:])
			w.PublicKey, _ = x509.MarshalPKIXPublicKey(forged.Public())
			return w
		}, "not signed with the current certificate key"},
	} {
		req := a.DiscoveryRequest(nonce, cptest.MAC)
		req.Witness = tc.w()
		_, err := f.svc.Join(ctx, req)
		if code(err) != protocol.CodeNonceNotWitnessed || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %s (%q)", tc.name, err, protocol.CodeNonceNotWitnessed, tc.want)
		}
	}
	evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
	refusals := 0
	for _, e := range evs {
		if e.Kind == protocol.MachineEventJoinRefused && strings.Contains(string(e.Data), protocol.CodeNonceNotWitnessed) {
			refusals++
		}
	}
	if refusals != 8 {
		t.Errorf("%d %s refusals on the timeline, want 8", refusals, protocol.CodeNonceNotWitnessed)
	}
	if _, err := f.svc.Join(ctx, a.DiscoveryRequest(nonce, cptest.MAC)); err != nil {
		t.Fatalf("the witnessed join: %v", err)
	}
}

// TestDiscoverySecondRamdiskRefused: while the machine's ramdisk has a session,
// another ramdisk's join, witnessed or not, is refused MACHINE_HAS_RAMDISK
// (retryable) and the machine's timeline says someone claims it; once the
// session ends, a new boot's ramdisk joins.
func TestDiscoverySecondRamdiskRefused(t *testing.T) {
	f := discoveryFixture(t)
	m := cptest.NewMachine(t, f.st, nil)
	_, err := f.svc.Join(ctx, cptest.NewAgent(t).DiscoveryRequest(cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute), cptest.MAC))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := f.st.GetMachine(ctx, m.ID)
	sid, err := f.st.OpenSession(ctx, store.Session{NodeID: got.BoundRamdisk, Role: protocol.RoleRamdisk, ProtocolVersion: protocol.Version, ConnectedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	second := cptest.NewAgent(t).DiscoveryRequest(cptest.NewNonce(t, f.st, cptest.Site, cptest.MAC, time.Minute), cptest.MAC)
	_, err = f.svc.Join(ctx, second)
	if code(err) != protocol.CodeMachineHasRamdisk || !httpjson.Response(err).Retryable {
		t.Fatalf("a second ramdisk: %v, want retryable %s", err, protocol.CodeMachineHasRamdisk)
	}
	evs, _ := f.st.MachineEvents(ctx, m.ID, 0)
	spoofed := 0
	for _, e := range evs {
		if e.Kind == protocol.MachineEventSpoofed {
			spoofed++
		}
	}
	if spoofed != 1 {
		t.Errorf("%d %s events, want 1", spoofed, protocol.MachineEventSpoofed)
	}
	if err := f.st.CloseSession(ctx, sid, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.Join(ctx, second); err != nil {
		t.Fatalf("after the first ramdisk's session ended: %v", err)
	}
}
