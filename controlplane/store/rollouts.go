package store

import (
	"context"
	"errors"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// ErrRolloutChanged: a write of a rollout step named a revision of the
// rollout that is no longer its current one (another step, a pause or an
// abort came first).
var ErrRolloutChanged = errors.New("rollout changed meanwhile")

// Rollout states (Rollout.State).
const (
	RolloutRunning   = "running"
	RolloutPaused    = "paused"
	RolloutSucceeded = "succeeded"
	RolloutAborted   = "aborted"
)

// Rollout node states (RolloutNode.State).
const (
	RolloutNodePending   = "pending"
	RolloutNodeUpdating  = "updating"
	RolloutNodeSucceeded = "succeeded"
	RolloutNodeFailed    = "failed"
)

// RolloutActive reports whether a rollout in state may still change its
// nodes' targets: running or paused.
func RolloutActive(state string) bool { return state == RolloutRunning || state == RolloutPaused }

// RolloutNodeTerminal reports whether a rollout node's state is final.
func RolloutNodeTerminal(state string) bool {
	return state == RolloutNodeSucceeded || state == RolloutNodeFailed
}

// Release is a signed bcd release the operator added: its manifest
// verified under the operator's release pins when it was added.
type Release struct {
	// Version is the release's version without a leading v (0.1.1).
	Version  string    `json:"version"`
	Product  string    `json:"product"`
	Sequence int64     `json:"sequence"`
	Expires  time.Time `json:"expires"`
	// Manifest is manifest.json verbatim: what nodes verify.
	Manifest string `json:"manifest"`
	// URLBase is where the binaries are served: the binary for arch is at
	// URLBase/downloads/bcd/<version>/linux-<arch>.
	URLBase string `json:"url_base"`
	// Binaries are the release's bare binaries for linux, by arch.
	Binaries []ReleaseBinary `json:"binaries"`
	AddedAt  time.Time       `json:"added_at"`
}

// ReleaseBinary is one bare binary of a release.
type ReleaseBinary struct {
	// Arch is a GOARCH: amd64 or arm64.
	Arch   string `json:"arch"`
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Binary returns the release's binary for arch.
func (r Release) Binary(arch string) (ReleaseBinary, bool) {
	for _, b := range r.Binaries {
		if b.Arch == arch {
			return b, true
		}
	}
	return ReleaseBinary{}, false
}

// BinaryURL is where the release's binary for arch is downloaded from.
func (r Release) BinaryURL(arch string) string {
	return r.URLBase + "/downloads/bcd/" + r.Version + "/linux-" + arch
}

// SectionStatus is the latest report of a node on one section of its
// spec (protocol.SectionStatus), with the node and when it was made.
type SectionStatus struct {
	NodeID   string `json:"node_id"`
	Section  string `json:"section"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	Version  string `json:"version,omitempty"`
	Revision int64  `json:"revision"`
	// At is when the agent made the report (its event's time): of two
	// reports of one revision the later wins, so a replay of an older one
	// changes nothing.
	At time.Time `json:"updated_at"`
	// ReceivedAt is when the control plane stored it.
	ReceivedAt time.Time `json:"received_at"`
}

// Rollout is a release rolled out to a set of nodes wave by wave.
type Rollout struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	// Role, Pool and Site select the nodes: Role is node or site; an empty
	// Pool or Site means any.
	Role string `json:"role"`
	Pool string `json:"pool"`
	Site string `json:"site"`
	// Waves are cumulative percentages of the nodes, rising, the last 100.
	Waves []int `json:"waves"`
	// MaxUnavailable bounds a pool's nodes updating or offline at once.
	MaxUnavailable int `json:"max_unavailable"`
	// FailureThreshold is the percentage of finished nodes that may fail
	// before the rollout pauses.
	FailureThreshold int `json:"failure_threshold"`
	// WaveTimeout is how long a node has to rejoin at the version.
	WaveTimeout time.Duration `json:"wave_timeout"`
	State       string        `json:"state"`
	Reason      string        `json:"reason,omitempty"`
	// Revision grows with every write of the rollout: a step names the
	// revision it read (ErrRolloutChanged otherwise).
	Revision  int64     `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Nodes and Timeline are filled in by GetRollout and
	// ListActiveRollouts (Nodes only), not by ListRollouts.
	Nodes    []RolloutNode  `json:"nodes,omitempty"`
	Timeline []RolloutEvent `json:"timeline,omitempty"`
}

// RolloutNode is one node of a rollout.
type RolloutNode struct {
	NodeID string `json:"node"`
	Pool   string `json:"pool"`
	// Wave is the node's wave, from 1.
	Wave    int    `json:"wave"`
	State   string `json:"state"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// CommandID is the daemon.upgrade sent to the node, "" for none.
	CommandID  string    `json:"command_id,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// RolloutEvent is one line of a rollout's timeline.
type RolloutEvent struct {
	At      time.Time `json:"at"`
	Message string    `json:"message"`
}

// DaemonTarget sets or clears a node's daemon target.
type DaemonTarget struct {
	NodeID string
	// Section is the target; nil clears it.
	Section *protocol.DaemonSection
	// IfVersion, when clearing, clears only a target of that version (a
	// later rollout's target is left alone).
	IfVersion string
}

// RolloutStep is what one step of a rollout writes, in one transaction.
type RolloutStep struct {
	RolloutID string
	// Revision is the rollout's revision the step read.
	Revision int64
	// State and Reason are the rollout's after the step.
	State, Reason string
	// Nodes are the rollout's nodes the step changed.
	Nodes []RolloutNode
	// Timeline is appended.
	Timeline []RolloutEvent
	// Targets are set or cleared; each moves the node's spec revision on.
	Targets []DaemonTarget
	// Commands are created (a daemon.upgrade).
	Commands []Command
	At       time.Time
}

// ActiveRolloutError is CreateRollout's refusal of a rollout whose nodes
// overlap those of a running or paused one.
type ActiveRolloutError struct{ Rollout Rollout }

func (e *ActiveRolloutError) Error() string {
	return "rollout " + e.Rollout.ID + " of " + e.Rollout.Version + " is " + e.Rollout.State + " for an overlapping set of nodes"
}

// Is makes errors.Is(err, ErrExists) hold.
func (e *ActiveRolloutError) Is(target error) bool { return target == ErrExists }

// Releases holds the releases the operator added.
type Releases interface {
	// AddRelease stores r and reports whether it was new. The same
	// manifest again is not an error (added false, the stored release
	// returned); another manifest for a stored version is ErrExists.
	AddRelease(ctx context.Context, r Release) (Release, bool, error)
	// GetRelease returns the release of version (a leading v ignored).
	GetRelease(ctx context.Context, version string) (Release, error)
	// ListReleases returns every release, highest sequence first.
	ListReleases(ctx context.Context) ([]Release, error)
}

// Daemons holds what nodes report of their daemon and what they should
// run.
type Daemons interface {
	// SetDaemonTarget sets or clears a node's daemon target and moves its
	// spec revision on (ErrNotFound, ErrNodeDeleted). A clear with
	// IfVersion that finds another target changes nothing.
	SetDaemonTarget(ctx context.Context, t DaemonTarget, at time.Time) (Node, error)
	// ApplySectionStatus records a node's report on a section unless a
	// newer one is stored (a higher revision, or the same revision made
	// later); it reports whether it did.
	ApplySectionStatus(ctx context.Context, s SectionStatus) (bool, error)
	// GetSectionStatus returns the node's latest report on section.
	GetSectionStatus(ctx context.Context, nodeID, section string) (SectionStatus, error)
	// ListSectionStatuses returns every node's latest report on section.
	ListSectionStatuses(ctx context.Context, section string) ([]SectionStatus, error)
}

// Rollouts holds rollouts, their nodes and timelines.
type Rollouts interface {
	// CreateRollout writes a rollout with its nodes and timeline. A
	// running or paused rollout of the same role whose pool and site
	// overlap (equal, or either empty) refuses it: *ActiveRolloutError.
	CreateRollout(ctx context.Context, r Rollout) error
	// GetRollout returns a rollout with its nodes and timeline.
	GetRollout(ctx context.Context, id string) (Rollout, error)
	// ListRollouts returns every rollout, newest first, without nodes or
	// timeline.
	ListRollouts(ctx context.Context) ([]Rollout, error)
	// ListActiveRollouts returns the running and paused rollouts with
	// their nodes, oldest first.
	ListActiveRollouts(ctx context.Context) ([]Rollout, error)
	// StepRollout writes a step (ErrRolloutChanged when the rollout's
	// revision is not s.Revision, ErrNotFound for no rollout).
	StepRollout(ctx context.Context, s RolloutStep) error
}
