package daemonupdate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// ErrExec is what a daemon's Run returns once it has closed everything for a
// swap: the caller then calls Exec.
var ErrExec = errors.New("self-update swapped the binary: exec the entrypoint")

// ReasonUpdated is the reason of a daemon.upgrade's SUCCEEDED.
const ReasonUpdated = "Updated"

// flushWait is how long an update waits for the gateway to acknowledge RUNNING
// before the swap.
const flushWait = 2 * time.Second

// OptionsFor is selfupdate.OptionsFor for a daemon: the download client (the
// proxy from the environment, TLS trusting the system roots and the control
// plane's serving CA), the logger, and in a fakehw build the test timings
// (agent.EnvTestUpdateDeadline, agent.EnvTestUpdateIdle).
func OptionsFor(c *config.Config, configPath string, log *slog.Logger) (selfupdate.Options, error) {
	if abs, err := filepath.Abs(configPath); err == nil {
		configPath = abs
	}
	o := selfupdate.OptionsFor(c, configPath)
	tlsConfig, err := agent.DownloadTLSConfig(c.ServingCASPKIPin)
	if err != nil {
		return o, fmt.Errorf("self-update: %w", err)
	}
	o.HTTPClient = &http.Client{Transport: &http.Transport{
		// The lab's nodes reach the api only through the site agent's proxy.
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 15 * time.Second,
		ForceAttemptHTTP2:   true,
	}}
	o.Deadline = agent.TestDuration(agent.EnvTestUpdateDeadline, 0)
	o.IdleTimeout = agent.TestDuration(agent.EnvTestUpdateIdle, 0)
	o.Logger = log
	return o, nil
}

// ForConfig is New(OptionsFor(c, configPath, log)): the updater bcd node and
// bcd site run. An [update] it cannot work with does not stop the daemon: every
// release is then refused with the reason.
// Each edit, if any, changes the options first (a test's temp unit directory).
func ForConfig(c *config.Config, configPath string, log *slog.Logger, edit ...func(*selfupdate.Options)) *Updater {
	o, err := OptionsFor(c, configPath, log)
	if err != nil {
		return disabled(err, o.Running, log)
	}
	for _, e := range edit {
		if e != nil {
			e(&o)
		}
	}
	return New(o)
}

// Privileged is the half of self-update that keeps the slots and records: a
// *selfupdate.Manager in process on a root node and on a site agent, bcd
// helper's client on an unprivileged node (nodeagent/helper), whose
// Prepare asks the helper to verify and downloads into <data_dir>/staging
// itself, and whose Swap has the helper verify again and install.
type Privileged interface {
	Resume() (selfupdate.Outcome, error)
	Prepare(ctx context.Context, sec protocol.DaemonSection, serverNow time.Time) (*selfupdate.Plan, error)
	Swap(ctx context.Context, p *selfupdate.Plan, commandID string, revision int64) error
	Confirm() (selfupdate.Outcome, error)
	SwapBack(why string) error
	// Exec replaces this process with the entrypoint after a swap.
	Exec() error
}

var _ Privileged = (*selfupdate.Manager)(nil)

// Updater is one daemon's self-update. Make it with New or ForConfig, call Start
// once the session and its journal exist and before the session runs, and wire
// OnWelcome, OnSpec and Upgrade into the session.
type Updater struct {
	m       Privileged
	off     error // why m is nil, or why Resume failed: every release is refused with it
	running string
	log     *slog.Logger
	session *agent.Session
	ctx     context.Context
	exec    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu         sync.Mutex
	serverTime time.Time // the last Welcome's server_time
	welcomedAt time.Time // when it arrived, on the monotonic clock
	pending    *selfupdate.Outcome
	watchdog   *time.Timer
	busy       bool
	queued     *protocol.Spec
	memo       memo
}

// memo is the last daemon section the updater settled (succeeded, refused,
// failed), so that the same one is not applied again at every spec push and
// reconnect. A memo seeded from an outcome has no content: it matches the
// revision and version alone.
type memo struct {
	set        bool
	revision   int64
	version    string
	sum        [32]byte
	hasContent bool
}

func (m memo) matches(revision int64, version string, sum [32]byte) bool {
	return m.set && m.revision == revision && pki.SameVersion(m.version, version) && (!m.hasContent || m.sum == sum)
}

// New makes an updater on a Manager for o. A Manager that cannot be made (a
// bad path in o) leaves the updater refusing every release with the reason.
func New(o selfupdate.Options) *Updater {
	m, err := selfupdate.New(o)
	if err != nil {
		return disabled(err, o.Running, o.Logger)
	}
	return NewWith(m, o.Running, o.Logger)
}

