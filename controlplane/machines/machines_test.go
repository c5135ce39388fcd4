package machines

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

func TestSpecs(t *testing.T) {
	st := cptest.NewStore(t)
	specs := &Specs{Store: st, GatewayURL: "https://gw.example.test"}
	site := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}

	empty, err := specs.Spec(ctx, site)
	if err != nil {
		t.Fatal(err)
	}
	if empty.Revision != 1 || string(empty.Sections[protocol.SectionBoot]) != `{"entries":[]}` ||
		string(empty.Sections[protocol.SectionBMCHosts]) != `{"hosts":[]}` || empty.Sections[protocol.SectionHTTPProxy] != nil {
		t.Errorf("empty site's spec: revision %d, %s", empty.Revision, sections(empty))
	}

	a := cptest.NewMachine(t, st, func(m *store.Machine) {
		m.MACs = []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}
		m.BMC = &store.MachineBMC{Address: "10.0.0.5", Port: 6230, Username: "admin", Password: "pw", CipherSuite: 3}
	})
	cptest.NewMachine(t, st, func(m *store.Machine) { m.MACs = []string{"52:54:00:00:00:03"}; m.BootOverride = "" })
	st.SetSiteHTTPProxy(ctx, cptest.Site, &protocol.HTTPProxySection{Listen: "10.20.0.2:3128", Allow: []string{"images.example.test:443"}}, time.Now())

	spec, err := specs.Spec(ctx, site)
	if err != nil {
		t.Fatal(err)
	}
	if spec.Revision != 4 {
		t.Errorf("revision %d after two machines and a proxy, want 4", spec.Revision)
	}
	var boot protocol.BootSection
	json.Unmarshal(spec.Sections[protocol.SectionBoot], &boot)
	if len(boot.Entries) != 2 || boot.Entries[0] != (protocol.BootEntry{MAC: "52:54:00:00:00:01", Mode: protocol.BootRamdisk}) ||
		boot.Entries[1].MAC != "52:54:00:00:00:02" {
		t.Errorf("boot %+v (one entry per MAC of the machine with a boot mode)", boot)
	}
	var bmcs protocol.BMCHostsSection
	json.Unmarshal(spec.Sections[protocol.SectionBMCHosts], &bmcs)
	want := protocol.BMCHost{Machine: a.ID, Address: "10.0.0.5", Port: 6230, Username: "admin", Password: "pw", CipherSuite: 3}
	if len(bmcs.Hosts) != 1 || bmcs.Hosts[0] != want || bmcs.Validate() != nil {
		t.Errorf("bmc_hosts %+v", bmcs)
	}
	var proxy protocol.HTTPProxySection
	json.Unmarshal(spec.Sections[protocol.SectionHTTPProxy], &proxy)
	if proxy.Listen != "10.20.0.2:3128" || strings.Join(proxy.Allow, ",") != "images.example.test:443,gw.example.test:443" {
		t.Errorf("http_proxy %+v", proxy)
	}

	// Other sites' machines and other roles get nothing of this.
	node, _ := specs.Spec(ctx, store.Node{ID: "n_a", Role: protocol.RoleNode, Site: cptest.Site, SpecRevision: 7})
	if node.Revision != 7 || len(node.Sections) != 0 {
		t.Errorf("node's spec %+v", node)
	}
	st.CreateSite(ctx, store.Site{Name: "ams1", CreatedAt: time.Now()})
	other, _ := specs.Spec(ctx, store.Node{ID: "n_s2", Role: protocol.RoleSite, Site: "ams1"})
	if string(other.Sections[protocol.SectionBoot]) != `{"entries":[]}` {
		t.Errorf("another site sees %s", sections(other))
	}
}

func sections(s *protocol.Spec) string {
	b, _ := json.Marshal(s.Sections)
	return string(b)
}

