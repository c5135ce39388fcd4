package apitype

import "time"

// ReleaseAdd is the body of POST /api/v1/releases: a signed manifest.json,
// verified under serve's --release-pins, and where its binaries are
// served (URLBase/downloads/bcd/<version>/linux-<arch>; https).
type ReleaseAdd struct {
	Manifest string `json:"manifest"`
	URLBase  string `json:"url_base"`
}

// ReleaseBinary is one bare binary of a release.
type ReleaseBinary struct {
	Arch   string `json:"arch"`
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	URL    string `json:"url"`
}

// Release is a release the operator added. The manifest is not in it.
type Release struct {
	Version  string          `json:"version"`
	Product  string          `json:"product"`
	Sequence int64           `json:"sequence"`
	Expires  time.Time       `json:"expires"`
	URLBase  string          `json:"url_base"`
	Binaries []ReleaseBinary `json:"binaries"`
	AddedAt  time.Time       `json:"added_at"`
	// Added is, in the answer to ReleaseAdd, whether the release was new
	// (false: the same manifest was added before).
	Added bool `json:"added,omitempty"`
}

// ReleaseList answers GET /api/v1/releases, highest sequence first.
type ReleaseList struct {
	Releases []Release `json:"releases"`
}

// Rollout states and rollout node states.
const (
	RolloutRunning   = "running"
	RolloutPaused    = "paused"
	RolloutSucceeded = "succeeded"
	RolloutAborted   = "aborted"

	RolloutNodePending   = "pending"
	RolloutNodeUpdating  = "updating"
	RolloutNodeSucceeded = "succeeded"
	RolloutNodeFailed    = "failed"
)

// RolloutCreate is the body of POST /api/v1/rollouts. Zero values mean
// the defaults: role node, any pool and site, waves 1,10,50,100, max
// unavailable 1, failure threshold 10 (nil), wave timeout 30m.
type RolloutCreate struct {
	Version          string `json:"version"`
	Role             string `json:"role,omitempty"`
	Pool             string `json:"pool,omitempty"`
	Site             string `json:"site,omitempty"`
	Waves            []int  `json:"waves,omitempty"`
	MaxUnavailable   int    `json:"max_unavailable,omitempty"`
	FailureThreshold *int   `json:"failure_threshold,omitempty"`
	// WaveTimeout is a Go duration (30m).
	WaveTimeout string `json:"wave_timeout,omitempty"`
}

// RolloutNode is one node of a rollout.
type RolloutNode struct {
	Node    string `json:"node"`
	Pool    string `json:"pool"`
	Wave    int    `json:"wave"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// CommandID is the daemon.upgrade the rollout sent the node, when its
	// session was upgrade_required.
	CommandID  string    `json:"command_id,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// RolloutEvent is one line of a rollout's timeline.
type RolloutEvent struct {
	At      time.Time `json:"at"`
	Message string    `json:"message"`
}

// Rollout is a rollout. Nodes and Timeline are nil in a RolloutList.
type Rollout struct {
	ID               string `json:"id"`
	Version          string `json:"version"`
	Role             string `json:"role"`
	Pool             string `json:"pool"`
	Site             string `json:"site"`
	Waves            []int  `json:"waves"`
	MaxUnavailable   int    `json:"max_unavailable"`
	FailureThreshold int    `json:"failure_threshold"`
	// WaveTimeout is a Go duration (30m0s).
	WaveTimeout string         `json:"wave_timeout"`
	State       string         `json:"state"`
	Reason      string         `json:"reason"`
	CreatedAt   time.Time      `json:"created_at"`
	UpdatedAt   time.Time      `json:"updated_at"`
	Nodes       []RolloutNode  `json:"nodes,omitempty"`
	Timeline    []RolloutEvent `json:"timeline,omitempty"`
}

// RolloutList answers GET /api/v1/rollouts, newest first.
type RolloutList struct {
	Rollouts []Rollout `json:"rollouts"`
}

// NodeUpgrade is the body of POST /api/v1/nodes/{id}/upgrade: a release
// added (Version), or a manifest the control plane checks only for its
// form (the node verifies it under its own pins) with the binary's URL
// (default URLBase/downloads/bcd/<version>/linux-<arch>).
type NodeUpgrade struct {
	Version  string `json:"version,omitempty"`
	Manifest string `json:"manifest,omitempty"`
	URL      string `json:"url,omitempty"`
	URLBase  string `json:"url_base,omitempty"`
}

// SectionStatus is a node's latest report on a section of its spec.
type SectionStatus struct {
	State    string `json:"state"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
	Version  string `json:"version"`
	Revision int64  `json:"revision"`
}