// NewWith makes an updater on p for a process running version running (an
// unprivileged node's: p is bcd helper's client).
func NewWith(p Privileged, running string, log *slog.Logger) *Updater {
	u := disabled(nil, running, log)
	u.m = p
	return u
}

// Disabled is an updater that refuses every release with err: a daemon whose
// self-update cannot work (bcd helper's client could not be made).
func Disabled(err error, running string, log *slog.Logger) *Updater {
	return disabled(err, running, log)
}

func disabled(err error, running string, log *slog.Logger) *Updater {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err != nil {
		log.Error("self-update is off", "error", err.Error())
	}
	return &Updater{off: err, running: running, log: log, exec: make(chan struct{}), ctx: context.Background()}
}

// Start reads upgrade.json (Manager.Resume) with s the daemon's session, not
// yet running: a pending update arms the deadline's watchdog, or swaps back at
// once when the deadline has passed; a swapped-back update is journaled as
// FAILED, for the gateway after the first Welcome. ctx bounds the updates the
// updater runs; it ends when the daemon stops.
func (u *Updater) Start(ctx context.Context, s *agent.Session) {
	u.session, u.ctx = s, ctx
	if u.m == nil {
		return
	}
	out, err := u.m.Resume()
	if err != nil {
		u.off = fmt.Errorf("self-update is off: the records do not read: %w", err)
		u.log.Error("self-update is off", "error", err.Error())
		return
	}
	switch out.State {
	case selfupdate.Pending:
		u.log.Info("self-update: awaiting the first Welcome", "version", out.Version, "deadline", out.Deadline.UTC().Format(time.RFC3339), "detail", out.Message)
		u.mu.Lock()
		u.pending = &out
		wait := time.Until(out.Deadline)
		if wait <= 0 {
			u.pending = nil
			u.mu.Unlock()
			u.swapBack(out, fmt.Sprintf("its deadline %s had passed when bcd %s started", out.Deadline.UTC().Format(time.RFC3339), u.running))
			return
		}
		u.watchdog = time.AfterFunc(wait, func() { u.deadlinePassed(out) })
		u.mu.Unlock()
	case selfupdate.Failed:
		u.reportFailed(out)
	}
}

// deadlinePassed is the watchdog: no Welcome confirmed the update in time.
func (u *Updater) deadlinePassed(out selfupdate.Outcome) {
	u.mu.Lock()
	if u.pending == nil {
		u.mu.Unlock()
		return
	}
	u.pending = nil
	u.mu.Unlock()
	u.swapBack(out, fmt.Sprintf("no Welcome by its deadline %s", out.Deadline.UTC().Format(time.RFC3339)))
}

func (u *Updater) swapBack(out selfupdate.Outcome, why string) {
	if err := u.m.SwapBack(why); err != nil {
		u.log.Error("self-update: the swap back failed; staying on this binary", "version", out.Version, "error", err.Error())
		return
	}
	u.log.Warn("self-update: swapped back; restarting the previous binary", "version", out.Version, "why", why)
	u.requestExec()
}

// reportFailed journals a swapped-back update's end: the daemon section FAILED
// UpdateFailed, and the daemon.upgrade that asked FAILED update-failed.
func (u *Updater) reportFailed(out selfupdate.Outcome) {
	u.log.Warn("self-update: the update was swapped back", "version", out.Version, "detail", out.Message)
	if out.CommandID != "" {
		u.status(protocol.Status{CommandID: out.CommandID, State: protocol.StateFailed, Reason: protocol.CommandReasonUpdateFailed, Message: out.Message})
	}
	if out.Revision > 0 {
		u.section(out.Revision, out.Version, protocol.SectionFailed, protocol.ReasonUpdateFailed, out.Message)
	}
	// The spec that asked for it arrives again with the Welcome: it was
	// reported, and is not taken as a new refusal.
	u.mu.Lock()
	u.memo = memo{set: true, revision: out.Revision, version: out.Version}
	u.mu.Unlock()
}

