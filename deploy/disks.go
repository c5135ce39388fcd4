package deploy

import (
	"fmt"
	"github.com/better-compute/bcd/protocol"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Disk is one whole block device a deploy may write.
type Disk struct {
	// Name is the kernel's name (nvme0n1, sda); Path the device node (/dev/nvme0n1).
	Name string
	Path string
	Size int64
	// Model and Serial are what the device reports, trimmed.
	Model  string
	Serial string
	// WWN (device/wwid, wwid or device/wwn) and Vendor (device/vendor) where the
	// device reports them; ByPath the /dev/disk/by-path links to it, when udev made any.
	WWN    string
	Vendor string
	ByPath []string
	// ChosenBy says, on a deploy's target, why the deploy chose it.
	ChosenBy string
	// Removable, Rotational and ReadOnly come from /sys/block/NAME.
	Removable  bool
	Rotational bool
	ReadOnly   bool
}

// SysBlock reads disks from /sys/block.
type SysBlock struct {
	// Root is prepended to /sys and /dev paths, for tests; "" is the real root.
	Root string
}

// virtualDisk names block devices that are not hardware: a deploy never picks one
// by itself (a test can still name a loop device by path).
func virtualDisk(name string) bool {
	for _, p := range []string{"loop", "ram", "zram", "dm-", "md", "nbd", "sr", "fd", "nullb", "zd"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// List returns the machine's whole disks, leaving out virtual devices, sorted by name.
func (s SysBlock) List() ([]Disk, error) {
	dir := filepath.Join("/", s.Root, "sys/block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list disks: %w", err)
	}
	var disks []Disk
	for _, e := range entries {
		if virtualDisk(e.Name()) {
			continue
		}
		d, err := s.Disk(e.Name())
		if err != nil {
			return nil, err
		}
		disks = append(disks, d)
	}
	sort.Slice(disks, func(i, j int) bool { return disks[i].Name < disks[j].Name })
	return disks, nil
}

// Disk reads one block device by its kernel name.
func (s SysBlock) Disk(name string) (Disk, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return Disk{}, fmt.Errorf("disk name %q", name)
	}
	base := filepath.Join("/", s.Root, "sys/block", name)
	read := func(rel string) string {
		b, err := os.ReadFile(filepath.Join(base, rel))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	sizeText := read("size")
	sectors, err := strconv.ParseInt(sizeText, 10, 64)
	if err != nil || sectors < 0 {
		return Disk{}, fmt.Errorf("disk %s: size %q in %s", name, sizeText, base)
	}
	d := Disk{
		Name: name,
		Path: filepath.Join("/", s.Root, "dev", name),
		// The kernel counts 512-byte sectors whatever the device's block size.
		Size:       sectors * 512,
		Model:      read("device/model"),
		Removable:  read("removable") == "1",
		Rotational: read("queue/rotational") == "1",
		ReadOnly:   read("ro") == "1",
	}
	for _, rel := range []string{"device/serial", "serial"} {
		if v := read(rel); v != "" {
			d.Serial = v
			break
		}
	}
	if d.Serial == "" {
		if b, err := os.ReadFile(filepath.Join(base, "device/vpd_pg80")); err == nil {
			d.Serial = parseVPD80(b)
		}
	}
	for _, rel := range []string{"device/wwid", "wwid", "device/wwn"} {
		if v := read(rel); v != "" {
			d.WWN = v
			break
		}
	}
	d.Vendor = read("device/vendor")
	d.ByPath = s.byPath(name)
	return d, nil
}

// byPath lists the /dev/disk/by-path links that point at the disk (none where
// udev did not run).
func (s SysBlock) byPath(name string) []string {
	dir := filepath.Join("/", s.Root, "dev/disk/by-path")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var links []string
	for _, e := range entries {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && filepath.Base(t) == name {
			links = append(links, "/dev/disk/by-path/"+e.Name())
		}
	}
	return links
}

// parseVPD80 reads the unit serial number from a SCSI VPD page 0x80 (the serial of
// SATA and SAS disks, which have no serial attribute): a 4-byte header whose last two
// bytes are the length, then ASCII.
func parseVPD80(b []byte) string {
	if len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	if n > len(b)-4 {
		n = len(b) - 4
	}
	s := strings.TrimSpace(strings.TrimRight(string(b[4:4+n]), "\x00"))
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return ""
		}
	}
	return s
}

