package rollouts

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// The controller's transitions, one Step at a time, on a fake store and an
// injected clock: a rollout is put in a state, something happens (a node
// rejoins at the version, reports FAILED, its command fails, the clock
// passes the wave timeout), and Step runs once. No goroutine runs.

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const version = "0.1.1"

type fakeStore struct {
	rollouts map[string]store.Rollout
	nodes    map[string]store.Node
	sessions map[int64]store.Session
	commands map[string]store.Command
	sections map[string]store.SectionStatus
	release  store.Release
	policies []store.PoolPolicy
	steps    int
}

func (f *fakeStore) ListPoolPolicies(context.Context) ([]store.PoolPolicy, error) {
	return slices.Clone(f.policies), nil
}

func (f *fakeStore) ListActiveRollouts(context.Context) ([]store.Rollout, error) {
	var out []store.Rollout
	for _, r := range f.rollouts {
		if store.RolloutActive(r.State) {
			r.Nodes = slices.Clone(r.Nodes)
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fakeStore) GetRelease(_ context.Context, v string) (store.Release, error) {
	if v != f.release.Version {
		return store.Release{}, store.ErrNotFound
	}
	return f.release, nil
}

func (f *fakeStore) ListNodes(context.Context) ([]store.Node, error) {
	var out []store.Node
	for _, n := range f.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b store.Node) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (f *fakeStore) GetSession(_ context.Context, id int64) (store.Session, error) {
	s, ok := f.sessions[id]
	if !ok {
		return s, store.ErrNotFound
	}
	return s, nil
}

func (f *fakeStore) GetCommand(_ context.Context, id string) (store.Command, error) {
	c, ok := f.commands[id]
	if !ok {
		return c, store.ErrNotFound
	}
	return c, nil
}

func (f *fakeStore) GetSectionStatus(_ context.Context, node, section string) (store.SectionStatus, error) {
	s, ok := f.sections[node+"/"+section]
	if !ok {
		return s, store.ErrNotFound
	}
	return s, nil
}

func (f *fakeStore) StepRollout(_ context.Context, s store.RolloutStep) error {
	r, ok := f.rollouts[s.RolloutID]
	if !ok {
		return store.ErrNotFound
	}
	if r.Revision != s.Revision {
		return store.ErrRolloutChanged
	}
	f.steps++
	r.State, r.Reason, r.Revision = s.State, s.Reason, r.Revision+1
	for _, n := range s.Nodes {
		i := slices.IndexFunc(r.Nodes, func(m store.RolloutNode) bool { return m.NodeID == n.NodeID })
		r.Nodes[i] = n
	}
	r.Timeline = append(r.Timeline, s.Timeline...)
	for _, t := range s.Targets {
		n := f.nodes[t.NodeID]
		if t.Section == nil && t.IfVersion != "" && (n.DaemonTarget == nil || n.DaemonTarget.Version != t.IfVersion) {
			continue
		}
		n.DaemonTarget = t.Section
		n.SpecRevision++
		f.nodes[t.NodeID] = n
	}
	for _, c := range s.Commands {
		f.commands[c.ID] = c
	}
	f.rollouts[s.RolloutID] = r
	return nil
}

// notes records what the controller told the gateway.
type notes struct{ specs, commands []string }

func (n *notes) Notify(id string)          { n.commands = append(n.commands, id) }
func (n *notes) NodeSpecChanged(id string) { n.specs = append(n.specs, id) }

type world struct {
	t   *testing.T
	s   *fakeStore
	c   *Controller
	n   *notes
	now time.Time
}

// newWorld: connected nodes n1..nN of pool_a (amd64, running 0.1.0, protocol
// 1), a release 0.1.1 with an amd64 binary, and rollout ro_1 of it over them
// in waves, running, nothing started.
func newWorld(t *testing.T, n int, waves []int, mut func(*store.Rollout)) *world {
	w := &world{t: t, now: t0, n: &notes{}, s: &fakeStore{rollouts: map[string]store.Rollout{}, nodes: map[string]store.Node{},
		sessions: map[int64]store.Session{}, commands: map[string]store.Command{}, sections: map[string]store.SectionStatus{},
		release: store.Release{Version: version, Manifest: `{"manifest":1}`, URLBase: "https://cp.test", Expires: t0.Add(time.Hour),
			Binaries: []store.ReleaseBinary{{Arch: "amd64", Name: "bcd_0.1.1_linux_amd64", SHA256: "aa"}}}}}
	w.c = &Controller{Store: w.s, Notifier: w.n, Now: func() time.Time { return w.now }}
	r := store.Rollout{ID: "ro_1", Version: version, Role: protocol.RoleNode, Waves: waves, MaxUnavailable: 1, FailureThreshold: 10,
		WaveTimeout: 30 * time.Minute, State: store.RolloutRunning, Revision: 1}
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("n%d", i)
		w.s.nodes[id] = store.Node{ID: id, Role: protocol.RoleNode, Pool: "pool_a", SessionID: int64(i), DaemonVersion: "0.1.0", DaemonArch: "amd64"}
		w.s.sessions[int64(i)] = store.Session{ID: int64(i), NodeID: id, ProtocolVersion: 1}
	}
	for i, wave := range AssignWaves(n, waves) {
		r.Nodes = append(r.Nodes, store.RolloutNode{NodeID: fmt.Sprintf("n%d", i+1), Pool: "pool_a", Wave: wave, State: store.RolloutNodePending})
	}
	if mut != nil {
		mut(&r)
	}
	w.s.rollouts["ro_1"] = r
	return w
}

func (w *world) step() {
	w.t.Helper()
	if err := w.c.Step(context.Background()); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) rollout() store.Rollout { return w.s.rollouts["ro_1"] }

func (w *world) node(id string) store.RolloutNode {
	for _, n := range w.rollout().Nodes {
		if n.NodeID == id {
			return n
		}
	}
	w.t.Fatalf("no rollout node %s", id)
	return store.RolloutNode{}
}

// states is every rollout node's state, in order: "n1=updating n2=pending".
func (w *world) states() string {
	var s []string
	for _, n := range w.rollout().Nodes {
		s = append(s, n.NodeID+"="+n.State)
	}
	return strings.Join(s, " ")
}

// rejoin: the node's bcd came back at v.
func (w *world) rejoin(id, v string) {
	n := w.s.nodes[id]
	n.DaemonVersion, n.SessionID = v, n.SessionID+100
	w.s.nodes[id] = n
	w.s.sessions[n.SessionID] = store.Session{ID: n.SessionID, NodeID: id, ProtocolVersion: 1}
}

func (w *world) offline(id string) {
	n := w.s.nodes[id]
	n.SessionID = 0
	w.s.nodes[id] = n
}

func (w *world) section(id, state, reason, msg string) {
	w.s.sections[id+"/"+protocol.SectionDaemon] = store.SectionStatus{NodeID: id, Section: protocol.SectionDaemon, State: state,
		Reason: reason, Message: msg, Version: version, Revision: 2, At: w.now, ReceivedAt: w.now}
}

func (w *world) timeline() string {
	var s []string
	for _, e := range w.rollout().Timeline {
		s = append(s, e.Message)
	}
	return strings.Join(s, "\n")
}

func TestAssignWaves(t *testing.T) {
	for _, c := range []struct {
		n     int
		waves []int
		want  []int
	}{
		{1, []int{1, 10, 50, 100}, []int{1}},
		{2, []int{50, 100}, []int{1, 2}},
		{2, []int{1, 10, 50, 100}, []int{1, 2}},
		{4, []int{1, 10, 50, 100}, []int{1, 2, 3, 4}},
		{10, []int{1, 10, 50, 100}, []int{1, 2, 3, 3, 3, 4, 4, 4, 4, 4}},
		{200, []int{1, 10, 50, 100}, nil},
		{3, []int{100}, []int{1, 1, 1}},
	} {
		got := AssignWaves(c.n, c.waves)
		if c.want == nil {
			// 200 nodes: 2, 18, 80 and 100 per wave.
			count := map[int]int{}
			for _, w := range got {
				count[w]++
			}
			if count[1] != 2 || count[2] != 18 || count[3] != 80 || count[4] != 100 {
				t.Errorf("AssignWaves(200) = %v", count)
			}
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("AssignWaves(%d, %v) = %v, want %v", c.n, c.waves, got, c.want)
		}
	}
}

func TestCheckWaves(t *testing.T) {
	for _, c := range []struct {
		waves []int
		ok    bool
	}{
		{[]int{1, 10, 50, 100}, true}, {[]int{100}, true}, {[]int{50, 100}, true},
		{nil, false}, {[]int{50}, false}, {[]int{50, 50, 100}, false}, {[]int{60, 50, 100}, false}, {[]int{0, 100}, false}, {[]int{50, 101}, false},
	} {
		if err := CheckWaves(c.waves); (err == nil) != c.ok {
			t.Errorf("CheckWaves(%v) = %v, want ok %v", c.waves, err, c.ok)
		}
	}
}

func TestWavesAndSuccess(t *testing.T) {
	w := newWorld(t, 3, []int{1, 50, 100}, func(r *store.Rollout) { r.MaxUnavailable = 5 })
	w.step()
	// Wave 1 is n1 alone: its target is set and pushed.
	if got := w.states(); got != "n1=updating n2=pending n3=pending" {
		t.Fatalf("after the first step: %s", got)
	}
	tgt := w.s.nodes["n1"].DaemonTarget
	want := protocol.DaemonSection{Version: version, URL: "https://cp.test/downloads/bcd/0.1.1/linux-amd64", SHA256: "aa", Signature: `{"manifest":1}`}
	if tgt == nil || *tgt != want {
		t.Fatalf("n1's target = %+v, want %+v", tgt, want)
	}
	if !slices.Equal(w.n.specs, []string{"n1"}) || len(w.n.commands) != 0 {
		t.Errorf("notified specs %v commands %v", w.n.specs, w.n.commands)
	}
	// Nothing happened: no write.
	steps := w.s.steps
	w.now = w.now.Add(time.Minute)
	w.step()
	if w.s.steps != steps {
		t.Errorf("a step with nothing to do wrote")
	}
	// n1 rejoins at the version: it succeeded, wave 2 starts.
	w.rejoin("n1", "v"+version)
	w.step()
	if got := w.states(); got != "n1=succeeded n2=updating n3=pending" {
		t.Fatalf("after n1 rejoined: %s", got)
	}
	w.rejoin("n2", version)
	w.step()
	w.rejoin("n3", version)
	w.step()
	r := w.rollout()
	if r.State != store.RolloutSucceeded || r.Reason != "3 of 3 node(s) run 0.1.1, 0 failed" {
		t.Fatalf("rollout %s %q", r.State, r.Reason)
	}
	for _, line := range []string{"wave 1 of 3 (1%) started: 1 node(s)", "node n1 (pool pool_a, wave 1) started: daemon section set",
		"node n1 succeeded: running 0.1.1", "wave 3 of 3 (100%) started", "succeeded: 3 of 3"} {
		if !strings.Contains(w.timeline(), line) {
			t.Errorf("timeline lacks %q:\n%s", line, w.timeline())
		}
	}
	// Succeeded: it is not stepped again.
	steps = w.s.steps
	w.step()
	if w.s.steps != steps {
		t.Error("a succeeded rollout was stepped")
	}
}

func TestAlreadyAtTheVersionSucceedsAtOnce(t *testing.T) {
	w := newWorld(t, 3, []int{1, 50, 100}, nil)
	w.rejoin("n3", version)
	w.step()
	if got := w.states(); got != "n1=updating n2=pending n3=succeeded" {
		t.Fatalf("states %s", got)
	}
	if w.node("n3").Message != "already running 0.1.1" || w.s.nodes["n3"].DaemonTarget != nil {
		t.Errorf("n3: %+v, target %+v", w.node("n3"), w.s.nodes["n3"].DaemonTarget)
	}
}

func TestBudget(t *testing.T) {
	for _, c := range []struct {
		name    string
		max     int
		offline []string
		want    string
	}{
		{"one at a time", 1, nil, "n1=updating n2=pending n3=pending n4=pending"},
		{"two at a time", 2, nil, "n1=updating n2=updating n3=pending n4=pending"},
		// n4 offline already takes the one place: only offline nodes may
		// start (they are unavailable anyway), here none of the wave.
		{"an offline node takes the place", 1, []string{"n4"}, "n1=pending n2=pending n3=pending n4=updating"},
		{"two offline, budget two", 2, []string{"n3", "n4"}, "n1=pending n2=pending n3=updating n4=updating"},
		{"offline nodes start, online ones wait", 1, []string{"n2"}, "n1=pending n2=updating n3=pending n4=pending"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, 4, []int{100}, func(r *store.Rollout) { r.MaxUnavailable = c.max })
			for _, id := range c.offline {
				w.offline(id)
			}
			w.step()
			if got := w.states(); got != c.want {
				t.Errorf("states %s, want %s", got, c.want)
			}
		})
	}
}

