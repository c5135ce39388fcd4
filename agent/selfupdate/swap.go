package selfupdate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
)

// Swap is steps 2–4: it adopts the entrypoint if needed, copies the plan's
// binary into the other slot (checking size and digest again as it writes),
// writes upgrade.json with the deadline, under systemd the rollback unit,
// and then points previous at the old slot and current at the new one.
// After nil the caller closes everything and calls Exec. On an error nothing
// is swapped: current still points at the old slot.
func (m *Manager) Swap(ctx context.Context, p *Plan, commandID string, revision int64) error {
	if p == nil {
		return errors.New("selfupdate: swap: no plan")
	}
	unlock, err := m.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if up, ok, err := m.readUpgrade(); err != nil {
		return err
	} else if ok {
		return refuse(CodeUpdatePending, "an update to bcd %s awaits its first Welcome (%s); one update at a time", up.Version, m.upgradePath())
	}
	update, err := m.readUpdate()
	if err != nil {
		return err
	}
	if f, ok := failedBefore(update, p.Version); ok {
		return refuse(CodeFailedBefore, "bcd %s failed on this host at %s (%s)", p.Version, f.At.UTC().Format(time.RFC3339), f.Reason)
	}
	if p.Sequence < m.floor(update) {
		return &Refusal{Code: pki.ErrReleaseRollback.Error(), Err: pki.ErrReleaseRollback,
			Message: fmt.Sprintf("bcd %s has sequence %d, below the release floor %d", p.Version, p.Sequence, m.floor(update))}
	}
	if err := m.ensureSlotsDir(); err != nil {
		return err
	}
	if err := m.adopt(); err != nil {
		return err
	}
	from, err := m.linkedSlot(CurrentLink)
	if err != nil {
		return err
	}
	if from == "" {
		return refuse(CodeSlotsRefused, "%s does not exist after adopting the entrypoint", filepath.Join(m.o.SlotsDir, CurrentLink))
	}
	to := otherSlot(from)
	slots, err := m.readSlots()
	if err != nil {
		return err
	}
	if p.FromSlot != "" {
		if err := m.checkOtherSlot(p, to, slots); err != nil {
			return err
		}
	} else {
		written, err := m.installStaged(p, to)
		if err != nil {
			return err
		}
		written.Version, written.Sequence = p.Version, p.Sequence
		slots.Slots[to] = written
		if err := m.writeSlots(slots); err != nil {
			return err
		}
	}
	if m.o.Systemd {
		if err := m.writeRollbackUnit(ctx); err != nil {
			return err
		}
	}
	fromVersion := m.o.Running
	if s, ok := slots.Slots[from]; ok {
		fromVersion = s.Version
	}
	now := m.now()
	up := upgradeRecord{
		Version: p.Version, Sequence: p.Sequence, FromSlot: from, ToSlot: to, FromVersion: fromVersion,
		Deadline: now.Add(m.o.Deadline).UTC(), CommandID: commandID, Revision: revision, Started: now.UTC(),
	}
	if err := m.writeUpgrade(up); err != nil {
		return err
	}
	if err := m.link(PreviousLink, from); err != nil {
		return m.undoUpgrade(err)
	}
	// The commit point: from here a start of the entrypoint runs the new
	// binary, which finds upgrade.json.
	if err := m.link(CurrentLink, to); err != nil {
		return m.undoUpgrade(err)
	}
	m.log.Info("self-update: swapped", "version", p.Version, "from", SlotFile(from), "to", SlotFile(to), "deadline", up.Deadline)
	return nil
}