func TestGatewayHostPort(t *testing.T) {
	for in, want := range map[string]string{
		"https://gw.example.test":        "gw.example.test:443",
		"https://gw.example.test:8444/x": "gw.example.test:8444",
		"https://[2001:db8::1]:9443":     "[2001:db8::1]:9443",
		"https://127.0.0.1:8444":         "127.0.0.1:8444",
	} {
		if got, err := GatewayHostPort(in); err != nil || got != want {
			t.Errorf("GatewayHostPort(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestInstallFiles(t *testing.T) {
	b := cptest.NewBundle(t)
	in := Install{GatewayURL: "https://gw.example.test:8444", GatewayServerName: "gw.internal.test", Site: "fsn1",
		Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK, Token: "bcjt_secret", NodeID: "n_01abc"}
	files, err := InstallFiles(in)
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]protocol.DeployFile{}
	for _, f := range files {
		if f.Mode != 0o600 || f.UID != 0 || f.GID != 0 || f.FS != protocol.FSRoot {
			t.Errorf("%s: mode %o uid %d gid %d fs %s", f.Path, f.Mode, f.UID, f.GID, f.FS)
		}
		byPath[f.Path] = f
	}
	c, err := config.Parse(byPath["/etc/bcd/config.toml"].Content, config.ParseOptions{})
	if err != nil {
		t.Fatalf("config.toml does not parse: %v", err)
	}
	if c.GatewayURL != in.GatewayURL || c.GatewayServerName != in.GatewayServerName || c.Site != "fsn1" ||
		c.ServingCASPKIPin != in.Pins.ServingCA || c.JoinSigningKeyPin != in.Pins.JoinSigning || c.JoinEncryptionKeyPin != in.Pins.JoinEncryption {
		t.Errorf("config %+v", c)
	}
	if got := string(byPath["/etc/bcd/join-token"].Content); got != "bcjt_secret\n" {
		t.Errorf("join-token %q", got)
	}
	if got := string(byPath["/etc/bcd/node-id"].Content); got != "n_01abc\n" {
		t.Errorf("node-id %q", got)
	}
	if got := strings.TrimSpace(string(byPath["/etc/bcd/join-encryption.jwk"].Content)); got != strings.TrimSpace(string(b.Public.JoinEncryptionJWK)) {
		t.Errorf("jwk %q", got)
	}
	// Printing the files never prints the token.
	if s := fmt.Sprintf("%v %+v", files, files); strings.Contains(s, "bcjt_secret") {
		t.Errorf("%%v of the files shows the token: %s", s)
	}
	for name, mut := range map[string]func(*Install){
		"no token":     func(i *Install) { i.Token = "" },
		"bad node id":  func(i *Install) { i.NodeID = "N 1" },
		"http gateway": func(i *Install) { i.GatewayURL = "http://gw.example.test" },
		"wrong jwk":    func(i *Install) { i.EncryptionJWK = cptest.NewBundle(t).Public.JoinEncryptionJWK },
	} {
		bad := in
		mut(&bad)
		if _, err := InstallFiles(bad); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "bcjt_secret") {
			t.Errorf("%s: the error quotes the token", name)
		}
	}
}

func TestEvents(t *testing.T) {
	st := cptest.NewStore(t)
	now := time.Now()
	e := &Events{Store: st, Now: func() time.Time { return now }}
	m := cptest.NewMachine(t, st, nil)
	site := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}
	event := func(kind string, v any) protocol.Event {
		b, _ := json.Marshal(v)
		return protocol.Event{Seq: 1, Kind: kind, Time: now, Message: "raw message", Data: b}
	}

	out, err := e.Event(ctx, site, event(protocol.EventMachineBooted, protocol.MachineBooted{MAC: "52:54:00:12:34:56", Stage: "script", File: "/ipxe/x.ipxe", IP: "10.20.0.50", Time: now}))
	if err != nil || out.Message != "raw message" {
		t.Fatalf("booted: %+v %v", out, err)
	}
	got, _ := st.GetMachine(ctx, m.ID)
	if got.LastBootStage != "script" || got.LastBootAt.UnixMilli() != now.UnixMilli() {
		t.Errorf("last boot %q %v", got.LastBootStage, got.LastBootAt)
	}
	// Unknown MACs, other roles and junk are stored as they are and
	// change nothing.
	for _, ev := range []protocol.Event{
		event(protocol.EventMachineBooted, protocol.MachineBooted{MAC: "52:54:00:99:99:99", Stage: "dhcp"}),
		event(protocol.EventMachineBooted, protocol.MachineBooted{MAC: "52:54:00:12:34:56", Stage: "Not a Stage"}),
		{Kind: protocol.EventMachineBooted, Data: []byte(`[1,2]`)},
	} {
		if _, err := e.Event(ctx, site, ev); err != nil {
			t.Errorf("%s: %v", ev.Data, err)
		}
	}
	e.Event(ctx, store.Node{ID: "n_x", Role: protocol.RoleNode, Site: cptest.Site}, event(protocol.EventMachineBooted, protocol.MachineBooted{MAC: "52:54:00:12:34:56", Stage: "dhcp", Time: now.Add(time.Hour)}))
	if got, _ := st.GetMachine(ctx, m.ID); got.LastBootStage != "script" {
		t.Errorf("a node of role node moved the last boot to %q", got.LastBootStage)
	}

	nonce := "0123456789abcdef0123456789abcdef"
	out, err = e.Event(ctx, site, event(protocol.EventBootNonce, protocol.BootNonce{MAC: "52-54-00-12-34-56", Nonce: nonce, ExpiresAt: now.Add(10 * time.Minute)}))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(nonce))
	if strings.Contains(string(out.Data)+out.Message, nonce) || !strings.Contains(string(out.Data), hex.EncodeToString(sum[:])) {
		t.Errorf("stored boot.nonce %s %q: want the hash, never the nonce", out.Data, out.Message)
	}
	n, err := st.GetBootNonce(ctx, sum)
	if err != nil || n.MAC != "52:54:00:12:34:56" || n.Site != cptest.Site || n.MachineID != m.ID || n.SiteNode != "n_site" {
		t.Errorf("nonce %+v %v", n, err)
	}
	for name, b := range map[string]protocol.BootNonce{
		"too far ahead": {MAC: cptest.MAC, Nonce: "far-far-far-far-far-far", ExpiresAt: now.Add(62 * time.Minute)},
		"expired":       {MAC: cptest.MAC, Nonce: "old-old-old-old-old-old", ExpiresAt: now.Add(-time.Second)},
		"bad MAC":       {MAC: "nope", Nonce: "mac-mac-mac-mac-mac-mac", ExpiresAt: now.Add(time.Minute)},
		"short nonce":   {MAC: cptest.MAC, Nonce: "short", ExpiresAt: now.Add(time.Minute)},
	} {
		out, err := e.Event(ctx, site, event(protocol.EventBootNonce, b))
		if err != nil || strings.Contains(string(out.Data)+out.Message, b.Nonce) || !strings.HasPrefix(out.Message, "refused") {
			t.Errorf("%s: %+v %v", name, out, err)
		}
		if _, err := st.GetBootNonce(ctx, sha256.Sum256([]byte(b.Nonce))); err == nil {
			t.Errorf("%s: stored", name)
		}
	}
	// An hour ahead, give or take the allowed skew, is fine.
	if _, err := e.Event(ctx, site, event(protocol.EventBootNonce, protocol.BootNonce{MAC: cptest.MAC, Nonce: "hour-hour-hour-hour-hour", ExpiresAt: now.Add(time.Hour + 30*time.Second)})); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetBootNonce(ctx, sha256.Sum256([]byte("hour-hour-hour-hour-hour"))); err != nil {
		t.Errorf("an hour's nonce: %v", err)
	}
	evs, _ := st.MachineEvents(ctx, m.ID, 0)
	var kinds []string
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind)
		if strings.Contains(string(ev.Data)+ev.Message, nonce) {
			t.Errorf("the timeline carries the nonce: %+v", ev)
		}
	}
	if strings.Join(kinds, ",") != "machine.added,machine.booted,boot.nonce,boot.nonce" {
		t.Errorf("timeline %v", kinds)
	}
}