func TestBudgetIsPerPool(t *testing.T) {
	w := newWorld(t, 4, []int{100}, func(r *store.Rollout) {
		r.Nodes[2].Pool, r.Nodes[3].Pool = "pool_b", "pool_b"
	})
	for _, id := range []string{"n3", "n4"} {
		n := w.s.nodes[id]
		n.Pool = "pool_b"
		w.s.nodes[id] = n
	}
	w.step()
	if got := w.states(); got != "n1=updating n2=pending n3=updating n4=pending" {
		t.Errorf("states %s", got)
	}
}

// TestPoolBudgets: a rollout without --max-unavailable keeps each pool
// within its own disruption budget (pools set-policy --max-unavailable),
// 1 for a pool without one; a rollout's own --max-unavailable wins.
func TestPoolBudgets(t *testing.T) {
	for _, c := range []struct {
		name     string
		max      int
		policies []store.PoolPolicy
		want     string
	}{
		{"no budgets set: one per pool", 0, nil, "n1=updating n2=pending n3=pending n4=updating n5=pending n6=pending"},
		{"pool_a's budget of two", 0, []store.PoolPolicy{{Pool: "pool_a", MaxUnavailable: 2}},
			"n1=updating n2=updating n3=pending n4=updating n5=pending n6=pending"},
		{"both pools' budgets", 0, []store.PoolPolicy{{Pool: "pool_a", MaxUnavailable: 3}, {Pool: "pool_b", MaxUnavailable: 2}},
			"n1=updating n2=updating n3=updating n4=updating n5=updating n6=pending"},
		{"an attestor-only policy sets no budget", 0, []store.PoolPolicy{{Pool: "pool_a", JoinAttestors: []string{protocol.AttestorTPM}}},
			"n1=updating n2=pending n3=pending n4=updating n5=pending n6=pending"},
		{"the rollout's --max-unavailable wins", 1, []store.PoolPolicy{{Pool: "pool_a", MaxUnavailable: 3}},
			"n1=updating n2=pending n3=pending n4=updating n5=pending n6=pending"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, 6, []int{100}, func(r *store.Rollout) {
				r.MaxUnavailable = c.max
				for i := 3; i < 6; i++ {
					r.Nodes[i].Pool = "pool_b"
				}
			})
			for _, id := range []string{"n4", "n5", "n6"} {
				n := w.s.nodes[id]
				n.Pool = "pool_b"
				w.s.nodes[id] = n
			}
			w.s.policies = c.policies
			w.step()
			if got := w.states(); got != c.want {
				t.Errorf("states %s, want %s", got, c.want)
			}
		})
	}
}

