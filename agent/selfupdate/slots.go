package selfupdate

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/better-compute/bcd/pki"
)

// linkedSlot returns the slot the link name in the slots directory points
// at ("" when the link does not exist). A link bcd did not write (absolute,
// pointing anywhere but bcd-a or bcd-b, or not a link) is an error.
func (m *Manager) linkedSlot(name string) (string, error) {
	path := filepath.Join(m.o.SlotsDir, name)
	target, err := os.Readlink(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", refuse(CodeSlotsRefused, "%s is not a symlink to %s or %s: %v", path, SlotFile(SlotA), SlotFile(SlotB), err)
	}
	for _, s := range []string{SlotA, SlotB} {
		if target == SlotFile(s) {
			return s, nil
		}
	}
	return "", refuse(CodeSlotsRefused, "%s points at %q, not %s or %s", path, target, SlotFile(SlotA), SlotFile(SlotB))
}

// ensureSlotsDir makes the slots directory (0755) and refuses one that is a
// symlink: bcd would write binaries wherever it points.
func (m *Manager) ensureSlotsDir() error {
	fi, err := os.Lstat(m.o.SlotsDir)
	if errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(m.o.SlotsDir, slotsDirMode); err != nil {
			return fmt.Errorf("selfupdate: %w", err)
		}
		// MkdirAll's mode is narrowed by the umask (the unit's is 0077).
		return os.Chmod(m.o.SlotsDir, slotsDirMode)
	}
	if err != nil {
		return fmt.Errorf("selfupdate: %w", err)
	}
	if !fi.IsDir() {
		return refuse(CodeSlotsRefused, "the slots directory %s is not a directory (%s)", m.o.SlotsDir, fi.Mode().Type())
	}
	return nil
}

// replaceSymlink points dir/name at target atomically: a new link under a
// temporary name, renamed over the old one, the directory fsynced. A reader
// sees the old link or the new one, never none.
func replaceSymlink(dir, name, target string) error {
	tmp := filepath.Join(dir, "."+name+".tmp-link")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("selfupdate: %w", err)
	}
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("selfupdate: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("selfupdate: %w", err)
	}
	return pki.SyncDir(dir)
}

func (m *Manager) link(name, slot string) error {
	return replaceSymlink(m.o.SlotsDir, name, SlotFile(slot))
}

// writeSlot copies src into slot, checking while it writes that the bytes
// are exactly size long with the SHA-256 want (when want is "", whatever
// they are is recorded). The copy goes to a temporary file, fsynced and
// renamed over the slot, so a slot holds a whole binary or its old one.
// It returns the size and digest written.
func (m *Manager) writeSlot(src io.Reader, slot string, size int64, want string) (Slot, error) {
	c, err := copyToTemp(m.o.SlotsDir, SlotFile(slot), src, size)
	if err != nil {
		return Slot{}, fmt.Errorf("selfupdate: write slot %s: %w", SlotFile(slot), err)
	}
	switch {
	case c.n > size:
		c.abort()
		return Slot{}, refuse(CodeSizeMismatch, "writing slot %s: more than %d bytes", SlotFile(slot), size)
	case c.n < size:
		c.abort()
		return Slot{}, refuse(CodeSizeMismatch, "writing slot %s: %d bytes, want %d", SlotFile(slot), c.n, size)
	case want != "" && c.sha256 != want:
		c.abort()
		return Slot{}, refuse(CodeDigestMismatch, "writing slot %s: sha256 %s, want %s", SlotFile(slot), c.sha256, want)
	}
	if err := c.commit(SlotFile(slot), binaryMode); err != nil {
		return Slot{}, err
	}
	return Slot{SHA256: c.sha256, Size: c.n}, nil
}