// stoppingStore is a store whose writes after the nonce's fail once, as they do
// for a gateway that is stopping (its session's context cancelled).
type stoppingStore struct {
	store.Store
	failed bool
}

func (s *stoppingStore) AddMachineEvent(ctx context.Context, e store.MachineEvent) error {
	if !s.failed {
		s.failed = true
		return context.Canceled
	}
	return s.Store.AddMachineEvent(ctx, e)
}

// TestBootNonceEventSurvivesAnInterruptedStore: a boot.nonce whose handling
// failed part way (serve restarted) is replayed by the site agent, and the
// machine's timeline must then hold the nonce's entry. Stored in two
// transactions, the nonce went in, its timeline entry did not, and the replay
// found the nonce and added nothing: a provisioned machine whose timeline
// lacked boot.nonce (seen in the 1,000-machine faults run).
func TestBootNonceEventSurvivesAnInterruptedStore(t *testing.T) {
	st := &stoppingStore{Store: cptest.NewStore(t)}
	now := time.Now()
	e := &Events{Store: st, Now: func() time.Time { return now }}
	m := cptest.NewMachine(t, st.Store, nil)
	site := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}
	data, _ := json.Marshal(protocol.BootNonce{MAC: cptest.MAC, Nonce: "0123456789abcdef0123456789abcdef", ExpiresAt: now.Add(10 * time.Minute)})
	ev := protocol.Event{Seq: 7, Kind: protocol.EventBootNonce, Time: now, Data: data}
	for try := 0; try < 2; try++ {
		if _, err := e.Event(ctx, site, ev); err == nil {
			break
		}
		// An error leaves the event unacknowledged: the agent sends it again.
	}
	evs, _ := st.MachineEvents(ctx, m.ID, 0)
	n := 0
	for _, ev := range evs {
		if ev.Kind == protocol.EventBootNonce {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d boot.nonce entries in the machine's timeline after the replay, want 1", n)
	}
}

