package selfupdate

import (
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/bcd/pki"
)

// OutcomeState is what Resume and Confirm found.
type OutcomeState string

const (
	// None: no update is under way.
	None OutcomeState = "none"
	// Pending: this process runs the new version and awaits its first
	// Welcome; Outcome.Deadline says until when (already past: swap back at
	// once).
	Pending OutcomeState = "pending"
	// Failed: the update was swapped back (by the deadline, the rollback
	// unit, or current no longer points at the new slot); the version is now
	// in update.json's failed list and upgrade.json is gone. Report FAILED
	// with ReasonUpdateFailed for Revision and CommandID.
	Failed OutcomeState = "failed"
	// Confirmed: Confirm raised the floor and removed upgrade.json; report
	// the daemon section (and a daemon.upgrade's CommandID) SUCCEEDED.
	Confirmed OutcomeState = "confirmed"
)

// Outcome is an update's fate, for the caller to report.
type Outcome struct {
	State       OutcomeState
	Version     string
	FromVersion string
	CommandID   string
	Message     string
	Sequence    int64
	Revision    int64
	Deadline    time.Time
}

func outcomeOf(state OutcomeState, up upgradeRecord, msg string) Outcome {
	return Outcome{
		State: state, Version: up.Version, FromVersion: up.FromVersion, CommandID: up.CommandID,
		Message: msg, Sequence: up.Sequence, Revision: up.Revision, Deadline: up.Deadline,
	}
}

// DidNotStart is the reason recorded for a version that was swapped back
// (spec: "bcd X did not start").
func DidNotStart(version string) string { return "bcd " + version + " did not start" }

// Resume reads upgrade.json at start. Which binary this is comes from
// Options.Running and where current points, never from the executable's
// path.
func (m *Manager) Resume() (Outcome, error) {
	unlock, err := m.lock()
	if err != nil {
		return Outcome{}, err
	}
	defer unlock()
	up, current, ok, err := m.pending()
	if err != nil || !ok {
		return Outcome{State: None}, err
	}
	if up.SwappedBack == nil && current == up.ToSlot {
		msg := fmt.Sprintf("bcd %s awaits its first Welcome until %s", up.Version, up.Deadline.UTC().Format(time.RFC3339))
		if !pki.SameVersion(m.o.Running, up.Version) {
			// The swap happened but this process is not the new binary (its
			// exec failed, or it was started from elsewhere): it cannot
			// confirm, so the deadline swaps back.
			msg = fmt.Sprintf("bcd %s is swapped in but this process runs %s; it swaps back at %s",
				up.Version, m.o.Running, up.Deadline.UTC().Format(time.RFC3339))
		}
		return outcomeOf(Pending, up, msg), nil
	}
	return m.recordFailed(up)
}

// pending reads upgrade.json and the slot current points at; ok is false
// when no update is under way.
func (m *Manager) pending() (up upgradeRecord, current string, ok bool, err error) {
	up, ok, err = m.readUpgrade()
	if err != nil || !ok {
		return upgradeRecord{}, "", false, err
	}
	current, err = m.linkedSlot(CurrentLink)
	if err != nil {
		return upgradeRecord{}, "", false, err
	}
	return up, current, true, nil
}

// recordFailed moves a swapped-back update from upgrade.json to update.json's
// failed list. update.json is written first: a crash in between leaves
// upgrade.json, and the next Resume records the same failure once.
func (m *Manager) recordFailed(up upgradeRecord) (Outcome, error) {
	update, err := m.readUpdate()
	if err != nil {
		return Outcome{}, err
	}
	reason := DidNotStart(up.Version)
	msg := reason
	if up.SwappedBack != nil && up.SwappedBack.Why != "" {
		msg += ": " + up.SwappedBack.Why
	}
	if _, ok := failedBefore(update, up.Version); !ok {
		update.Failed = append(update.Failed, FailedVersion{Version: up.Version, Reason: reason, At: m.now().UTC()})
		if n := len(update.Failed); n > maxFailed {
			update.Failed = update.Failed[n-maxFailed:]
		}
		if err := m.writeUpdate(update); err != nil {
			return Outcome{}, err
		}
	}
	if err := removeRecord(m.upgradePath()); err != nil {
		return Outcome{}, err
	}
	m.log.Warn("self-update: recorded a failed update", "version", up.Version, "why", msg)
	return outcomeOf(Failed, up, msg), nil
}

