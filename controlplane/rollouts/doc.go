// Package rollouts is how the control plane upgrades bcd without a person
// (spec "From v0.4: rollouts and self-update"): the releases the operator
// adds, verified under the operator's release pins; a daemon.upgrade sent
// to one node; and rollouts, which set the daemon section of a set of nodes
// wave by wave within each pool's disruption budget.
//
// The control plane only names a release: every node verifies the signed
// manifest under its own [update] release pins before it takes a binary,
// so nothing here can hand a node a binary it would not take anyway. The
// pins here stop an operator from rolling out what the fleet will refuse.
//
// # A rollout
//
// Its nodes are the nodes, not deleted, of the role (node or site) in the
// pool and site given (empty: any), sorted by id when it is created. The
// waves are cumulative percentages of them (1,10,50,100 by default): wave k
// holds the nodes up to ceil(n*pct_k/100), and at least one node more than
// wave k-1 while nodes are left. The Controller moves it on:
//
//   - A pending node that is connected and reports the version succeeds at
//     once, whatever its wave.
//   - The next wave starts only when every node of the waves before it is
//     succeeded or failed. In a wave, a node starts only while its pool has
//     fewer than max_unavailable nodes unavailable: the rollout's nodes
//     updating and the pool's nodes of the role that are not connected.
//   - Starting a node sets its daemon target (the release's URL and
//     SHA-256 for its arch, the manifest as signature), which moves its
//     spec revision on and is pushed to its session. A node whose session
//     is below the gateway's minimum protocol version (upgrade_required)
//     accepts only daemon.upgrade: it is also sent one with the same
//     DaemonSection.
//   - An updating node succeeds when it is connected reporting the version;
//     it fails when its daemon section reports FAILED or UNSUPPORTED for the
//     version after it started, when its daemon.upgrade ends FAILED or
//     UNSUPPORTED, or when the wave timeout passes (WaveTimeout). A failed
//     node's target is cleared: it keeps running what it runs.
//   - When a node fails and failed/finished exceeds failure_threshold
//     percent, the rollout pauses with a reason naming the failed nodes.
//     Only a failure pauses it: after a resume, the nodes that finish
//     successfully do not pause it again, the next failure does.
//   - Paused, no node starts; updating nodes still finish. Resumed, it goes
//     on (failed nodes stay failed). Aborted, nothing more happens: nodes
//     updating keep their target.
//   - Running with every node finished, it succeeded (with failed nodes
//     counted in the reason).
//
// Only one running or paused rollout may cover a node: a rollout of the
// same role whose pool and site overlap (equal, or either any) is refused
// until the other succeeds or is aborted.
//
// Each step of a rollout is one store transaction (store.RolloutStep): the
// nodes' states, their targets, the commands and the timeline go together,
// and a step from a stale read of the rollout is refused and run again.
package rollouts
