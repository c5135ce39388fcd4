package protocol

// The daemon section and daemon.upgrade: which bcd release an agent should
// run (spec "From v0.4: rollouts and self-update", "Self-update"). The
// control plane only names the release; the agent takes it only when the
// signed manifest verifies under its own [update] release pins.

// SectionDaemon is the daemon section of a node's or site agent's spec:
// a DaemonSection.
const SectionDaemon = "daemon"

// DaemonSection is NodeSpec.daemon, and the params of daemon.upgrade.
type DaemonSection struct {
	// Version is the release to run (0.1.1; a leading v is ignored).
	Version string `json:"version"`
	// URL is where the bare binary bcd_<version>_<os>_<arch> for this
	// agent's platform is; it must be https://.
	URL string `json:"url"`
	// SHA256 is the binary's lowercase hex SHA-256; the manifest must list
	// the binary with the same digest.
	SHA256 string `json:"sha256"`
	// Signature is the release's signed manifest.json, verbatim.
	Signature string `json:"signature"`
}

// EventSectionStatus is the kind of the Event in which an agent reports how
// it applies a section of its spec: its Data is a SectionStatus. Events are
// journaled and replayed, so the last report reaches the control plane
// even across a restart or a self-update.
const EventSectionStatus = "section.status"

// Section states: the command states, read for a section. A section an
// agent does not apply (the daemon section on bcd ramdisk or bcd sim)
// stays SectionUnsupported.
const (
	SectionRunning     = StateRunning
	SectionSucceeded   = StateSucceeded
	SectionFailed      = StateFailed
	SectionUnsupported = StateUnsupported
)

// SectionStatus is an agent's report on one section of its spec.
type SectionStatus struct {
	// Section is the section's name (SectionDaemon).
	Section string `json:"section"`
	// Revision is the spec revision the report is about.
	Revision int64 `json:"revision"`
	// State is one of the Section* states.
	State string `json:"state"`
	// Reason is a CamelCase word for a FAILED or UNSUPPORTED state
	// (ReasonUpdateFailed, ReasonReleaseRefused).
	Reason string `json:"reason,omitempty"`
	// Message says what happened, for an operator.
	Message string `json:"message,omitempty"`
	// Version is, for the daemon section, the release the report is about.
	Version string `json:"version,omitempty"`
}

// Reasons of a daemon section's and a daemon.upgrade's FAILED state.
const (
	// ReasonUpdateFailed (section) and CommandReasonUpdateFailed
	// (daemon.upgrade): the new binary did not reach its first Welcome by
	// the deadline, or crash-looped, and the agent swapped back.
	ReasonUpdateFailed        = "UpdateFailed"
	CommandReasonUpdateFailed = "update-failed"
	// ReasonReleaseRefused (section) and CommandReasonReleaseRefused
	// (daemon.upgrade): the agent refused the release before swapping
	// anything (no release pins, an untrusted, mismatched, expired or
	// rolled-back manifest, a binary that does not match, a version that
	// failed before); the message starts with the RELEASE_* code.
	ReasonReleaseRefused        = "ReleaseRefused"
	CommandReasonReleaseRefused = "release-refused"
)
