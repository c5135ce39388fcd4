package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// admitNode stores a site fsn1 (when missing) and a node of it.
func admitNode(t *testing.T, s store.Store, n store.Node) {
	t.Helper()
	s.CreateSite(ctx, store.Site{Name: "fsn1", CreatedAt: time.Now()})
	if err := s.Admit(ctx, store.Admission{Node: n, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func testReleases(t *testing.T, s store.Store) {
	at := time.Now().UTC().Truncate(time.Millisecond)
	r := store.Release{Version: "v0.1.1", Product: "bcd", Sequence: 2, Expires: at.Add(time.Hour), Manifest: `{"m":1}`,
		URLBase: "https://cp.example.test", AddedAt: at,
		Binaries: []store.ReleaseBinary{{Arch: "amd64", Name: "bcd_0.1.1_linux_amd64", Size: 10, SHA256: "ab"}}}
	got, added, err := s.AddRelease(ctx, r)
	if err != nil || !added || got.Version != "0.1.1" {
		t.Fatalf("AddRelease = %+v, %v, %v; want added as 0.1.1", got, added, err)
	}
	if got, added, err = s.AddRelease(ctx, r); err != nil || added || got.Sequence != 2 {
		t.Fatalf("the same manifest again = %+v, %v, %v; want the stored release, not added", got, added, err)
	}
	other := r
	other.Manifest = `{"m":2}`
	if _, _, err := s.AddRelease(ctx, other); !errors.Is(err, store.ErrExists) {
		t.Fatalf("another manifest for 0.1.1: %v, want ErrExists", err)
	}
	older := r
	older.Version, older.Sequence, older.Manifest = "0.1.0", 1, `{"m":0}`
	if _, _, err := s.AddRelease(ctx, older); err != nil {
		t.Fatal(err)
	}
	g, err := s.GetRelease(ctx, "0.1.1")
	if err != nil || g.Manifest != r.Manifest || !g.Expires.Equal(r.Expires) || len(g.Binaries) != 1 || g.Binaries[0] != r.Binaries[0] {
		t.Fatalf("GetRelease = %+v, %v", g, err)
	}
	if b, ok := g.Binary("amd64"); !ok || b.Name != "bcd_0.1.1_linux_amd64" {
		t.Errorf("Binary(amd64) = %+v, %v", b, ok)
	}
	if u := g.BinaryURL("arm64"); u != "https://cp.example.test/downloads/bcd/0.1.1/linux-arm64" {
		t.Errorf("BinaryURL = %s", u)
	}
	if _, err := s.GetRelease(ctx, "9.9.9"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetRelease of a missing version: %v", err)
	}
	list, err := s.ListReleases(ctx)
	if err != nil || len(list) != 2 || list[0].Version != "0.1.1" || list[1].Version != "0.1.0" {
		t.Fatalf("ListReleases = %+v, %v; want highest sequence first", list, err)
	}
}

func testDaemonTargetAndArch(t *testing.T, s store.Store) {
	admitNode(t, s, newNode("n_1"))
	before, _ := s.GetNode(ctx, "n_1")
	if _, err := s.OpenSession(ctx, store.Session{NodeID: "n_1", Role: "node", DaemonVersion: "0.1.0", DaemonArch: "arm64",
		ProtocolVersion: 1, ConnectedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	n, _ := s.GetNode(ctx, "n_1")
	if n.DaemonArch != "arm64" || n.DaemonVersion != "0.1.0" {
		t.Fatalf("after a session: arch %q version %q", n.DaemonArch, n.DaemonVersion)
	}
	// An older agent says no arch: the one known stays.
	id, _ := s.OpenSession(ctx, store.Session{NodeID: "n_1", Role: "node", DaemonVersion: "0.1.1", ProtocolVersion: 1, ConnectedAt: time.Now()})
	if n, _ = s.GetNode(ctx, "n_1"); n.DaemonArch != "arm64" || n.DaemonVersion != "0.1.1" {
		t.Fatalf("after a session without arch: arch %q version %q", n.DaemonArch, n.DaemonVersion)
	}
	if se, err := s.GetSession(ctx, id); err != nil || se.DaemonArch != "" {
		t.Fatalf("GetSession = %+v, %v", se, err)
	}
	sec := &protocol.DaemonSection{Version: "0.1.1", URL: "https://x/downloads/bcd/0.1.1/linux-arm64", SHA256: "ab", Signature: "{}"}
	n, err := s.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: "n_1", Section: sec}, time.Now())
	if err != nil || n.DaemonTarget == nil || *n.DaemonTarget != *sec || n.SpecRevision != before.SpecRevision+1 {
		t.Fatalf("SetDaemonTarget = %+v, %v", n, err)
	}
	// A clear for another version leaves it.
	if n, err = s.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: "n_1", IfVersion: "0.2.0"}, time.Now()); err != nil || n.DaemonTarget == nil ||
		n.SpecRevision != before.SpecRevision+1 {
		t.Fatalf("a clear of another version = %+v, %v", n, err)
	}
	if n, err = s.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: "n_1", IfVersion: "0.1.1"}, time.Now()); err != nil || n.DaemonTarget != nil ||
		n.SpecRevision != before.SpecRevision+2 {
		t.Fatalf("a clear = %+v, %v", n, err)
	}
	if _, err := s.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: "n_missing", Section: sec}, time.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("target of a missing node: %v", err)
	}
	s.DeleteNode(ctx, "n_1", time.Now())
	if _, err := s.SetDaemonTarget(ctx, store.DaemonTarget{NodeID: "n_1", Section: sec}, time.Now()); !errors.Is(err, store.ErrNodeDeleted) {
		t.Errorf("target of a deleted node: %v", err)
	}
}

