package rollouts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// DefaultTick is how often the Controller looks at every active rollout
// when nothing woke it.
const DefaultTick = 5 * time.Second

// maxNamedFailures bounds the failed nodes a pause's reason names.
const maxNamedFailures = 3

// Store is what the Controller reads and writes.
type Store interface {
	ListActiveRollouts(ctx context.Context) ([]store.Rollout, error)
	GetRelease(ctx context.Context, version string) (store.Release, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	GetSession(ctx context.Context, id int64) (store.Session, error)
	GetCommand(ctx context.Context, id string) (store.Command, error)
	GetSectionStatus(ctx context.Context, nodeID, section string) (store.SectionStatus, error)
	ListPoolPolicies(ctx context.Context) ([]store.PoolPolicy, error)
	StepRollout(ctx context.Context, s store.RolloutStep) error
}

// Controller moves every running or paused rollout on (see the package
// doc). It is a singleton: one per control plane. Run it; the gateway tells
// it what changed (SessionChanged, StatusApplied, SectionChanged) and the
// Service kicks it after an operator's change.
type Controller struct {
	Store Store
	// Notifier reaches sessions: a target pushed as a spec, a command
	// delivered. nil leaves both to the node's next session.
	Notifier Notifier
	// MinProtocolVersion is the gateway's: a session below it is
	// upgrade_required and gets daemon.upgrade. 0 means protocol.MinVersion.
	MinProtocolVersion int
	// Tick is how often every active rollout is looked at; 0 means
	// DefaultTick.
	Tick time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	wake chan struct{}
}

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Controller) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Init makes the Controller ready to be kicked; Run calls it.
func (c *Controller) Init() {
	if c.wake == nil {
		c.wake = make(chan struct{}, 1)
	}
}

