package simlab

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// neighDefault holds the kernel's IPv4 neighbour-table limits. They are the
// host's, not a namespace's: the table is one for every network namespace (a
// namespace other than the first has no neigh/default directory), so the site's
// thousand machines and the host's own neighbours count against the same
// gc_thresh3, 1024 by default.
const neighDefault = "/proc/sys/net/ipv4/neigh/default"

// neighbourRoom is the table a fleet of machines needs: each machine is the
// site's neighbour while it boots, sim's namespace has the site's address, and
// the host keeps its own; twice the machines leaves the kernel's garbage
// collection (which starts above gc_thresh2) room.
func neighbourRoom(machines int) int { return 2*machines + 256 }

// raiseNeighbourLimits raises gc_thresh3 (the hard limit) under dir to
// neighbourRoom when it is lower, and gc_thresh2 (above which entries older than
// 5 s are collected) with it when that is lower too, so a 1,000-machine run neither overflows the table ("neighbour table
// overflow": a machine goes unanswered) nor has its entries collected mid-boot.
// restore puts back the values it changed, unless something changed them since.
func raiseNeighbourLimits(dir string, machines int) (restore func(), changed string, err error) {
	want := neighbourRoom(machines)
	type was struct {
		path     string
		old, set int
	}
	var done []was
	restore = func() {
		for i := len(done) - 1; i >= 0; i-- {
			w := done[i]
			if cur, err := readInt(w.path); err == nil && cur == w.set {
				os.WriteFile(w.path, []byte(strconv.Itoa(w.old)), 0o644)
			}
		}
	}
	var msgs []string
	if cur, err := readInt(filepath.Join(dir, "gc_thresh3")); err != nil {
		return func() {}, "", fmt.Errorf("simlab: the neighbour table's gc_thresh3: %w", err)
	} else if cur >= want {
		return func() {}, "", nil // room enough: the host's settings are left alone
	}
	// gc_thresh3 first: the kernel takes a gc_thresh2 above it, but keeping the
	// order keeps every moment's limits sane.
	for _, name := range []string{"gc_thresh3", "gc_thresh2"} {
		path := filepath.Join(dir, name)
		cur, err := readInt(path)
		if err != nil {
			restore()
			return func() {}, "", fmt.Errorf("simlab: the neighbour table's %s: %w", name, err)
		}
		if cur >= want {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(want)), 0o644); err != nil {
			restore()
			return func() {}, "", fmt.Errorf("simlab: raising net.ipv4.neigh.default.%s to %d for %d machines: %w", name, want, machines, err)
		}
		done = append(done, was{path, cur, want})
		msgs = append(msgs, fmt.Sprintf("%s %d → %d", name, cur, want))
	}
	return restore, strings.Join(msgs, ", "), nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("%s holds %q, not a number", path, strings.TrimSpace(string(b)))
	}
	return n, nil
}