// undoUpgrade removes upgrade.json after a swap that did not reach its
// commit point, so that the old binary does not record a failure.
func (m *Manager) undoUpgrade(cause error) error {
	if err := removeRecord(m.upgradePath()); err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// checkOtherSlot makes sure the slot a manifest-less plan takes still holds
// what slots.json says: the version, and the bytes recorded.
func (m *Manager) checkOtherSlot(p *Plan, to string, slots slotsRecord) error {
	rec, ok := slots.Slots[to]
	if p.FromSlot != to || !ok || !pki.SameVersion(rec.Version, p.Version) || rec.Sequence != p.Sequence {
		return refuse(CodeSlotsRefused, "slot %s no longer holds bcd %s as prepared", SlotFile(to), p.Version)
	}
	got, err := m.hashSlot(to)
	if err != nil {
		return err
	}
	if got.SHA256 != rec.SHA256 || got.Size != rec.Size {
		return refuse(CodeDigestMismatch, "slot %s: %d bytes with sha256 %s, slots.json recorded %d bytes with %s",
			SlotFile(to), got.Size, got.SHA256, rec.Size, rec.SHA256)
	}
	return nil
}

// installStaged copies the staged binary into slot and removes it from
// staging. It opens the file beneath the staging directory's parent with
// os.Root (so no path outside it is reached), refuses a symlinked staging
// directory, opens with O_NOFOLLOW|O_NONBLOCK (a FIFO cannot hang it) and
// takes only a regular file with one link (a hard link to another file
// could change under it).
func (m *Manager) installStaged(p *Plan, slot string) (Slot, error) {
	root, err := os.OpenRoot(m.o.DataDir)
	if err != nil {
		return Slot{}, fmt.Errorf("selfupdate: %w", err)
	}
	defer root.Close()
	dirInfo, err := root.Lstat(StagingDir)
	if err != nil {
		return Slot{}, refuse(CodeStagingRefused, "the staging directory: %v", err)
	}
	if !dirInfo.IsDir() {
		return Slot{}, refuse(CodeStagingRefused, "the staging directory %s is not a directory (%s)",
			filepath.Join(m.o.DataDir, StagingDir), dirInfo.Mode().Type())
	}
	staging, err := root.OpenRoot(StagingDir)
	if err != nil {
		return Slot{}, refuse(CodeStagingRefused, "the staging directory: %v", err)
	}
	defer staging.Close()
	// The directory opened must be the one checked: a swap for a symlink in
	// between is caught here.
	if opened, err := staging.Stat("."); err != nil || !os.SameFile(opened, dirInfo) {
		return Slot{}, refuse(CodeStagingRefused, "the staging directory %s changed while it was opened", filepath.Join(m.o.DataDir, StagingDir))
	}
	path := filepath.Join(m.o.DataDir, StagingDir, p.Staged)
	li, err := staging.Lstat(p.Staged)
	if err != nil {
		return Slot{}, refuse(CodeStagingRefused, "the staged file: %v", err)
	}
	if li.Mode()&fs.ModeSymlink != 0 {
		return Slot{}, refuse(CodeStagingRefused, "the staged file %s is a symlink", path)
	}
	f, err := staging.OpenFile(p.Staged, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return Slot{}, refuse(CodeStagingRefused, "the staged file: %v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Slot{}, fmt.Errorf("selfupdate: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Slot{}, refuse(CodeStagingRefused, "the staged file %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if !os.SameFile(fi, li) {
		return Slot{}, refuse(CodeStagingRefused, "the staged file %s changed while it was opened", path)
	}
	if err := secretfile.OneLink(path, fi); err != nil {
		return Slot{}, refuse(CodeStagingRefused, "the staged file %v", err)
	}
	if m.o.CheckStagedOwner {
		if uid := ownerOf(fi); uid != int64(m.o.StagedOwner) {
			return Slot{}, refuse(CodeStagingRefused, "the staged file %s is owned by uid %d, not the node's uid %d", path, uid, m.o.StagedOwner)
		}
	}
	written, err := m.writeSlot(io.Reader(f), slot, p.Size, p.SHA256)
	if err != nil {
		return Slot{}, err
	}
	if err := staging.Remove(p.Staged); err != nil {
		m.log.Warn("self-update: could not remove the staged file", "path", path, "err", err)
	}
	return written, nil
}

// Exec replaces this process with the entrypoint, which now runs the new
// slot. The caller has closed its connections and files.
func (m *Manager) Exec() error {
	err := syscall.Exec(m.o.Entrypoint, os.Args, os.Environ())
	return fmt.Errorf("selfupdate: exec %s: %w", m.o.Entrypoint, err)
}