func testSectionStatuses(t *testing.T, s store.Store) {
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	st := func(rev int64, at time.Time, state string) store.SectionStatus {
		return store.SectionStatus{NodeID: "n_1", Section: protocol.SectionDaemon, State: state, Reason: "r-" + state,
			Message: "m", Version: "0.1.1", Revision: rev, At: at, ReceivedAt: time.Now()}
	}
	if _, err := s.GetSectionStatus(ctx, "n_1", protocol.SectionDaemon); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("no status yet: %v", err)
	}
	for _, c := range []struct {
		name string
		in   store.SectionStatus
		ok   bool
		want string
	}{
		{"first", st(3, t0, protocol.SectionRunning), true, protocol.SectionRunning},
		{"same revision, later", st(3, t0.Add(time.Second), protocol.SectionFailed), true, protocol.SectionFailed},
		{"same revision, earlier (a replay)", st(3, t0, protocol.SectionRunning), false, protocol.SectionFailed},
		{"older revision, later", st(2, t0.Add(time.Hour), protocol.SectionSucceeded), false, protocol.SectionFailed},
		{"newer revision, earlier clock", st(4, t0.Add(-time.Hour), protocol.SectionSucceeded), true, protocol.SectionSucceeded},
	} {
		ok, err := s.ApplySectionStatus(ctx, c.in)
		if err != nil || ok != c.ok {
			t.Fatalf("%s: ApplySectionStatus = %v, %v; want %v", c.name, ok, err, c.ok)
		}
		got, err := s.GetSectionStatus(ctx, "n_1", protocol.SectionDaemon)
		if err != nil || got.State != c.want || got.Reason != "r-"+c.want {
			t.Fatalf("%s: stored %+v, %v; want %s", c.name, got, err, c.want)
		}
	}
	other := st(1, t0, protocol.SectionRunning)
	other.NodeID = "n_2"
	s.ApplySectionStatus(ctx, other)
	list, err := s.ListSectionStatuses(ctx, protocol.SectionDaemon)
	if err != nil || len(list) != 2 || list[0].NodeID != "n_1" || list[0].Revision != 4 || list[1].NodeID != "n_2" {
		t.Fatalf("ListSectionStatuses = %+v, %v", list, err)
	}
	if list, _ := s.ListSectionStatuses(ctx, "boot"); len(list) != 0 {
		t.Errorf("statuses of another section: %+v", list)
	}
}

func newRollout(id, pool, site string, at time.Time, nodes ...string) store.Rollout {
	r := store.Rollout{ID: id, Version: "0.1.1", Role: "node", Pool: pool, Site: site, Waves: []int{50, 100}, MaxUnavailable: 1,
		FailureThreshold: 10, WaveTimeout: 30 * time.Minute, State: store.RolloutRunning, CreatedAt: at, UpdatedAt: at,
		Timeline: []store.RolloutEvent{{At: at, Message: "created"}}}
	for i, n := range nodes {
		r.Nodes = append(r.Nodes, store.RolloutNode{NodeID: n, Pool: "pool_a", Wave: i + 1, State: store.RolloutNodePending})
	}
	return r
}