func TestFailures(t *testing.T) {
	for _, c := range []struct {
		name        string
		happen      func(w *world)
		reason, msg string
		targetKept  bool
		upgradeOnly bool
	}{
		{"section FAILED", func(w *world) {
			w.section("n1", protocol.SectionFailed, protocol.ReasonUpdateFailed, "bcd 0.1.1 did not start")
		},
			protocol.ReasonUpdateFailed, "bcd 0.1.1 did not start", false, false},
		{"section UNSUPPORTED", func(w *world) { w.section("n1", protocol.SectionUnsupported, "", "bcd sim does not self-update") },
			protocol.SectionUnsupported, "bcd sim does not self-update", false, false},
		{"wave timeout", func(w *world) { w.now = w.now.Add(30 * time.Minute) },
			ReasonWaveTimeout, "did not rejoin reporting 0.1.1 within 30m0s (it reports 0.1.0, connected)", false, false},
		{"daemon.upgrade FAILED", func(w *world) {
			id := w.node("n1").CommandID
			c := w.s.commands[id]
			c.State, c.Reason, c.Message = protocol.StateFailed, protocol.CommandReasonReleaseRefused, "RELEASE_UNTRUSTED: …"
			w.s.commands[id] = c
		}, protocol.CommandReasonReleaseRefused, "RELEASE_UNTRUSTED: …", false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, 2, []int{50, 100}, nil)
			if c.upgradeOnly {
				w.c.MinProtocolVersion = 2
			}
			w.step()
			if c.upgradeOnly {
				cmd, ok := w.s.commands[w.node("n1").CommandID]
				var params protocol.DaemonSection
				if !ok || cmd.Kind != protocol.KindDaemonUpgrade || json.Unmarshal(cmd.Params, &params) != nil || params != *w.s.nodes["n1"].DaemonTarget {
					t.Fatalf("upgrade_required: command %+v", cmd)
				}
				if !slices.Equal(w.n.commands, []string{"n1"}) {
					t.Errorf("notified commands %v", w.n.commands)
				}
			} else if w.node("n1").CommandID != "" {
				t.Fatalf("a daemon.upgrade for a session that is not upgrade_required")
			}
			// A FAILED section from before the start does not count.
			w.now = w.now.Add(time.Second)
			c.happen(w)
			w.step()
			n := w.node("n1")
			if n.State != store.RolloutNodeFailed || n.Reason != c.reason || n.Message != c.msg {
				t.Fatalf("n1 = %+v, want failed %s: %s", n, c.reason, c.msg)
			}
			if w.s.nodes["n1"].DaemonTarget != nil {
				t.Errorf("a failed node kept its target")
			}
			r := w.rollout()
			want := fmt.Sprintf("1 of 1 finished nodes failed (100%% > 10%%): node n1: %s: %s", c.reason, c.msg)
			if r.State != store.RolloutPaused || r.Reason != want {
				t.Fatalf("rollout %s %q, want paused %q", r.State, r.Reason, want)
			}
			if !strings.Contains(w.timeline(), "paused: "+want) {
				t.Errorf("timeline:\n%s", w.timeline())
			}
			// Paused: n2 does not start.
			w.step()
			if got := w.states(); got != "n1=failed n2=pending" {
				t.Errorf("paused, states %s", got)
			}
		})
	}
}

