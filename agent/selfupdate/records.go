package selfupdate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
)

// The names of the host's files (spec "Files on the host").
const (
	SlotsFile    = "slots.json"
	UpgradeFile  = "upgrade.json"
	UpdateFile   = "update.json"
	LockFile     = "update.lock"
	StagingDir   = "staging"
	CurrentLink  = "current"
	PreviousLink = "previous"
	// SlotA and SlotB name the slots in the records; their files are
	// SlotFile(SlotA) = bcd-a and bcd-b.
	SlotA = "a"
	SlotB = "b"
)

// Modes of what self-update writes.
const (
	slotsDirMode   fs.FileMode = 0o755
	binaryMode     fs.FileMode = 0o755
	slotsJSONMode  fs.FileMode = 0o644
	recordMode     fs.FileMode = 0o600
	recordsDirMode fs.FileMode = 0o700
	stagingMode    fs.FileMode = 0o700
)

// maxRecordSize bounds a record read back: a few hundred bytes each, so a
// file that is larger was not written by bcd.
const maxRecordSize = 64 << 10

// maxFailed bounds update.json's failed list; the oldest entries go first.
const maxFailed = 32

// SlotFile is the file name of a slot: bcd-a or bcd-b.
func SlotFile(slot string) string { return "bcd-" + slot }

func otherSlot(slot string) string {
	if slot == SlotA {
		return SlotB
	}
	return SlotA
}

func validSlot(s string) bool { return s == SlotA || s == SlotB }

var hexSHA256 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// builtVersionRE is what a slot's version may be: the adopted binary's own
// version.Version, which is "dev" or a -X value for a build that was not a
// release, so not always a semantic version.
var builtVersionRE = regexp.MustCompile(`^[0-9A-Za-z][0-9A-Za-z.+_-]{0,127}$`)

// Slot is what slots.json records of one slot.
type Slot struct {
	// Version is the bcd version written into the slot.
	Version string `json:"version"`
	// Sequence is its release's manifest sequence; 0 = unknown (an adopted
	// binary on a host installed without release_sequence).
	Sequence int64 `json:"sequence"`
	// SHA256 and Size are of the bytes written into the slot.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// slotsRecord is slots.json.
type slotsRecord struct {
	Slots map[string]Slot `json:"slots"`
}

// SwappedBack marks an upgrade.json whose update was undone before it
// confirmed.
type SwappedBack struct {
	Why string    `json:"why"`
	At  time.Time `json:"at"`
}

// upgradeRecord is upgrade.json: an update that awaits its first Welcome.
type upgradeRecord struct {
	Version     string       `json:"version"`
	Sequence    int64        `json:"sequence"`
	FromSlot    string       `json:"from_slot"`
	ToSlot      string       `json:"to_slot"`
	FromVersion string       `json:"from_version"`
	Deadline    time.Time    `json:"deadline"`
	CommandID   string       `json:"command_id,omitempty"`
	Revision    int64        `json:"revision"`
	Started     time.Time    `json:"started"`
	SwappedBack *SwappedBack `json:"swapped_back,omitempty"`
}

// FailedVersion is one entry of update.json's failed list.
type FailedVersion struct {
	Version string    `json:"version"`
	Reason  string    `json:"reason"`
	At      time.Time `json:"at"`
}

// updateRecord is update.json.
type updateRecord struct {
	// Floor is the release floor: the highest sequence that confirmed.
	Floor  int64           `json:"floor"`
	Failed []FailedVersion `json:"failed"`
}

// decodeStrict decodes one JSON object, refusing unknown members and
// trailing data: a record bcd did not write is an error, not a guess.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the JSON object")
	}
	return nil
}

func parseSlots(data []byte) (slotsRecord, error) {
	var r slotsRecord
	if err := decodeStrict(data, &r); err != nil {
		return slotsRecord{}, err
	}
	for name, s := range r.Slots {
		if !validSlot(name) {
			return slotsRecord{}, fmt.Errorf("slot %q: want %q or %q", name, SlotA, SlotB)
		}
		if err := s.validate(); err != nil {
			return slotsRecord{}, fmt.Errorf("slot %s: %w", name, err)
		}
	}
	if r.Slots == nil {
		r.Slots = map[string]Slot{}
	}
	return r, nil
}

func (s Slot) validate() error {
	switch {
	case !builtVersionRE.MatchString(s.Version):
		return fmt.Errorf("version %q is not a version", s.Version)
	case s.Sequence < 0:
		return fmt.Errorf("negative sequence %d", s.Sequence)
	case !hexSHA256.MatchString(s.SHA256):
		return errors.New("sha256 is not 64 lowercase hex digits")
	case s.Size < 0:
		return fmt.Errorf("negative size %d", s.Size)
	}
	return nil
}