// FuzzEvents feeds a site agent's event data, which the control plane
// parses, to Events: it must never fail the session on junk, and a stored
// boot.nonce event never carries what the agent sent.
func FuzzEvents(f *testing.F) {
	st := cptest.NewStore(f)
	cptest.NewMachine(f, st, nil)
	e := &Events{Store: st}
	site := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}
	for _, seed := range []struct{ kind, data string }{
		{protocol.EventMachineBooted, `{"mac":"52:54:00:12:34:56","stage":"dhcp","arch":7,"time":"2026-01-01T00:00:00Z"}`},
		{protocol.EventBootNonce, `{"mac":"52:54:00:12:34:56","nonce":"0123456789abcdef0123","expires_at":"2099-01-01T00:00:00Z"}`},
		{protocol.EventBootNonce, `{"mac":1}`},
		{protocol.EventMachineBooted, `null`},
		{"log", `"x"`},
	} {
		f.Add(seed.kind, []byte(seed.data))
	}
	f.Fuzz(func(t *testing.T, kind string, data []byte) {
		ev := protocol.Event{Kind: kind, Time: time.Now(), Message: "m", Data: data}
		out, err := e.Event(ctx, site, ev)
		if err != nil {
			t.Fatalf("Event: %v", err)
		}
		if kind == protocol.EventBootNonce && len(data) > 8 && strings.Contains(string(out.Data)+out.Message, string(data)) {
			t.Fatalf("the stored boot.nonce carries the agent's data")
		}
	})
}

// countingStore counts the nonces of each AddBootNonces call and the steps of
// each RecordBoots call.
type countingStore struct {
	store.Store
	calls []string
}