func TestAFailedSectionBeforeTheStartDoesNotCount(t *testing.T) {
	w := newWorld(t, 1, []int{100}, nil)
	w.section("n1", protocol.SectionFailed, protocol.ReasonUpdateFailed, "from an earlier rollout")
	w.now = w.now.Add(time.Second)
	w.step()
	w.step()
	if got := w.states(); got != "n1=updating" {
		t.Errorf("states %s", got)
	}
}

func TestResumeAndAbort(t *testing.T) {
	w := newWorld(t, 3, []int{1, 50, 100}, nil)
	w.step()
	w.section("n1", protocol.SectionFailed, protocol.ReasonUpdateFailed, "bcd 0.1.1 did not start")
	w.step()
	if r := w.rollout(); r.State != store.RolloutPaused {
		t.Fatalf("not paused: %s", r.State)
	}
	// Resume (what Service.Act writes): n2 starts; n1 stays failed.
	r := w.rollout()
	r.State, r.Reason = store.RolloutRunning, ""
	w.s.rollouts["ro_1"] = r
	w.step()
	if got := w.states(); got != "n1=failed n2=updating n3=pending" {
		t.Fatalf("resumed: %s", got)
	}
	// A success after the resume does not pause it again, though 1 of 2 is
	// above 10%.
	w.rejoin("n2", version)
	w.step()
	if got, st := w.states(), w.rollout().State; got != "n1=failed n2=succeeded n3=updating" || st != store.RolloutRunning {
		t.Fatalf("after n2: %s, %s", got, st)
	}
	// Abort: n3 keeps its target, nothing more happens.
	r = w.rollout()
	r.State = store.RolloutAborted
	w.s.rollouts["ro_1"] = r
	w.rejoin("n3", version)
	w.step()
	if got := w.states(); got != "n1=failed n2=succeeded n3=updating" || w.s.nodes["n3"].DaemonTarget == nil {
		t.Errorf("aborted: %s, n3 target %+v", got, w.s.nodes["n3"].DaemonTarget)
	}
}