func parseUpgrade(data []byte) (upgradeRecord, error) {
	var r upgradeRecord
	if err := decodeStrict(data, &r); err != nil {
		return upgradeRecord{}, err
	}
	switch {
	case !pki.ValidReleaseVersion(r.Version):
		return upgradeRecord{}, fmt.Errorf("version %q is not a semantic version", r.Version)
	case r.FromVersion != "" && !builtVersionRE.MatchString(r.FromVersion):
		return upgradeRecord{}, fmt.Errorf("from_version %q is not a version", r.FromVersion)
	case r.Sequence < 0:
		return upgradeRecord{}, fmt.Errorf("negative sequence %d", r.Sequence)
	case !validSlot(r.FromSlot) || !validSlot(r.ToSlot) || r.FromSlot == r.ToSlot:
		return upgradeRecord{}, fmt.Errorf("from_slot %q and to_slot %q: want %q and %q, one each", r.FromSlot, r.ToSlot, SlotA, SlotB)
	case r.Deadline.IsZero():
		return upgradeRecord{}, errors.New("no deadline")
	}
	return r, nil
}

func parseUpdate(data []byte) (updateRecord, error) {
	var r updateRecord
	if err := decodeStrict(data, &r); err != nil {
		return updateRecord{}, err
	}
	if r.Floor < 0 {
		return updateRecord{}, fmt.Errorf("negative floor %d", r.Floor)
	}
	for i, f := range r.Failed {
		if !pki.ValidReleaseVersion(f.Version) {
			return updateRecord{}, fmt.Errorf("failed[%d]: version %q is not a semantic version", i, f.Version)
		}
	}
	return r, nil
}

// readRecord reads and parses one record; a missing file is the zero record
// and false. A symlink, a FIFO or an oversized file is refused without
// waiting on it; every error names the file.
func readRecord[T any](path string, parse func([]byte) (T, error)) (T, bool, error) {
	var zero T
	data, err := secretfile.Read(path, secretfile.Options{Limit: maxRecordSize, NoFollow: true})
	if errors.Is(err, fs.ErrNotExist) {
		return zero, false, nil
	}
	if err != nil {
		return zero, false, fmt.Errorf("selfupdate: %s: %w", path, err)
	}
	r, err := parse(data)
	if err != nil {
		return zero, false, fmt.Errorf("selfupdate: %s: %w", path, err)
	}
	return r, true, nil
}

func writeRecord(path string, v any, mode fs.FileMode) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("selfupdate: %s: %w", path, err)
	}
	if err := pki.WriteFileAtomic(path, append(data, '\n'), mode); err != nil {
		return fmt.Errorf("selfupdate: %w", err)
	}
	return nil
}

func (m *Manager) slotsPath() string   { return filepath.Join(m.o.SlotsDir, SlotsFile) }
func (m *Manager) upgradePath() string { return filepath.Join(m.o.RecordsDir, UpgradeFile) }
func (m *Manager) updatePath() string  { return filepath.Join(m.o.RecordsDir, UpdateFile) }

func (m *Manager) readSlots() (slotsRecord, error) {
	r, _, err := readRecord(m.slotsPath(), parseSlots)
	if r.Slots == nil {
		r.Slots = map[string]Slot{}
	}
	return r, err
}

func (m *Manager) readUpgrade() (upgradeRecord, bool, error) {
	return readRecord(m.upgradePath(), parseUpgrade)
}

func (m *Manager) readUpdate() (updateRecord, error) {
	r, _, err := readRecord(m.updatePath(), parseUpdate)
	return r, err
}

func (m *Manager) writeSlots(r slotsRecord) error {
	return writeRecord(m.slotsPath(), r, slotsJSONMode)
}
func (m *Manager) writeUpgrade(r upgradeRecord) error {
	return writeRecord(m.upgradePath(), r, recordMode)
}
func (m *Manager) writeUpdate(r updateRecord) error {
	if r.Failed == nil {
		r.Failed = []FailedVersion{}
	}
	return writeRecord(m.updatePath(), r, recordMode)
}

// removeRecord removes a record and makes the removal durable.
func removeRecord(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("selfupdate: %w", err)
	}
	return pki.SyncDir(filepath.Dir(path))
}

// floor is the release floor: the config's and update.json's, the higher.
func (m *Manager) floor(u updateRecord) int64 { return max(m.o.ConfigFloor, u.Floor) }

func failedBefore(u updateRecord, v string) (FailedVersion, bool) {
	for _, f := range u.Failed {
		if pki.SameVersion(f.Version, v) {
			return f, true
		}
	}
	return FailedVersion{}, false
}

// recordsDirMode is 0755 when the records share the slots directory (bcd
// helper), which must stay executable by the node, else 0700.
func (m *Manager) recordsMode() fs.FileMode {
	if filepath.Clean(m.o.RecordsDir) == filepath.Clean(m.o.SlotsDir) {
		return slotsDirMode
	}
	return recordsDirMode
}

// lock takes the host's update lock: one update at a time, so that a section
// and a daemon.upgrade, or bcd update --rollback and the node, never race.
// The lock is released when the returned function runs (or the process
// exits: flock dies with its file).
func (m *Manager) lock() (func(), error) {
	if err := os.MkdirAll(m.o.RecordsDir, m.recordsMode()); err != nil {
		return nil, fmt.Errorf("selfupdate: %w", err)
	}
	path := filepath.Join(m.o.RecordsDir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, recordMode)
	if err != nil {
		return nil, fmt.Errorf("selfupdate: lock: %w", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("selfupdate: lock: %s is not a regular file", path)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("selfupdate: lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}
