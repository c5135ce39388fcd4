package storetest

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

func newMachine(id, site string, macs ...string) store.Machine {
	now := time.Now()
	return store.Machine{ID: id, Site: site, MachineSpec: store.MachineSpec{MACs: macs}, MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: now},
		CreatedAt: now, UpdatedAt: now}
}

func testMachines(t *testing.T, s store.Store) {
	for _, name := range []string{"fsn1", "ams1"} {
		if err := s.CreateSite(ctx, store.Site{Name: name, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	rev := func(site string) int64 {
		st, _ := s.GetSite(ctx, site)
		return st.SpecRevision
	}
	m := newMachine(ids.New(ids.PrefixMachine, time.Now()), "fsn1", "52:54:00:00:00:01", "52:54:00:00:00:02")
	m.Name = "rack1-u1"
	m.BootOverride = protocol.BootRamdisk
	m.BMC = &store.MachineBMC{Address: "10.0.0.1", Username: "admin", Password: "s3cret", CipherSuite: 3}
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	if rev("fsn1") != 2 || rev("ams1") != 1 {
		t.Errorf("spec revisions after add: fsn1 %d, ams1 %d", rev("fsn1"), rev("ams1"))
	}
	got, err := s.GetMachine(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != m.Name || strings.Join(got.MACs, ",") != "52:54:00:00:00:01,52:54:00:00:00:02" || got.BMC == nil ||
		got.BMC.Password != "s3cret" || got.BootOverride != protocol.BootRamdisk || got.State != store.MachineRegistered {
		t.Errorf("machine %+v", got)
	}
	// The password never leaves as JSON.
	if b, _ := json.Marshal(got); strings.Contains(string(b), "s3cret") {
		t.Errorf("a machine's JSON carries the BMC password: %s", b)
	}
	if n, err := s.CountMachinesByState(ctx); err != nil || len(n) != 1 || n[store.MachineRegistered] != 1 {
		t.Errorf("machines by state: %v %v, want registered 1", n, err)
	}
	if by, err := s.FindMachineByMAC(ctx, "52:54:00:00:00:02"); err != nil || by.ID != m.ID {
		t.Errorf("by MAC: %+v %v", by, err)
	}
	if _, err := s.FindMachineByMAC(ctx, "52:54:00:00:00:09"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown MAC: %v", err)
	}

	var c *store.ConflictError
	err = s.CreateMachine(ctx, newMachine("m_2", "ams1", "52:54:00:00:00:03", "52:54:00:00:00:02"))
	if !errors.Is(err, store.ErrMACTaken) || !errors.As(err, &c) || c.Value != "52:54:00:00:00:02" || c.Machine != m.ID {
		t.Errorf("MAC of another machine: %v", err)
	}
	if _, err := s.FindMachineByMAC(ctx, "52:54:00:00:00:03"); !errors.Is(err, store.ErrNotFound) {
		t.Error("a refused machine left a MAC behind")
	}
	dup := newMachine("m_3", "fsn1", "52:54:00:00:00:04")
	dup.Name = "rack1-u1"
	if err := s.CreateMachine(ctx, dup); !errors.Is(err, store.ErrNameTaken) {
		t.Errorf("name taken in the site: %v", err)
	}
	dup.Site = "ams1"
	if err := s.CreateMachine(ctx, dup); err != nil {
		t.Errorf("the same name in another site: %v", err)
	}
	if err := s.CreateMachine(ctx, newMachine("m_4", "nowhere", "52:54:00:00:00:05")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing site: %v", err)
	}
	if named, _ := s.FindMachinesByName(ctx, "rack1-u1"); len(named) != 2 {
		t.Errorf("by name: %d machines", len(named))
	}
	if list, _ := s.ListMachines(ctx, "fsn1"); len(list) != 1 {
		t.Errorf("fsn1 has %d machines", len(list))
	}
	if list, _ := s.ListMachines(ctx, ""); len(list) != 2 {
		t.Errorf("%d machines in all", len(list))
	}

	before := rev("fsn1")
	local := protocol.BootLocal
	got, err = s.UpdateMachine(ctx, m.ID, store.MachineUpdate{BootOverride: &local, At: time.Now(), Event: store.MachineEvent{Kind: protocol.MachineEventBootMode, Message: "local"}})
	if err != nil || got.BootOverride != local || got.EffectiveBootMode() != local || rev("fsn1") != before+1 {
		t.Errorf("boot mode: %+v %v, revision %d", got, err, rev("fsn1"))
	}
	if got, err = s.UpdateMachine(ctx, m.ID, store.MachineUpdate{Approve: true, At: time.Now()}); err != nil || !got.Approved || rev("fsn1") != before+1 {
		t.Errorf("approve: %+v %v (an approval changes no spec)", got, err)
	}
	if got, err = s.UpdateMachine(ctx, m.ID, store.MachineUpdate{SetBMC: true, At: time.Now()}); err != nil || got.BMC != nil || rev("fsn1") != before+2 {
		t.Errorf("clear BMC: %+v %v", got, err)
	}
	if _, err := s.UpdateMachine(ctx, "m_missing", store.MachineUpdate{Approve: true, At: time.Now()}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("update a missing machine: %v", err)
	}

	at := time.Now()
	if id, err := s.RecordBoot(ctx, "fsn1", "52:54:00:00:00:01", "script", store.MachineEvent{Time: at, Kind: protocol.EventMachineBooted}); err != nil || id != m.ID {
		t.Errorf("record boot: %s %v", id, err)
	}
	// An older step replayed late does not move the last boot back.
	s.RecordBoot(ctx, "fsn1", "52:54:00:00:00:01", "dhcp", store.MachineEvent{Time: at.Add(-time.Minute), Kind: protocol.EventMachineBooted})
	if got, _ := s.GetMachine(ctx, m.ID); got.LastBootStage != "script" || got.LastBootAt.UnixMilli() != at.UnixMilli() {
		t.Errorf("last boot %s at %v", got.LastBootStage, got.LastBootAt)
	}
	if _, err := s.RecordBoot(ctx, "ams1", "52:54:00:00:00:01", "dhcp", store.MachineEvent{Time: at, Kind: protocol.EventMachineBooted}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("boot reported by another site: %v", err)
	}
	evs, err := s.MachineEvents(ctx, m.ID, 0)
	// Changes without an event (approve, clear BMC above) leave none.
	if err != nil || len(evs) != 4 || evs[0].Kind != protocol.MachineEventAdded || evs[1].Kind != protocol.MachineEventBootMode || evs[3].Kind != protocol.EventMachineBooted {
		t.Fatalf("timeline %+v %v", evs, err)
	}
	if last, _ := s.MachineEvents(ctx, m.ID, 2); len(last) != 2 || last[1].ID != evs[3].ID {
		t.Errorf("latest 2: %+v", last)
	}

	before = rev("fsn1")
	if err := s.DeleteMachine(ctx, m.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetMachine(ctx, m.ID); !errors.Is(err, store.ErrNotFound) || rev("fsn1") != before+1 {
		t.Errorf("after delete: %v, revision %d", err, rev("fsn1"))
	}
	if evs, _ := s.MachineEvents(ctx, m.ID, 0); len(evs) != 0 {
		t.Errorf("a deleted machine kept %d events", len(evs))
	}
	// Its MACs are free again.
	if err := s.CreateMachine(ctx, newMachine("m_5", "fsn1", "52:54:00:00:00:01")); err != nil {
		t.Errorf("reusing a deleted machine's MAC: %v", err)
	}
	if err := s.DeleteMachine(ctx, m.ID, false); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("delete twice: %v", err)
	}
}

func testSiteProxy(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", Approval: store.ApprovalManual, CreatedAt: time.Now()})
	site, err := s.SetSiteHTTPProxy(ctx, "fsn1", &protocol.HTTPProxySection{Listen: "10.20.0.2:3128", Allow: []string{"img:443"}}, time.Now())
	if err != nil || site.HTTPProxy == nil || site.HTTPProxy.Listen != "10.20.0.2:3128" || site.SpecRevision != 2 || !site.ManualApproval() {
		t.Fatalf("set proxy: %+v %v", site, err)
	}
	if site, _ = s.SetSiteHTTPProxy(ctx, "fsn1", nil, time.Now()); site.HTTPProxy != nil || site.SpecRevision != 3 {
		t.Errorf("clear proxy: %+v", site)
	}
	if _, err := s.SetSiteHTTPProxy(ctx, "nope", nil, time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("missing site: %v", err)
	}
}

func testBootNonces(t *testing.T, s store.Store) {
	now := time.Now()
	n := store.BootNonce{Hash: sha256.Sum256([]byte("nonce-1")), MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if added, err := s.AddBootNonce(ctx, n); !added || err != nil {
		t.Fatalf("add: %v %v", added, err)
	}
	if added, err := s.AddBootNonce(ctx, n); added || err != nil {
		t.Errorf("a replayed nonce: %v %v", added, err)
	}
	got, err := s.GetBootNonce(ctx, n.Hash)
	if err != nil || got.MAC != n.MAC || got.ExpiresAt.UnixMilli() != n.ExpiresAt.UnixMilli() || !got.UsedAt.IsZero() {
		t.Errorf("get: %+v %v", got, err)
	}
	if _, err := s.GetBootNonce(ctx, sha256.Sum256([]byte("other"))); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("unknown nonce: %v", err)
	}
	if first, err := s.DeferBootNonce(ctx, n.Hash, "csr-a", now); !first || err != nil {
		t.Errorf("first deferral: %v %v", first, err)
	}
	if first, err := s.DeferBootNonce(ctx, n.Hash, "csr-a", now); first || err != nil {
		t.Errorf("second deferral: %v %v", first, err)
	}
	if _, err := s.DeferBootNonce(ctx, n.Hash, "csr-b", now); !errors.Is(err, store.ErrNonceClaimed) {
		t.Errorf("deferral of another CSR: %v", err)
	}
	h := n.Hash
	if err := s.Admit(ctx, store.Admission{Node: newNode("n_r"), BootNonce: &h, Now: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit(ctx, store.Admission{Node: newNode("n_r2"), BootNonce: &h, Now: now}); !errors.Is(err, store.ErrNonceUsed) {
		t.Errorf("second use: %v", err)
	}
	if _, err := s.GetNode(ctx, "n_r2"); !errors.Is(err, store.ErrNotFound) {
		t.Error("a refused nonce use wrote its node")
	}
	if _, err := s.DeferBootNonce(ctx, n.Hash, "csr-a", now); !errors.Is(err, store.ErrNonceUsed) {
		t.Errorf("deferral of a used nonce: %v", err)
	}
	// A day after they expire nonces go, at the next one's arrival.
	old := store.BootNonce{Hash: sha256.Sum256([]byte("nonce-old")), MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		CreatedAt: now.Add(-48 * time.Hour), ExpiresAt: now.Add(-47 * time.Hour)}
	s.AddBootNonce(ctx, old)
	later := store.BootNonce{Hash: sha256.Sum256([]byte("nonce-2")), MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	s.AddBootNonce(ctx, later)
	if _, err := s.GetBootNonce(ctx, old.Hash); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a nonce two days past its expiry is kept: %v", err)
	}
}

// testAddBootNonces: a batch of a site agent's nonces is AddBootNonce for each,
// in one call: a nonce is bound to the machine of that site with its MAC (none
// for a MAC of no machine, or of another site's), its timeline entry goes to
// that machine alone, a nonce already stored (or twice in the batch) is not
// added again, the nonces a day past their expiry go, and a batch that fails
// stores none of its nonces.
func testAddBootNonces(t *testing.T, s store.Store) {
	for _, name := range []string{"fsn1", "ams1"} {
		if err := s.CreateSite(ctx, store.Site{Name: name, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	a := newMachine("m_a", "fsn1", "52:54:00:00:00:01")
	c := newMachine("m_c", "ams1", "52:54:00:00:00:04")
	for _, m := range []store.Machine{a, c} {
		if err := s.CreateMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().Truncate(time.Millisecond)
	old := store.BootNonce{Hash: sha256.Sum256([]byte("nonce-old")), MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		CreatedAt: now.Add(-48 * time.Hour), ExpiresAt: now.Add(-47 * time.Hour)}
	if added, err := s.AddBootNonce(ctx, old); !added || err != nil {
		t.Fatalf("add the old nonce: %v %v", added, err)
	}
	stored := store.BootNonce{Hash: sha256.Sum256([]byte("nonce-stored")), MAC: "52:54:00:00:00:01", Site: "fsn1", SiteNode: "n_s",
		MachineID: "m_a", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	if added, err := s.AddBootNonce(ctx, stored); !added || err != nil {
		t.Fatalf("add: %v %v", added, err)
	}
	nonce := func(name, mac string, d time.Duration) store.BootNonce {
		return store.BootNonce{Hash: sha256.Sum256([]byte(name)), MAC: mac, Site: "elsewhere", SiteNode: "n_s",
			MachineID: "m_wrong", CreatedAt: now.Add(d), ExpiresAt: now.Add(d + time.Minute),
			Event: &store.MachineEvent{MachineID: "m_wrong", Time: now.Add(d), Kind: protocol.EventBootNonce, Message: name, NodeID: "n_s"}}
	}
	batch := []store.BootNonce{
		nonce("nonce-1", "52:54:00:00:00:01", 0),
		nonce("nonce-2", "52:54:00:00:00:09", time.Millisecond),        // no machine
		nonce("nonce-3", "52:54:00:00:00:04", 2*time.Millisecond),      // a machine of another site
		nonce("nonce-stored", "52:54:00:00:00:01", 3*time.Millisecond), // stored before: a replay
		nonce("nonce-4", "52:54:00:00:00:01", 4*time.Millisecond),
		nonce("nonce-1", "52:54:00:00:00:01", 5*time.Millisecond), // twice in the batch
	}
	added, err := s.AddBootNonces(ctx, "fsn1", batch)
	if err != nil || len(added) != len(batch) {
		t.Fatalf("AddBootNonces = %v, %v", added, err)
	}
	if want := []bool{true, true, true, false, true, false}; fmt.Sprint(added) != fmt.Sprint(want) {
		t.Errorf("added %v, want %v", added, want)
	}
	for _, tc := range []struct{ name, machine string }{{"nonce-1", "m_a"}, {"nonce-2", ""}, {"nonce-3", ""}, {"nonce-4", "m_a"}} {
		got, err := s.GetBootNonce(ctx, sha256.Sum256([]byte(tc.name)))
		if err != nil || got.MachineID != tc.machine || got.Site != "fsn1" || got.SiteNode != "n_s" || !got.UsedAt.IsZero() {
			t.Errorf("%s: %+v %v, want machine %q of site fsn1", tc.name, got, err, tc.machine)
		}
	}
	if got, _ := s.GetBootNonce(ctx, stored.Hash); got.CreatedAt.UnixMilli() != now.UnixMilli() {
		t.Errorf("the replayed nonce was rewritten: created %v", got.CreatedAt)
	}
	if _, err := s.GetBootNonce(ctx, old.Hash); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a nonce two days past its expiry is kept: %v", err)
	}
	timeline := func(id string) []string {
		t.Helper()
		evs, err := s.MachineEvents(ctx, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, ev := range evs {
			if ev.Kind == protocol.EventBootNonce {
				if ev.MachineID != id {
					t.Errorf("%s's entry %q names machine %s", id, ev.Message, ev.MachineID)
				}
				got = append(got, ev.Message)
			}
		}
		return got
	}
	if got := timeline("m_a"); strings.Join(got, ",") != "nonce-1,nonce-4" {
		t.Errorf("m_a's boot.nonce entries %q, want nonce-1,nonce-4", got)
	}
	for _, id := range []string{"m_c", "m_wrong"} {
		if got := timeline(id); len(got) != 0 {
			t.Errorf("%s has boot.nonce entries %q, want none", id, got)
		}
	}
	if added, err := s.AddBootNonces(ctx, "fsn1", nil); err != nil || len(added) != 0 {
		t.Errorf("no nonces: %v %v", added, err)
	}
	// A nonce without its times cannot be stored: the batch fails whole.
	bad := nonce("nonce-bad", "52:54:00:00:00:01", 0)
	bad.CreatedAt, bad.ExpiresAt = time.Time{}, time.Time{}
	if _, err := s.AddBootNonces(ctx, "fsn1", []store.BootNonce{nonce("nonce-5", "52:54:00:00:00:01", time.Second), bad}); err == nil {
		t.Fatal("a nonce without its times was stored")
	}
	if _, err := s.GetBootNonce(ctx, sha256.Sum256([]byte("nonce-5"))); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the nonce before the failed one was stored: %v", err)
	}
	if got := timeline("m_a"); len(got) != 2 {
		t.Errorf("m_a's boot.nonce entries after the failed batch %q, want the two before", got)
	}
}

func testCommandsOnTheMachineTimeline(t *testing.T, s store.Store) {
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	m := newMachine("m_1", "fsn1", "52:54:00:00:00:01")
	if err := s.CreateMachine(ctx, m); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	inv := store.Command{ID: "cmd_inv", NodeID: "n_r", MachineID: m.ID, Kind: protocol.KindInventory, State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	dep := store.Command{ID: "cmd_dep", NodeID: "n_r", MachineID: m.ID, Kind: protocol.KindDeployImage, Params: []byte(`{"files":[{"content":"c2VjcmV0"}]}`),
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	for _, c := range []store.Command{inv, dep} {
		if err := s.CreateCommand(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(id, state string, at time.Time, progress, result string) {
		t.Helper()
		var p, r []byte
		if progress != "" {
			p = []byte(progress)
		}
		if result != "" {
			r = []byte(result)
		}
		if ok, err := s.ApplyStatus(ctx, store.StatusUpdate{CommandID: id, NodeID: "n_r", State: state, Progress: p, Result: r, At: at}); !ok || err != nil {
			t.Fatalf("status %s %s: %v %v", id, state, ok, err)
		}
	}
	apply("cmd_inv", "SUCCEEDED", now, "", `{"cpus":64,"memory_bytes":1}`)
	if got, _ := s.GetMachine(ctx, m.ID); !strings.Contains(string(got.Inventory), `"cpus":64`) {
		t.Errorf("inventory %s", got.Inventory)
	}
	apply("cmd_dep", "RUNNING", now, `{"done":1,"total":10,"unit":"bytes"}`, "")
	apply("cmd_dep", "RUNNING", now.Add(time.Second), `{"done":2,"total":10,"unit":"bytes"}`, "")   // thinned
	apply("cmd_dep", "RUNNING", now.Add(6*time.Second), `{"done":5,"total":10,"unit":"bytes"}`, "") // kept
	apply("cmd_dep", "SUCCEEDED", now.Add(7*time.Second), "", `{"disk":"/dev/vda","after":"kexec"}`)
	evs, _ := s.MachineEvents(ctx, m.ID, 0)
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind+":"+e.CommandID)
		if strings.Contains(string(e.Data), "c2VjcmV0") || strings.Contains(e.Message, "c2VjcmV0") {
			t.Errorf("event %+v carries the command's params", e)
		}
		if e.CommandID == "cmd_inv" && strings.Contains(string(e.Data), "cpus") {
			t.Errorf("the inventory result is on the timeline: %s", e.Data)
		}
	}
	want := "machine.added:,command:cmd_inv,command:cmd_dep,command.status:cmd_inv,command.status:cmd_dep,command.status:cmd_dep,command.status:cmd_dep"
	if strings.Join(kinds, ",") != want {
		t.Errorf("timeline\n%s\nwant\n%s", strings.Join(kinds, ","), want)
	}
	if last := evs[len(evs)-1]; !strings.Contains(string(last.Data), `"disk":"/dev/vda"`) || last.Message != "deploy.image SUCCEEDED" {
		t.Errorf("last event %+v", last)
	}
}

// testRecordBoots: a batch of boot steps is RecordBoot for each, in one call; a
// MAC of no machine of the site gets "" and takes nothing else down.
func testRecordBoots(t *testing.T, s store.Store) {
	for _, name := range []string{"fsn1", "ams1"} {
		if err := s.CreateSite(ctx, store.Site{Name: name, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	a := newMachine("m_a", "fsn1", "52:54:00:00:00:01", "52:54:00:00:00:02")
	b := newMachine("m_b", "fsn1", "52:54:00:00:00:03")
	c := newMachine("m_c", "ams1", "52:54:00:00:00:04")
	for _, m := range []store.Machine{a, b, c} {
		if err := s.CreateMachine(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now()
	step := func(mac, stage string, d time.Duration) store.BootStep {
		return store.BootStep{MAC: mac, Stage: stage, Event: store.MachineEvent{Time: at.Add(d), Kind: protocol.EventMachineBooted, Message: stage + " " + mac}}
	}
	ids, err := s.RecordBoots(ctx, "fsn1", []store.BootStep{
		step("52:54:00:00:00:01", "dhcp", 0),
		step("52:54:00:00:00:09", "dhcp", 0), // no machine
		step("52:54:00:00:00:04", "dhcp", 0), // a machine of another site
		step("52:54:00:00:00:02", "tftp", time.Second),
		step("52:54:00:00:00:03", "dhcp", 0),
		step("52:54:00:00:00:01", "pxe", -time.Minute), // an older step replayed late
	})
	if err != nil || strings.Join(ids, ",") != "m_a,,,m_a,m_b,m_a" {
		t.Fatalf("RecordBoots = %q, %v", ids, err)
	}
	if got, _ := s.GetMachine(ctx, "m_a"); got.LastBootStage != "tftp" || got.LastBootAt.UnixMilli() != at.Add(time.Second).UnixMilli() {
		t.Errorf("m_a last boot %s at %v, want tftp", got.LastBootStage, got.LastBootAt)
	}
	if got, _ := s.GetMachine(ctx, "m_c"); got.LastBootStage != "" {
		t.Errorf("a step reported by another site moved m_c to %q", got.LastBootStage)
	}
	var booted []string
	evs, _ := s.MachineEvents(ctx, "m_a", 0)
	for _, ev := range evs {
		if ev.Kind == protocol.EventMachineBooted {
			booted = append(booted, ev.Message)
		}
	}
	if strings.Join(booted, ",") != "dhcp 52:54:00:00:00:01,tftp 52:54:00:00:00:02,pxe 52:54:00:00:00:01" {
		t.Errorf("m_a's timeline %q", booted)
	}
	if ids, err := s.RecordBoots(ctx, "fsn1", nil); err != nil || len(ids) != 0 {
		t.Errorf("no steps: %q %v", ids, err)
	}
	// Events in a batch, and an empty batch.
	now := time.Now()
	if err := s.AddEvents(ctx, []store.Event{
		{NodeID: "n_site", Seq: 1, Kind: protocol.EventMachineBooted, Time: now, Message: "dhcp", ReceivedAt: now},
		{NodeID: "n_site", Seq: 2, Kind: protocol.EventMachineBooted, Time: now, Message: "pxe", ReceivedAt: now},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddEvents(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
