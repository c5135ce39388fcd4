package protocol

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// RootDeviceHints are root-device hints, as Ironic's root_device: each given field must
// match the disk. They are written as a comma-separated list of key=value
// (ParseRootDevice): serial, wwn, model, vendor, name, by_path, rotational, and size
// with =, >= or <=.
type RootDeviceHints struct {
	Serial, WWN, Model, Vendor string
	// Name is the kernel name or its /dev path (sda, /dev/sda).
	Name string
	// ByPath is a /dev/disk/by-path link.
	ByPath string
	// Size compares the disk's bytes with SizeOp ("=", ">=" or "<="); SizeOp ""
	// means no size hint.
	SizeOp string
	Size   int64
	// Rotational, when not nil, must equal the disk's.
	Rotational *bool
	// text is each hint as parsed, for ChosenBy.
	text []string
}

// String gives the hints back in the form they were parsed from.
func (h RootDeviceHints) String() string { return strings.Join(h.text, ",") }

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1000, "kb": 1000, "m": 1000 * 1000, "mb": 1000 * 1000, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// parseSize reads a byte count: digits, optionally a unit (KB, MB, GB, TB in
// powers of 1000; KiB, MiB, GiB, TiB in powers of 1024).
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.ToLower(strings.TrimSpace(s[i:]))
	mult, ok := sizeUnits[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q: want bytes, or a number with KB, MB, GB, TB, KiB, MiB, GiB or TiB", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("%q: too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: not a size", s)
	}
	return int64(f * float64(mult)), nil
}

// ParseRootDevice reads root-device hints: "serial=X,size>=100GiB,rotational=false".
// An error names the hint at fault. Values cannot hold commas.
func ParseRootDevice(s string) (RootDeviceHints, error) {
	var h RootDeviceHints
	if strings.TrimSpace(s) == "" {
		return h, fmt.Errorf("root device hints: empty")
	}
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return h, fmt.Errorf("root device hints %q: an empty hint", s)
		}
		var key, op, val string
		if i := strings.IndexAny(part, "<>="); i > 0 {
			key, val = strings.ToLower(strings.TrimSpace(part[:i])), part[i:]
			for _, o := range []string{">=", "<=", "="} {
				if strings.HasPrefix(val, o) {
					op, val = o, strings.TrimSpace(val[len(o):])
					break
				}
			}
		}
		if op == "" {
			return h, fmt.Errorf("root device hint %q: want key=value (or size>=N, size<=N)", part)
		}
		key = strings.ReplaceAll(key, "-", "_")
		if seen[key] {
			return h, fmt.Errorf("root device hint %q: %s given twice", part, key)
		}
		seen[key] = true
		if op != "=" && key != "size" {
			return h, fmt.Errorf("root device hint %q: only size takes %s", part, op)
		}
		if val == "" {
			return h, fmt.Errorf("root device hint %q: empty value", part)
		}
		switch key {
		case "serial":
			h.Serial = val
		case "wwn":
			h.WWN = val
		case "model":
			h.Model = val
		case "vendor":
			h.Vendor = val
		case "name":
			if strings.ContainsRune(strings.TrimPrefix(val, "/dev/"), '/') {
				return h, fmt.Errorf("root device hint %q: want sdX or /dev/sdX", part)
			}
			h.Name = val
		case "by_path":
			if !strings.HasPrefix(val, "/dev/disk/by-path/") {
				return h, fmt.Errorf("root device hint %q: want a /dev/disk/by-path/ link", part)
			}
			h.ByPath = val
		case "rotational":
			b, err := strconv.ParseBool(strings.ToLower(val))
			if err != nil {
				return h, fmt.Errorf("root device hint %q: want true or false", part)
			}
			h.Rotational = &b
		case "size":
			n, err := parseSize(val)
			if err != nil {
				return h, fmt.Errorf("root device hint %q: %v", part, err)
			}
			h.SizeOp, h.Size = op, n
		default:
			return h, fmt.Errorf("root device hint %q: unknown key %q (want serial, wwn, model, vendor, size, rotational, by_path or name)", part, key)
		}
		h.text = append(h.text, key+op+val)
	}
	return h, nil
}