// OnWelcome is the session's OnWelcome: it notes the server time for Prepare's
// expiry check and confirms a pending update run by its new binary.
func (u *Updater) OnWelcome(ctx context.Context, w protocol.Welcome, first bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.serverTime, u.welcomedAt = w.ServerTime, time.Now()
	p := u.pending
	if p == nil || !pki.SameVersion(p.Version, u.running) {
		return // nothing to confirm, or an old binary that the deadline swaps back
	}
	out, err := u.m.Confirm()
	if err != nil {
		u.log.Error("self-update: the confirmation failed; the deadline will swap back", "version", p.Version, "error", err.Error())
		return
	}
	u.pending = nil
	if u.watchdog != nil {
		u.watchdog.Stop()
	}
	if out.State != selfupdate.Confirmed {
		u.log.Warn("self-update: nothing to confirm", "version", p.Version, "state", string(out.State))
		return
	}
	u.log.Info("self-update: confirmed on the first Welcome", "version", out.Version, "detail", out.Message)
	if out.CommandID != "" {
		u.status(protocol.Status{CommandID: out.CommandID, State: protocol.StateSucceeded, Reason: ReasonUpdated, Message: out.Message})
	}
	if out.Revision > 0 {
		u.section(out.Revision, out.Version, protocol.SectionSucceeded, "", out.Message)
	}
	u.memo = memo{set: true, revision: out.Revision, version: out.Version}
}

// serverNow is the server's clock: the last Welcome's server_time plus the
// monotonic time since. Zero before any Welcome.
func (u *Updater) serverNow() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.welcomedAt.IsZero() || u.serverTime.IsZero() {
		return time.Time{}
	}
	return u.serverTime.Add(time.Since(u.welcomedAt))
}

// OnSpec is the session's OnSpec for the daemon section. It runs on the
// session's reader, so the update itself runs on a goroutine of its own; a
// spec that arrives meanwhile waits for it.
func (u *Updater) OnSpec(ctx context.Context, spec protocol.Spec) {
	raw, ok := spec.Sections[protocol.SectionDaemon]
	if !ok {
		return
	}
	sum := sha256.Sum256(raw)
	var sec protocol.DaemonSection
	decodeErr := json.Unmarshal(raw, &sec)
	u.mu.Lock()
	switch {
	case u.execRequested():
		u.mu.Unlock()
		return
	case u.memo.matches(spec.Revision, sec.Version, sum):
		u.mu.Unlock()
		return
	case u.busy:
		u.queued = &spec
		u.mu.Unlock()
		u.log.Info("self-update: an update is under way; the new daemon section waits for it", "revision", spec.Revision)
		return
	}
	if decodeErr != nil {
		u.memo = memo{set: true, revision: spec.Revision, version: sec.Version, sum: sum, hasContent: true}
		u.mu.Unlock()
		u.section(spec.Revision, "", protocol.SectionFailed, protocol.ReasonReleaseRefused,
			selfupdate.CodeSectionInvalid+": the daemon section does not decode: "+decodeErr.Error())
		return
	}
	u.busy = true
	u.mu.Unlock()
	u.wg.Go(func() {
		defer u.idle()
		u.applySection(spec.Revision, sec, sum)
	})
}

// idle ends an update that did not exec, and applies a spec that waited for it.
func (u *Updater) idle() {
	u.mu.Lock()
	u.busy = false
	q := u.queued
	u.queued = nil
	u.mu.Unlock()
	if q != nil && u.ctx.Err() == nil {
		u.OnSpec(u.ctx, *q)
	}
}

func (u *Updater) applySection(revision int64, sec protocol.DaemonSection, sum [32]byte) {
	settle := func() {
		u.mu.Lock()
		u.memo = memo{set: true, revision: revision, version: sec.Version, sum: sum, hasContent: true}
		u.mu.Unlock()
	}
	if pki.SameVersion(sec.Version, u.running) {
		settle()
		u.section(revision, sec.Version, protocol.SectionSucceeded, "", fmt.Sprintf("bcd %s is running", u.running))
		return
	}
	if u.off != nil {
		settle()
		u.section(revision, sec.Version, protocol.SectionFailed, protocol.ReasonReleaseRefused, u.off.Error())
		return
	}
	u.section(revision, sec.Version, protocol.SectionRunning, "", fmt.Sprintf("updating bcd %s to %s", u.running, sec.Version))
	err := u.update(sec, "", revision)
	switch {
	case err == nil:
		// Swapped: the new binary reports SUCCEEDED once welcomed.
	case errors.Is(err, errNothingToDo):
		settle()
		u.section(revision, sec.Version, protocol.SectionSucceeded, "", fmt.Sprintf("bcd %s is running", u.running))
	default:
		if retryable(err) {
			// Not remembered: the next spec push tries again.
		} else {
			settle()
		}
		reason := protocol.ReasonUpdateFailed
		if _, ok := selfupdate.IsRefusal(err); ok {
			reason = protocol.ReasonReleaseRefused
		}
		u.section(revision, sec.Version, protocol.SectionFailed, reason, err.Error())
	}
}

var errNothingToDo = errors.New("already running that version")

