package deploy

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/better-compute/bcd/protocol"
)

// normWWN compares WWNs as sysfs and operators write them: 0x5000c500…,
// naa.5000c500…, in either case.
func normWWN(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	for _, p := range []string{"0x", "naa.", "eui.", "wwn-"} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}

// Mismatch says which hint excludes the disk, "" when none does.
func hintMismatch(h protocol.RootDeviceHints, d Disk) string {
	fold := func(a, b string) bool { return strings.EqualFold(strings.TrimSpace(a), strings.TrimSpace(b)) }
	switch {
	case h.Serial != "" && strings.TrimSpace(h.Serial) != d.Serial:
		return fmt.Sprintf("serial=%s (it reports %q)", h.Serial, d.Serial)
	case h.WWN != "" && (d.WWN == "" || normWWN(h.WWN) != normWWN(d.WWN)):
		return fmt.Sprintf("wwn=%s (it reports %q)", h.WWN, d.WWN)
	case h.Model != "" && !fold(h.Model, d.Model):
		return fmt.Sprintf("model=%s (it reports %q)", h.Model, d.Model)
	case h.Vendor != "" && !fold(h.Vendor, d.Vendor):
		return fmt.Sprintf("vendor=%s (it reports %q)", h.Vendor, d.Vendor)
	case h.Name != "" && strings.TrimPrefix(h.Name, "/dev/") != d.Name:
		return fmt.Sprintf("name=%s", h.Name)
	case h.ByPath != "" && !contains(d.ByPath, h.ByPath):
		return fmt.Sprintf("by_path=%s (its links: %s)", h.ByPath, orNone(d.ByPath))
	case h.Rotational != nil && *h.Rotational != d.Rotational:
		return fmt.Sprintf("rotational=%t", *h.Rotational)
	case h.SizeOp == "=" && d.Size != h.Size, h.SizeOp == ">=" && d.Size < h.Size, h.SizeOp == "<=" && d.Size > h.Size:
		return fmt.Sprintf("size%s%d (it holds %d bytes)", h.SizeOp, h.Size, d.Size)
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s || filepath.Clean(v) == filepath.Clean(s) {
			return true
		}
	}
	return false
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, " ")
}