func testRollouts(t *testing.T, s store.Store) {
	admitNode(t, s, newNode("n_1"))
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	r := newRollout("ro_1", "pool_a", "", t0, "n_1", "n_2")
	if err := s.CreateRollout(ctx, r); err != nil {
		t.Fatal(err)
	}
	// Overlapping target sets are refused while ro_1 is active.
	for _, c := range []struct{ pool, site string }{{"pool_a", ""}, {"", ""}, {"pool_a", "fsn1"}, {"", "fsn1"}} {
		err := s.CreateRollout(ctx, newRollout("ro_x", c.pool, c.site, t0))
		var active *store.ActiveRolloutError
		if !errors.As(err, &active) || active.Rollout.ID != "ro_1" || !errors.Is(err, store.ErrExists) {
			t.Fatalf("pool %q site %q beside ro_1: %v, want *ActiveRolloutError naming ro_1", c.pool, c.site, err)
		}
	}
	if err := s.CreateRollout(ctx, newRollout("ro_b", "pool_b", "", t0.Add(time.Millisecond))); err != nil {
		t.Fatalf("another pool: %v", err)
	}
	site := newRollout("ro_s", "", "", t0.Add(2*time.Millisecond))
	site.Role = "site"
	if err := s.CreateRollout(ctx, site); err != nil {
		t.Fatalf("another role: %v", err)
	}
	got, err := s.GetRollout(ctx, "ro_1")
	if err != nil || got.Revision != 1 || len(got.Nodes) != 2 || got.Nodes[0].NodeID != "n_1" || got.Nodes[1].Wave != 2 ||
		len(got.Timeline) != 1 || got.WaveTimeout != 30*time.Minute || len(got.Waves) != 2 || got.Waves[1] != 100 {
		t.Fatalf("GetRollout = %+v, %v", got, err)
	}

	// A step: n_1 starts, its target is set and a command made, at once.
	sec := &protocol.DaemonSection{Version: "0.1.1", URL: "https://x/y", SHA256: "ab", Signature: "{}"}
	n1 := got.Nodes[0]
	n1.State, n1.StartedAt, n1.CommandID = store.RolloutNodeUpdating, t0.Add(time.Second), "cmd_1"
	step := store.RolloutStep{RolloutID: "ro_1", Revision: 1, State: store.RolloutRunning, Nodes: []store.RolloutNode{n1},
		Timeline: []store.RolloutEvent{{At: t0.Add(time.Second), Message: "node n_1 started"}},
		Targets:  []store.DaemonTarget{{NodeID: "n_1", Section: sec}},
		Commands: []store.Command{{ID: "cmd_1", NodeID: "n_1", Kind: protocol.KindDaemonUpgrade, State: store.CommandPending, CreatedAt: t0, UpdatedAt: t0}},
		At:       t0.Add(time.Second)}
	if err := s.StepRollout(ctx, step); err != nil {
		t.Fatal(err)
	}
	if err := s.StepRollout(ctx, step); !errors.Is(err, store.ErrRolloutChanged) {
		t.Fatalf("a step from a stale revision: %v, want ErrRolloutChanged", err)
	}
	if n, _ := s.GetNode(ctx, "n_1"); n.DaemonTarget == nil || n.DaemonTarget.Version != "0.1.1" {
		t.Errorf("the step's target: %+v", n.DaemonTarget)
	}
	if c, err := s.GetCommand(ctx, "cmd_1"); err != nil || c.Kind != protocol.KindDaemonUpgrade {
		t.Errorf("the step's command: %+v, %v", c, err)
	}
	got, _ = s.GetRollout(ctx, "ro_1")
	if got.Revision != 2 || got.Nodes[0].State != store.RolloutNodeUpdating || got.Nodes[0].CommandID != "cmd_1" ||
		!got.Nodes[0].StartedAt.Equal(n1.StartedAt) || len(got.Timeline) != 2 || got.Timeline[1].Message != "node n_1 started" {
		t.Fatalf("after the step: %+v", got)
	}
	// A step that fails part way writes nothing: a target for a missing node.
	bad := store.RolloutStep{RolloutID: "ro_1", Revision: 2, State: store.RolloutPaused, Reason: "x",
		Timeline: []store.RolloutEvent{{At: t0, Message: "never"}}, Targets: []store.DaemonTarget{{NodeID: "n_missing", Section: sec}}, At: t0}
	if err := s.StepRollout(ctx, bad); err == nil {
		t.Fatal("a step with a missing node's target succeeded")
	}
	if got, _ = s.GetRollout(ctx, "ro_1"); got.State != store.RolloutRunning || got.Revision != 2 || len(got.Timeline) != 2 {
		t.Fatalf("a failed step left %+v", got)
	}
	if err := s.StepRollout(ctx, store.RolloutStep{RolloutID: "ro_missing", Revision: 1, State: "running", At: t0}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a step of a missing rollout: %v", err)
	}

	active, err := s.ListActiveRollouts(ctx)
	if err != nil || len(active) != 3 || active[0].ID != "ro_1" || len(active[0].Nodes) != 2 {
		t.Fatalf("ListActiveRollouts = %+v, %v", active, err)
	}
	// Finished: no longer active, and the target set is free again.
	if err := s.StepRollout(ctx, store.RolloutStep{RolloutID: "ro_1", Revision: 2, State: store.RolloutAborted, Reason: "by the operator", At: t0}); err != nil {
		t.Fatal(err)
	}
	if active, _ = s.ListActiveRollouts(ctx); len(active) != 2 {
		t.Errorf("after abort, active: %+v", active)
	}
	if err := s.CreateRollout(ctx, newRollout("ro_2", "pool_a", "", t0.Add(3*time.Millisecond))); err != nil {
		t.Fatalf("after abort, a new rollout of pool_a: %v", err)
	}
	all, err := s.ListRollouts(ctx)
	if err != nil || len(all) != 4 || all[0].ID != "ro_2" || all[0].Nodes != nil {
		t.Fatalf("ListRollouts = %+v, %v", all, err)
	}
}