// retryable is a failure worth trying again at the next push of the same
// section: a download that did not complete, or another update still pending.
func retryable(err error) bool {
	r, ok := selfupdate.IsRefusal(err)
	if !ok {
		return true // the host's fault (a disk, a lock), not the release's
	}
	return r.Code == selfupdate.CodeDownloadFailed || r.Code == selfupdate.CodeUpdatePending
}

// update verifies, stages and swaps; after nil the daemon must exec, and
// ExecRequested is closed.
func (u *Updater) update(sec protocol.DaemonSection, commandID string, revision int64) error {
	plan, err := u.m.Prepare(u.ctx, sec, u.serverNow())
	if err != nil {
		return err
	}
	if plan == nil {
		return errNothingToDo
	}
	// RUNNING reaches the gateway now if it can, before the deadline starts
	// counting; the journal replays it after the Welcome either way.
	fctx, cancel := context.WithTimeout(u.ctx, flushWait)
	_ = u.session.Flush(fctx)
	cancel()
	if err := u.m.Swap(u.ctx, plan, commandID, revision); err != nil {
		return err
	}
	u.log.Warn("self-update: swapped; closing everything to exec the new binary", "from", u.running, "to", plan.Version, "sequence", plan.Sequence)
	u.requestExec()
	return nil
}

// Upgrade is the daemon.upgrade handler: RUNNING before the swap, then the
// exec; the new binary reports SUCCEEDED once welcomed (self-terminating, like
// node.reboot). A refused release is FAILED release-refused.
func (u *Updater) Upgrade(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error {
	var sec protocol.DaemonSection
	if err := json.Unmarshal(cmd.Params, &sec); err != nil {
		return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.CommandReasonReleaseRefused,
			Message: selfupdate.CodeSectionInvalid + ": the daemon.upgrade params do not decode: " + err.Error()})
	}
	if pki.SameVersion(sec.Version, u.running) {
		return report(protocol.Status{State: protocol.StateSucceeded, Reason: ReasonUpdated, Message: fmt.Sprintf("bcd %s is running", u.running)})
	}
	if u.off != nil {
		return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.CommandReasonReleaseRefused, Message: u.off.Error()})
	}
	u.mu.Lock()
	if u.busy || u.execRequested() {
		u.mu.Unlock()
		return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.CommandReasonUpdateFailed,
			Message: selfupdate.CodeUpdatePending + ": another update is under way; one update at a time"})
	}
	u.busy = true
	u.mu.Unlock()
	defer u.idle()
	if err := report(protocol.Status{State: protocol.StateRunning, Message: fmt.Sprintf("updating bcd %s to %s", u.running, sec.Version)}); err != nil {
		return err
	}
	err := u.update(sec, cmd.ID, 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNothingToDo):
		return report(protocol.Status{State: protocol.StateSucceeded, Reason: ReasonUpdated, Message: fmt.Sprintf("bcd %s is running", u.running)})
	}
	reason := protocol.CommandReasonUpdateFailed
	if _, ok := selfupdate.IsRefusal(err); ok {
		reason = protocol.CommandReasonReleaseRefused
	}
	return report(protocol.Status{State: protocol.StateFailed, Reason: reason, Message: err.Error()})
}

func (u *Updater) section(revision int64, version, state, reason, msg string) {
	st := protocol.SectionStatus{Section: protocol.SectionDaemon, Revision: revision, State: state, Reason: reason, Message: msg, Version: version}
	if err := u.session.ReportSection(st); err != nil {
		u.log.Error("could not journal the daemon section's status", "state", state, "error", err.Error())
	}
}

func (u *Updater) status(st protocol.Status) {
	if err := u.session.ReportStatus(st); err != nil {
		u.log.Error("could not journal a daemon.upgrade status", "command_id", st.CommandID, "error", err.Error())
	}
}

func (u *Updater) requestExec() { u.once.Do(func() { close(u.exec) }) }

func (u *Updater) execRequested() bool {
	select {
	case <-u.exec:
		return true
	default:
		return false
	}
}

// ExecRequested is closed when the daemon must close everything, return
// ErrExec from Run, and have Exec called: a swap, or a swap back.
func (u *Updater) ExecRequested() <-chan struct{} { return u.exec }

// Wait stops the watchdog and waits for a running update to end; the daemon
// calls it after its session stopped and before its journal closes.
func (u *Updater) Wait() {
	u.mu.Lock()
	if u.watchdog != nil && !u.execRequested() {
		u.watchdog.Stop()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// Exec replaces the process with the entrypoint, which runs the slot current
// points at. Only after ErrExec, when everything is closed.
func (u *Updater) Exec() error {
	if u.m == nil || !u.execRequested() {
		return errors.New("self-update: no swap to exec")
	}
	return u.m.Exec()
}
