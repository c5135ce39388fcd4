package nodeagent

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/config"
)

// NeighbourLimitFile is the kernel's bound on the IPv4 neighbour (ARP) table,
// net.ipv4.neigh.default.gc_thresh3: past it the kernel drops new entries
// ("neighbour table overflow"), and a machine the site answers is not reached.
const NeighbourLimitFile = "/proc/sys/net/ipv4/neigh/default/gc_thresh3"

// neighbourSysctl is NeighbourLimitFile's sysctl name, as an operator sets it.
const neighbourSysctl = "net.ipv4.neigh.default.gc_thresh3"

// checkNeighbours is a site agent's neighbour-table check: the table's capacity
// beside the machines the site serves (served: the boot entries of the spec bcd
// site saved in data_dir, and whether it saved one), a warning when it is smaller.
// Every machine on the boot network is a neighbour of the site's host while it
// boots, and 1,000 machines on one L2 segment (with their BMCs, when those share
// it) overflow the default 1024.
func checkNeighbours(c *config.Config, limitFile string, served func(dataDir string) (int, bool, error)) Result {
	b, err := os.ReadFile(limitFile)
	if err != nil {
		return Result{Warn, fmt.Sprintf("the neighbour table's capacity (%s) is unknown: %v", neighbourSysctl, err)}
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return Result{Warn, fmt.Sprintf("the neighbour table's capacity: %s holds %q, not a number", limitFile, strings.TrimSpace(string(b)))}
	}
	dir := DataDir(c)
	machines, saved, err := served(dir)
	switch {
	case err != nil:
		return Result{Warn, fmt.Sprintf("%s %d; the machines the site serves are unknown: %v", neighbourSysctl, limit, err)}
	case !saved:
		return Result{OK, fmt.Sprintf("%s %d; the site serves no machines yet (no spec saved in %s)", neighbourSysctl, limit, dir)}
	case limit < machines:
		return Result{Warn, fmt.Sprintf("%s %d, smaller than the %d machines the site serves: once the kernel's neighbour table is full, booting machines go unanswered (\"neighbour table overflow\" in the kernel log); raise it to at least twice the machines, with gc_thresh2 (its soft limit) a little below, in /etc/sysctl.d (sysctl -w %s=%d)",
			neighbourSysctl, limit, machines, neighbourSysctl, 2*machines)}
	}
	return Result{OK, fmt.Sprintf("%s %d; the site serves %d machines", neighbourSysctl, limit, machines)}
}