func TestSucceededWithFailures(t *testing.T) {
	w := newWorld(t, 2, []int{100}, func(r *store.Rollout) { r.MaxUnavailable, r.FailureThreshold = 2, 50 })
	w.step()
	w.rejoin("n1", version)
	w.section("n2", protocol.SectionFailed, protocol.ReasonUpdateFailed, "bcd 0.1.1 did not start")
	w.step()
	if r := w.rollout(); r.State != store.RolloutSucceeded || r.Reason != "1 of 2 node(s) run 0.1.1, 1 failed" {
		t.Fatalf("rollout %s %q", r.State, r.Reason)
	}
}

func TestNodesThatCannotStart(t *testing.T) {
	w := newWorld(t, 3, []int{100}, func(r *store.Rollout) { r.MaxUnavailable, r.FailureThreshold = 3, 100 })
	n := w.s.nodes["n1"]
	n.DaemonArch = ""
	w.s.nodes["n1"] = n
	n = w.s.nodes["n2"]
	n.DaemonArch = "arm64"
	w.s.nodes["n2"] = n
	delete(w.s.nodes, "n3")
	w.step()
	for id, reason := range map[string]string{"n1": ReasonArchUnknown, "n2": ReasonReleaseIncomplete, "n3": ReasonNodeDeleted} {
		if got := w.node(id); got.State != store.RolloutNodeFailed || got.Reason != reason {
			t.Errorf("%s = %+v, want failed %s", id, got, reason)
		}
	}
}

func TestAStaleStepIsRetried(t *testing.T) {
	w := newWorld(t, 1, []int{100}, nil)
	w.c.Init()
	w.s.rollouts["ro_1"] = func() store.Rollout { r := w.rollout(); r.Revision = 1; return r }()
	// An operator's pause lands between the read and the write.
	real := w.s.rollouts["ro_1"]
	stale := real
	real.Revision = 2
	real.State = store.RolloutPaused
	w.s.rollouts["ro_1"] = real
	if err := w.c.stepRollout(context.Background(), stale, w.s.nodes, nil); err == nil {
		t.Fatal("a step from a stale revision was written")
	}
	if w.rollout().State != store.RolloutPaused || w.s.nodes["n1"].DaemonTarget != nil {
		t.Errorf("the stale step changed %+v", w.rollout())
	}
}