// SelectDisk applies a target selector to a disk list (see SelectDiskWhy).
func SelectDisk(disks []Disk, sel Target, minSize int64) (Disk, error) {
	d, _, err := SelectDiskWhy(disks, sel, minSize)
	return d, err
}

// SelectDiskWhy applies a target selector to a disk list and says why it chose
// the disk: by root-device hints (exactly one disk must match them all, or with
// FirstMatch the first by name), by serial (exactly one disk must report it), by
// path (resolved through symlinks such as /dev/disk/by-id), or else the smallest
// disk that is neither removable nor read-only and holds minSize bytes, ties going
// to the first by name.
func SelectDiskWhy(disks []Disk, sel Target, minSize int64) (Disk, string, error) {
	switch {
	case sel.RootDevice != "":
		h, err := protocol.ParseRootDevice(sel.RootDevice)
		if err != nil {
			return Disk{}, "", fmt.Errorf("target: %v", err)
		}
		var found []Disk
		var excluded []string
		for _, d := range disks {
			if why := hintMismatch(h, d); why != "" {
				excluded = append(excluded, d.Name+" by "+why)
				continue
			}
			found = append(found, d)
		}
		why := "hints " + h.String()
		switch {
		case len(found) == 0:
			return Disk{}, "", fmt.Errorf("target: no disk matches root device hints %s (%s; candidates: %s)", h, strings.Join(excluded, "; "), describe(disks))
		case len(found) > 1 && !sel.FirstMatch:
			var names []string
			for _, d := range found {
				names = append(names, d.Name)
			}
			return Disk{}, "", fmt.Errorf("target: %d disks match root device hints %s: %s (candidates: %s); narrow the hints or ask for the first match", len(found), h, strings.Join(names, ", "), describe(found))
		case len(found) > 1:
			why += fmt.Sprintf(" (first match of %d)", len(found))
		}
		d, err := checkDisk(found[0], minSize)
		return d, why, err
	case sel.Serial != "":
		var found []Disk
		for _, d := range disks {
			if d.Serial == strings.TrimSpace(sel.Serial) {
				found = append(found, d)
			}
		}
		if len(found) != 1 {
			return Disk{}, "", fmt.Errorf("target: %d disks report serial %q (%s)", len(found), sel.Serial, describe(disks))
		}
		d, err := checkDisk(found[0], minSize)
		return d, "serial " + sel.Serial, err
	case sel.Path != "":
		want := sel.Path
		if p, err := filepath.EvalSymlinks(want); err == nil {
			want = p
		}
		for _, d := range disks {
			if d.Path == want || d.Path == sel.Path {
				d, err := checkDisk(d, minSize)
				return d, "path " + sel.Path, err
			}
		}
		return Disk{}, "", fmt.Errorf("target: %s is not one of the disks (%s)", sel.Path, describe(disks))
	}
	var best *Disk
	for i := range disks {
		d := &disks[i]
		if d.Removable || d.ReadOnly || d.Size < minSize {
			continue
		}
		if best == nil || d.Size < best.Size || d.Size == best.Size && d.Name < best.Name {
			best = d
		}
	}
	if best == nil {
		return Disk{}, "", fmt.Errorf("target: no non-removable disk holds %d bytes (%s)", minSize, describe(disks))
	}
	return *best, fmt.Sprintf("smallest non-removable disk >= %d bytes", minSize), nil
}

func checkDisk(d Disk, minSize int64) (Disk, error) {
	if d.ReadOnly {
		return Disk{}, fmt.Errorf("target: %s is read-only", d.Path)
	}
	if d.Size < minSize {
		return Disk{}, fmt.Errorf("target: %s holds %d bytes, the image needs %d", d.Path, d.Size, minSize)
	}
	return d, nil
}

func describe(disks []Disk) string {
	if len(disks) == 0 {
		return "no disks"
	}
	var parts []string
	for _, d := range disks {
		s := fmt.Sprintf("%s %d bytes", d.Name, d.Size)
		if d.Model != "" {
			s += fmt.Sprintf(" model %q", d.Model)
		}
		if d.Serial != "" {
			s += " serial " + d.Serial
		}
		if d.WWN != "" {
			s += " wwn " + d.WWN
		}
		s += fmt.Sprintf(" rotational=%t", d.Rotational)
		if d.Removable {
			s += " removable"
		}
		if d.ReadOnly {
			s += " read-only"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
