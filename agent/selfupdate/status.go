package selfupdate

import (
	"errors"
	"io/fs"
	"time"
)

// Status is what `bcd update -o json` prints. It is read without the lock
// and without writing anything, so it works on a host that never updated
// and for a reader that may not create the lock file.
type Status struct {
	SlotsDir   string `json:"slots_dir"`
	Entrypoint string `json:"entrypoint"`
	// EntrypointTarget is where the entrypoint links; "" when it is a plain
	// file (not adopted yet) or missing.
	EntrypointTarget string `json:"entrypoint_target"`
	// EntrypointLinked is whether the entrypoint links to <SlotsDir>/current,
	// what bcd doctor fails without once the slots are in use.
	EntrypointLinked bool `json:"entrypoint_linked"`
	// Current and Previous are the slots the links point at: "a", "b" or ""
	// (no such link yet).
	Current  string          `json:"current"`
	Previous string          `json:"previous"`
	Slots    map[string]Slot `json:"slots"`
	// Floor is the release floor: [update] release_sequence or update.json's,
	// the higher.
	Floor   int64           `json:"floor"`
	Pending *PendingUpdate  `json:"pending"`
	Failed  []FailedVersion `json:"failed"`
}

// InUse reports whether the slots hold a binary: from then on the entrypoint
// must link to current.
func (s Status) InUse() bool { return s.Current != "" || len(s.Slots) > 0 }

// PendingUpdate is upgrade.json, as Status shows it.
type PendingUpdate struct {
	Version   string    `json:"version"`
	Sequence  int64     `json:"sequence"`
	ToSlot    string    `json:"to_slot"`
	FromSlot  string    `json:"from_slot"`
	Deadline  time.Time `json:"deadline"`
	CommandID string    `json:"command_id"`
	// SwappedBack is set when the update was undone and the old binary has
	// not recorded it yet.
	SwappedBack *SwappedBack `json:"swapped_back,omitempty"`
}

// Status reads the slots and records.
func (m *Manager) Status() (Status, error) {
	st := Status{SlotsDir: m.o.SlotsDir, Entrypoint: m.o.Entrypoint, Failed: []FailedVersion{}}
	link, err := m.entrypointLink()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Status{}, err
	}
	st.EntrypointTarget, st.EntrypointLinked = link.target, link.linked
	if st.Current, err = m.linkedSlot(CurrentLink); err != nil {
		return Status{}, err
	}
	if st.Previous, err = m.linkedSlot(PreviousLink); err != nil {
		return Status{}, err
	}
	slots, err := m.readSlots()
	if err != nil {
		return Status{}, err
	}
	st.Slots = slots.Slots
	update, err := m.readUpdate()
	if err != nil {
		return Status{}, err
	}
	st.Floor = m.floor(update)
	if update.Failed != nil {
		st.Failed = update.Failed
	}
	up, ok, err := m.readUpgrade()
	if err != nil {
		return Status{}, err
	}
	if ok {
		st.Pending = &PendingUpdate{
			Version: up.Version, Sequence: up.Sequence, ToSlot: up.ToSlot, FromSlot: up.FromSlot,
			Deadline: up.Deadline, CommandID: up.CommandID, SwappedBack: up.SwappedBack,
		}
	}
	return st, nil
}

// ClearFailed empties update.json's failed list (bcd update --clear-failed)
// and returns how many versions it cleared.
func (m *Manager) ClearFailed() (int, error) {
	unlock, err := m.lock()
	if err != nil {
		return 0, err
	}
	defer unlock()
	update, err := m.readUpdate()
	if err != nil {
		return 0, err
	}
	n := len(update.Failed)
	if n == 0 {
		return 0, nil
	}
	update.Failed = nil
	if err := m.writeUpdate(update); err != nil {
		return 0, err
	}
	m.log.Info("self-update: cleared the failed versions", "count", n)
	return n, nil
}