// Confirm is the new binary's first Welcome: the floor rises to the
// release's sequence and upgrade.json goes; a confirmed update is never
// undone. Without upgrade.json it returns None: nothing to confirm.
func (m *Manager) Confirm() (Outcome, error) {
	unlock, err := m.lock()
	if err != nil {
		return Outcome{}, err
	}
	defer unlock()
	up, current, ok, err := m.pending()
	if err != nil || !ok {
		return Outcome{State: None}, err
	}
	if up.SwappedBack != nil || current != up.ToSlot {
		return Outcome{}, fmt.Errorf("selfupdate: cannot confirm bcd %s: it was swapped back", up.Version)
	}
	if !pki.SameVersion(m.o.Running, up.Version) {
		return Outcome{}, fmt.Errorf("selfupdate: cannot confirm bcd %s from bcd %s: only the new binary confirms itself", up.Version, m.o.Running)
	}
	update, err := m.readUpdate()
	if err != nil {
		return Outcome{}, err
	}
	if up.Sequence > update.Floor {
		update.Floor = up.Sequence
		if err := m.writeUpdate(update); err != nil {
			return Outcome{}, err
		}
	}
	if err := removeRecord(m.upgradePath()); err != nil {
		return Outcome{}, err
	}
	m.log.Info("self-update: confirmed", "version", up.Version, "floor", max(update.Floor, m.o.ConfigFloor))
	return outcomeOf(Confirmed, up, fmt.Sprintf("bcd %s confirmed; the release floor is %d", up.Version, max(update.Floor, m.o.ConfigFloor))), nil
}

// SwapBack undoes an update that saw no Welcome by its deadline: current
// goes back to the old slot and upgrade.json is kept, marked with why, for
// the old binary's Resume. The caller then Execs.
func (m *Manager) SwapBack(why string) error {
	unlock, err := m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	up, ok, err := m.readUpgrade()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("selfupdate: swap back: no update awaits its Welcome (upgrade.json is gone: a confirmed update is never undone)")
	}
	return m.swapBack(up, why)
}

// swapBack moves current first, then marks upgrade.json: a crash between the
// two still reads as a swap back, by where current points.
func (m *Manager) swapBack(up upgradeRecord, why string) error {
	if err := m.link(CurrentLink, up.FromSlot); err != nil {
		return err
	}
	if up.SwappedBack == nil {
		up.SwappedBack = &SwappedBack{Why: why, At: m.now().UTC()}
		if err := m.writeUpgrade(up); err != nil {
			return err
		}
	}
	m.log.Warn("self-update: swapped back", "version", up.Version, "to", SlotFile(up.FromSlot), "why", why)
	return nil
}

// RollbackWhy is what Rollback marks upgrade.json with.
const RollbackWhy = "bcd.service crash-looped; bcd-rollback.service restored the previous slot"

// Rollback is `bcd update --rollback`, run by bcd-rollback.service: only
// while upgrade.json exists and current points at its new slot does it move
// current back to the old slot and mark upgrade.json. It reports whether it
// did anything; a confirmed update (no upgrade.json) is never undone.
func (m *Manager) Rollback() (bool, error) {
	unlock, err := m.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	up, current, ok, err := m.pending()
	if err != nil || !ok {
		return false, err
	}
	if current != up.ToSlot {
		return false, nil
	}
	if err := m.swapBack(up, RollbackWhy); err != nil {
		return false, err
	}
	return true, nil
}