func (s *countingStore) AddBootNonces(ctx context.Context, site string, ns []store.BootNonce) ([]bool, error) {
	s.calls = append(s.calls, fmt.Sprintf("nonces:%d", len(ns)))
	return s.Store.AddBootNonces(ctx, site, ns)
}

func (s *countingStore) RecordBoots(ctx context.Context, site string, steps []store.BootStep) ([]string, error) {
	s.calls = append(s.calls, fmt.Sprintf("steps:%d", len(steps)))
	return s.Store.RecordBoots(ctx, site, steps)
}

// TestEventsStoreNoncesInRuns: a batch of a site agent's events stores each run
// of boot nonces in one AddBootNonces call (a flood of script GETs costs a
// transaction a batch, not one a nonce) and each run of boot steps in one
// RecordBoots; a run ends where an event of another kind comes, so that the
// machine's timeline keeps the order of the events. A refused nonce is in no run.
func TestEventsStoreNoncesInRuns(t *testing.T) {
	st := &countingStore{Store: cptest.NewStore(t)}
	now := time.Now()
	e := &Events{Store: st, Now: func() time.Time { return now }}
	m := cptest.NewMachine(t, st.Store, nil)
	site := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}
	var evs []protocol.Event
	var nonces []string
	add := func(kind string, v any) {
		b, _ := json.Marshal(v)
		evs = append(evs, protocol.Event{Seq: uint64(len(evs) + 1), Kind: kind, Time: now, Message: "raw", Data: b})
	}
	nonce := func() {
		n, err := protocol.NewBootNonce()
		if err != nil {
			t.Fatal(err)
		}
		nonces = append(nonces, n)
		add(protocol.EventBootNonce, protocol.BootNonce{MAC: cptest.MAC, Nonce: n, ExpiresAt: now.Add(protocol.BootNonceLifetime)})
	}
	booted := func(stage string) {
		add(protocol.EventMachineBooted, protocol.MachineBooted{MAC: cptest.MAC, Stage: stage, Time: now})
	}
	for range 200 {
		nonce()
	}
	booted("dhcp")
	booted("tftp")
	nonce()
	add(protocol.EventBootNonce, protocol.BootNonce{MAC: cptest.MAC, Nonce: "short", ExpiresAt: now.Add(time.Minute)}) // refused
	nonce()
	add(protocol.EventLog, "x")
	nonce()
	booted("kernel")
	out, err := e.Events(ctx, site, evs)
	if err != nil || len(out) != len(evs) {
		t.Fatalf("Events = %d events, %v", len(out), err)
	}
	if got, want := strings.Join(st.calls, ","), "nonces:200,steps:2,nonces:2,nonces:1,steps:1"; got != want {
		t.Errorf("store calls %s, want %s", got, want)
	}
	for i, n := range nonces {
		sum := sha256.Sum256([]byte(n))
		if got, err := st.GetBootNonce(ctx, sum); err != nil || got.MachineID != m.ID {
			t.Errorf("nonce %d: %+v %v", i, got, err)
		}
	}
	for i, ev := range out {
		if ev.Kind == protocol.EventBootNonce && (strings.Contains(string(ev.Data), `"nonce"`) || ev.Message == "raw") {
			t.Errorf("event %d is stored as the agent sent it: %q %s", i, ev.Message, ev.Data)
		}
	}
	if !strings.HasPrefix(out[203].Message, "refused") {
		t.Errorf("the short nonce's event %q, want it refused", out[203].Message)
	}
	tl, _ := st.MachineEvents(ctx, m.ID, 0)
	var kinds []string
	for _, ev := range tl[201:] { // after machine.added and the first run's nonces
		kinds = append(kinds, ev.Kind)
	}
	if got, want := strings.Join(kinds, ","), "machine.booted,machine.booted,boot.nonce,boot.nonce,boot.nonce,machine.booted"; got != want {
		t.Errorf("timeline after the first run %s, want %s", got, want)
	}
}