// Kick asks for a step of every active rollout soon. It never blocks.
func (c *Controller) Kick() {
	if c.wake == nil {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// StatusApplied: a command's status was stored (a daemon.upgrade's).
func (c *Controller) StatusApplied(nodeID, commandID string) { c.Kick() }

// SessionChanged: a node's session opened or closed.
func (c *Controller) SessionChanged(nodeID string) { c.Kick() }

// SectionChanged: a node reported on a section of its spec.
func (c *Controller) SectionChanged(nodeID, section string) { c.Kick() }

// Run steps the active rollouts at once, at every Tick and when kicked,
// until ctx is done.
func (c *Controller) Run(ctx context.Context) {
	c.Init()
	tick := c.Tick
	if tick <= 0 {
		tick = DefaultTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		if err := c.Step(ctx); err != nil && ctx.Err() == nil {
			c.log().Error("rollouts: a step failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
	}
}

// Step looks at every active rollout once.
func (c *Controller) Step(ctx context.Context) error {
	rs, err := c.Store.ListActiveRollouts(ctx)
	if err != nil || len(rs) == 0 {
		return err
	}
	nodes, err := c.Store.ListNodes(ctx)
	if err != nil {
		return err
	}
	byID := make(map[string]store.Node, len(nodes))
	for _, n := range nodes {
		byID[n.ID] = n
	}
	var errs []error
	for _, r := range rs {
		err := c.stepRollout(ctx, r, byID, nodes)
		if errors.Is(err, store.ErrRolloutChanged) {
			// An operator's pause or abort came first: look again.
			c.Kick()
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rollout %s: %w", r.ID, err))
		}
	}
	return errors.Join(errs...)
}

// stepper is one step of one rollout being worked out.
type stepper struct {
	c     *Controller
	r     store.Rollout
	rel   store.Release
	now   time.Time
	step  store.RolloutStep
	nodes map[string]store.Node
	// changed are the indexes in r.Nodes the step changed.
	changed map[int]bool
	failed  bool
}

func (st *stepper) event(format string, args ...any) {
	st.step.Timeline = append(st.step.Timeline, store.RolloutEvent{At: st.now, Message: fmt.Sprintf(format, args...)})
}

func (st *stepper) finish(i int, state, reason, msg string) {
	n := &st.r.Nodes[i]
	n.State, n.Reason, n.Message, n.FinishedAt = state, reason, msg, st.now
	st.changed[i] = true
	if state == store.RolloutNodeFailed {
		st.failed = true
		st.event("node %s failed: %s: %s", n.NodeID, reason, msg)
		if !n.StartedAt.IsZero() {
			st.step.Targets = append(st.step.Targets, store.DaemonTarget{NodeID: n.NodeID, IfVersion: st.r.Version})
		}
		return
	}
	st.event("node %s succeeded: %s", n.NodeID, msg)
}

func connectedAt(n store.Node, version string) bool {
	return n.SessionID != 0 && pki.SameVersion(n.DaemonVersion, version)
}

func (c *Controller) stepRollout(ctx context.Context, r store.Rollout, byID map[string]store.Node, all []store.Node) error {
	rel, err := c.Store.GetRelease(ctx, r.Version)
	if err != nil {
		return err
	}
	now := c.now()
	st := &stepper{c: c, r: r, rel: rel, now: now, nodes: byID, changed: map[int]bool{},
		step: store.RolloutStep{RolloutID: r.ID, Revision: r.Revision, State: r.State, Reason: r.Reason, At: now}}
	for i, n := range r.Nodes {
		node, ok := byID[n.NodeID]
		switch n.State {
		case store.RolloutNodePending:
			if !ok {
				st.finish(i, store.RolloutNodeFailed, ReasonNodeDeleted, "the node was deleted")
			} else if connectedAt(node, r.Version) {
				st.finish(i, store.RolloutNodeSucceeded, "", "already running "+r.Version)
			}
		case store.RolloutNodeUpdating:
			if err := st.judge(ctx, i, node, ok); err != nil {
				return err
			}
		}
	}
	// The outcomes first: a rollout they pause starts no node.
	if st.failed {
		st.checkThreshold()
	}
	if st.step.State == store.RolloutRunning {
		st.failed = false
		if err := st.start(ctx, all); err != nil {
			return err
		}
		if st.failed {
			st.checkThreshold()
		}
	}
	if st.step.State == store.RolloutRunning && st.allFinished() {
		ok, failed := st.counts()
		st.step.State = store.RolloutSucceeded
		st.step.Reason = fmt.Sprintf("%d of %d node(s) run %s, %d failed", ok, len(r.Nodes), r.Version, failed)
		st.event("succeeded: %s", st.step.Reason)
	}
	if len(st.changed) == 0 && st.step.State == r.State {
		return nil
	}
	for i := range st.changed {
		st.step.Nodes = append(st.step.Nodes, st.r.Nodes[i])
	}
	if err := c.Store.StepRollout(ctx, st.step); err != nil {
		return err
	}
	for _, ev := range st.step.Timeline {
		c.log().Info("rollout "+r.ID+": "+ev.Message, "rollout", r.ID, "version", r.Version)
	}
	if c.Notifier != nil {
		for _, t := range st.step.Targets {
			c.Notifier.NodeSpecChanged(t.NodeID)
		}
		for _, cmd := range st.step.Commands {
			c.Notifier.Notify(cmd.NodeID)
		}
	}
	return nil
}

// judge decides whether the updating node i has succeeded or failed.
func (st *stepper) judge(ctx context.Context, i int, node store.Node, ok bool) error {
	n := st.r.Nodes[i]
	v := st.r.Version
	if !ok {
		st.finish(i, store.RolloutNodeFailed, ReasonNodeDeleted, "the node was deleted")
		return nil
	}
	if connectedAt(node, v) {
		st.finish(i, store.RolloutNodeSucceeded, "", "running "+v)
		return nil
	}
	sec, err := st.c.Store.GetSectionStatus(ctx, n.NodeID, protocol.SectionDaemon)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return err
	case (sec.State == protocol.SectionFailed || sec.State == protocol.SectionUnsupported) && !sec.ReceivedAt.Before(n.StartedAt) &&
		(pki.SameVersion(sec.Version, v) || sec.Version == "" && sec.State == protocol.SectionUnsupported):
		st.finish(i, store.RolloutNodeFailed, orWord(sec.Reason, sec.State), sec.Message)
		return nil
	}
	if n.CommandID != "" {
		cmd, err := st.c.Store.GetCommand(ctx, n.CommandID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if cmd.State == protocol.StateFailed || cmd.State == protocol.StateUnsupported {
			st.finish(i, store.RolloutNodeFailed, orWord(cmd.Reason, cmd.State), cmd.Message)
			return nil
		}
	}
	if !st.now.Before(n.StartedAt.Add(st.r.WaveTimeout)) {
		where := "offline"
		if node.SessionID != 0 {
			where = "connected"
		}
		st.finish(i, store.RolloutNodeFailed, ReasonWaveTimeout, fmt.Sprintf("did not rejoin reporting %s within %s (it reports %s, %s)",
			v, st.r.WaveTimeout, orWord(node.DaemonVersion, "no version"), where))
	}
	return nil
}

func orWord(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

// start starts the pending nodes of the current wave that the pools'
// budgets allow.
func (st *stepper) start(ctx context.Context, all []store.Node) error {
	wave := 0
	for _, n := range st.r.Nodes {
		if !store.RolloutNodeTerminal(n.State) && (wave == 0 || n.Wave < wave) {
			wave = n.Wave
		}
	}
	if wave == 0 {
		return nil
	}
	// unavailable: per pool, the nodes updating and the pool's nodes of the
	// role that are offline.
	unavailable := map[string]map[string]bool{}
	mark := func(pool, node string) {
		if unavailable[pool] == nil {
			unavailable[pool] = map[string]bool{}
		}
		unavailable[pool][node] = true
	}
	for _, n := range all {
		if n.Role == st.r.Role && n.SessionID == 0 {
			mark(n.Pool, n.ID)
		}
	}
	budgets, err := st.budgets(ctx)
	if err != nil {
		return err
	}
	begun := false
	for _, n := range st.r.Nodes {
		if n.State == store.RolloutNodeUpdating {
			mark(n.Pool, n.NodeID)
		}
		if n.Wave == wave && !n.StartedAt.IsZero() {
			begun = true
		}
	}
	for i, n := range st.r.Nodes {
		if n.Wave != wave || n.State != store.RolloutNodePending {
			continue
		}
		if !unavailable[n.Pool][n.NodeID] && len(unavailable[n.Pool]) >= budgets(n.Pool) {
			continue
		}
		if !begun {
			begun = true
			count := 0
			for _, m := range st.r.Nodes {
				if m.Wave == wave {
					count++
				}
			}
			st.event("wave %d of %d (%d%%) started: %d node(s)", wave, len(st.r.Waves), st.r.Waves[wave-1], count)
		}
		if err := st.startNode(ctx, i); err != nil {
			return err
		}
		if st.r.Nodes[i].State == store.RolloutNodeUpdating {
			mark(n.Pool, n.NodeID)
		}
	}
	return nil
}

// budgets returns each pool's disruption budget for this rollout: its
// --max-unavailable when it was given one, else the pool's policy
// (pools set-policy --max-unavailable), else DefaultMaxUnavailable.
func (st *stepper) budgets(ctx context.Context) (func(pool string) int, error) {
	if st.r.MaxUnavailable > 0 {
		return func(string) int { return st.r.MaxUnavailable }, nil
	}
	policies, err := st.c.Store.ListPoolPolicies(ctx)
	if err != nil {
		return nil, fmt.Errorf("rollout %s: pools' disruption budgets: %w", st.r.ID, err)
	}
	byPool := make(map[string]int, len(policies))
	for _, p := range policies {
		byPool[p.Pool] = p.MaxUnavailable
	}
	return func(pool string) int {
		if b := byPool[pool]; b > 0 {
			return b
		}
		return DefaultMaxUnavailable
	}, nil
}

func (st *stepper) startNode(ctx context.Context, i int) error {
	n := &st.r.Nodes[i]
	node := st.nodes[n.NodeID]
	if node.DaemonArch == "" {
		st.finish(i, store.RolloutNodeFailed, ReasonArchUnknown,
			"the node has not reported its architecture (daemon_arch, from a bcd that has self-update)")
		return nil
	}
	b, ok := st.rel.Binary(node.DaemonArch)
	if !ok {
		st.finish(i, store.RolloutNodeFailed, ReasonReleaseIncomplete, fmt.Sprintf("release %s has no binary for linux/%s", st.rel.Version, node.DaemonArch))
		return nil
	}
	sec := protocol.DaemonSection{Version: st.rel.Version, URL: st.rel.BinaryURL(node.DaemonArch), SHA256: b.SHA256, Signature: st.rel.Manifest}
	st.step.Targets = append(st.step.Targets, store.DaemonTarget{NodeID: n.NodeID, Section: &sec})
	n.State, n.StartedAt = store.RolloutNodeUpdating, st.now
	st.changed[i] = true
	how := "daemon section set"
	if node.SessionID != 0 {
		se, err := st.c.Store.GetSession(ctx, node.SessionID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && se.ProtocolVersion < orMin(st.c.MinProtocolVersion) {
			params, err := json.Marshal(sec)
			if err != nil {
				return err
			}
			cmd := store.Command{ID: ids.New(ids.PrefixCommand, st.now), NodeID: n.NodeID, Kind: protocol.KindDaemonUpgrade, Params: params,
				State: store.CommandPending, CreatedAt: st.now, UpdatedAt: st.now}
			st.step.Commands = append(st.step.Commands, cmd)
			n.CommandID = cmd.ID
			how = fmt.Sprintf("daemon section set, and %s %s sent (its session speaks protocol %d, below %d)", protocol.KindDaemonUpgrade, cmd.ID,
				se.ProtocolVersion, orMin(st.c.MinProtocolVersion))
		}
	}
	st.event("node %s (pool %s, wave %d) started: %s", n.NodeID, n.Pool, n.Wave, how)
	return nil
}

func orMin(v int) int {
	if v <= 0 {
		return protocol.MinVersion
	}
	return v
}

func (st *stepper) counts() (succeeded, failed int) {
	for _, n := range st.r.Nodes {
		switch n.State {
		case store.RolloutNodeSucceeded:
			succeeded++
		case store.RolloutNodeFailed:
			failed++
		}
	}
	return succeeded, failed
}

func (st *stepper) allFinished() bool {
	for _, n := range st.r.Nodes {
		if !store.RolloutNodeTerminal(n.State) {
			return false
		}
	}
	return true
}

// checkThreshold pauses the rollout when failed/finished is above its
// failure threshold.
func (st *stepper) checkThreshold() {
	if st.step.State != store.RolloutRunning {
		return
	}
	ok, failed := st.counts()
	finished := ok + failed
	if finished == 0 || failed*100 <= st.r.FailureThreshold*finished {
		return
	}
	var named []string
	for _, n := range st.r.Nodes {
		if n.State == store.RolloutNodeFailed {
			if len(named) == maxNamedFailures {
				named = append(named, fmt.Sprintf("and %d more", failed-maxNamedFailures))
				break
			}
			s := "node " + n.NodeID + ": " + n.Reason
			if n.Message != "" {
				s += ": " + n.Message
			}
			named = append(named, s)
		}
	}
	st.step.State = store.RolloutPaused
	st.step.Reason = fmt.Sprintf("%d of %d finished nodes failed (%d%% > %d%%): %s", failed, finished, failed*100/finished,
		st.r.FailureThreshold, strings.Join(named, "; "))
	st.event("paused: %s", st.step.Reason)
}