// hashSlot re-reads a slot, for taking the other slot's binary without a
// manifest: it must still be the bytes slots.json recorded.
func (m *Manager) hashSlot(slot string) (Slot, error) {
	f, err := openNoFollow(filepath.Join(m.o.SlotsDir, SlotFile(slot)))
	if err != nil {
		return Slot{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Slot{}, fmt.Errorf("selfupdate: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return Slot{}, refuse(CodeSlotsRefused, "%s is not a regular file", f.Name())
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Slot{}, fmt.Errorf("selfupdate: %w", err)
	}
	return Slot{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// openNoFollow opens path for reading without following a final symlink and
// without waiting on a FIFO.
func openNoFollow(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("selfupdate: %w", err)
	}
	return f, nil
}

// adopt makes the entrypoint a symlink to <SlotsDir>/current, copying the
// binary there into a slot first when it is a plain file (spec step 2): on
// the first update into slot a, after a rerun of the install script into the
// current slot. An entrypoint already linked to current is left alone; a
// symlink anywhere else is refused.
func (m *Manager) adopt() error {
	entry := m.o.Entrypoint
	link, err := m.entrypointLink()
	if errors.Is(err, fs.ErrNotExist) {
		return refuse(CodeEntrypointRefused, "the entrypoint %s does not exist; there is no bcd to adopt", entry)
	}
	if err != nil {
		return err
	}
	if link.linked {
		return nil
	}
	if link.isLink {
		return refuse(CodeEntrypointRefused, "the entrypoint %s is a symlink to %s, not to %s; refusing to replace it",
			entry, link.target, m.currentPath())
	}
	current, err := m.linkedSlot(CurrentLink)
	if err != nil {
		return err
	}
	slot := current
	if slot == "" {
		slot = SlotA
	}
	if err := m.copyEntrypoint(slot); err != nil {
		return err
	}
	if current == "" {
		if err := m.link(CurrentLink, slot); err != nil {
			return err
		}
	}
	if err := replaceSymlink(filepath.Dir(entry), filepath.Base(entry), m.currentPath()); err != nil {
		return err
	}
	m.log.Info("self-update: adopted the entrypoint", "entrypoint", entry, "slot", SlotFile(slot), "version", m.o.Running)
	return nil
}

// copyEntrypoint copies the plain-file entrypoint into slot and records it
// with the running version (the process runs that file) and the config's
// release sequence, 0 = unknown when the install set none.
func (m *Manager) copyEntrypoint(slot string) error {
	entry := m.o.Entrypoint
	f, err := openNoFollow(entry)
	if err != nil {
		return refuse(CodeEntrypointRefused, "the entrypoint %s: %v", entry, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("selfupdate: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return refuse(CodeEntrypointRefused, "the entrypoint %s is not a regular file (%s)", entry, fi.Mode().Type())
	}
	if m.o.RequireRoot {
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			return refuse(CodeEntrypointRefused, "the entrypoint %s is owned by uid %d, not root; refusing to adopt it", entry, ownerOf(fi))
		}
		if fi.Mode().Perm()&0o022 != 0 {
			return refuse(CodeEntrypointRefused, "the entrypoint %s has mode %04o: group or others may write it; refusing to adopt it", entry, fi.Mode().Perm())
		}
	}
	written, err := m.writeSlot(f, slot, fi.Size(), "")
	if err != nil {
		return err
	}
	slots, err := m.readSlots()
	if err != nil {
		return err
	}
	written.Version = m.o.Running
	written.Sequence = max(m.o.ConfigFloor, 0)
	slots.Slots[slot] = written
	return m.writeSlots(slots)
}

func ownerOf(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Uid)
	}
	return -1
}

func (m *Manager) currentPath() string { return filepath.Join(m.o.SlotsDir, CurrentLink) }

// entrypointState is what is at the entrypoint.
type entrypointState struct {
	// isLink: the entrypoint is a symlink, to target (as written).
	isLink bool
	target string
	// linked: the link resolves to <SlotsDir>/current (adopted).
	linked bool
}

// entrypointLink looks at the entrypoint without following it; a missing
// entrypoint is fs.ErrNotExist.
func (m *Manager) entrypointLink() (entrypointState, error) {
	fi, err := os.Lstat(m.o.Entrypoint)
	if err != nil {
		return entrypointState{}, fmt.Errorf("selfupdate: %w", err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		return entrypointState{}, nil
	}
	target, err := os.Readlink(m.o.Entrypoint)
	if err != nil {
		return entrypointState{}, fmt.Errorf("selfupdate: %w", err)
	}
	abs := target
	if !filepath.IsAbs(abs) {
		abs = filepath.Join(filepath.Dir(m.o.Entrypoint), abs)
	}
	return entrypointState{isLink: true, target: target, linked: filepath.Clean(abs) == m.currentPath()}, nil
}
