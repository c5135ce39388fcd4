package nodeagent

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
)

// checkUpdate is bcd doctor's self-update check (spec "Self-update"): it warns
// without release pins, fails when the slots are in use but the entrypoint does
// not link to current, and warns about a pending update or a failed version.
func checkUpdate(c *config.Config, path string) Result {
	m, err := UpdateManager(c, path)
	if err != nil {
		return Result{Fail, err.Error()}
	}
	st, err := m.Status()
	if err != nil {
		return Result{Fail, fmt.Sprintf("the slots or records do not read: %v", err)}
	}
	current := filepath.Join(st.SlotsDir, selfupdate.CurrentLink)
	if st.InUse() && !st.EntrypointLinked {
		what := "is a plain file"
		if st.EntrypointTarget != "" {
			what = "links to " + st.EntrypointTarget
		}
		return Result{Fail, fmt.Sprintf("the slots in %s are in use, but the entrypoint %s %s, not %s: bcd would not start the current slot (after a rerun of the install script, the next update adopts the file into the current slot)",
			st.SlotsDir, st.Entrypoint, what, current)}
	}
	var warns []string
	pins := len(c.UpdateOrDefault().ReleasePins)
	if pins == 0 {
		warns = append(warns, "no [update] release_pins: bcd takes no release, so it never updates itself")
	}
	if p := st.Pending; p != nil {
		if p.SwappedBack != nil {
			warns = append(warns, fmt.Sprintf("the update to bcd %s was swapped back (%s); bcd records it as failed when it starts", p.Version, p.SwappedBack.Why))
		} else {
			warns = append(warns, fmt.Sprintf("an update to bcd %s awaits its first Welcome until %s", p.Version, p.Deadline.UTC().Format(time.RFC3339)))
		}
	}
	if n := len(st.Failed); n > 0 {
		var vs []string
		for _, f := range st.Failed {
			vs = append(vs, f.Version)
		}
		warns = append(warns, fmt.Sprintf("%d failed version(s), never tried again until bcd update --clear-failed: %s", n, strings.Join(vs, ", ")))
	}
	if len(warns) > 0 {
		return Result{Warn, strings.Join(warns, "; ")}
	}
	if !st.InUse() {
		return Result{OK, fmt.Sprintf("%d release pin(s), release floor %d; the slots in %s are unused until the first update", pins, st.Floor, st.SlotsDir)}
	}
	running := st.Slots[st.Current].Version
	return Result{OK, fmt.Sprintf("%s links to %s (bcd %s in %s); release floor %d; %d release pin(s)",
		st.Entrypoint, current, running, selfupdate.SlotFile(st.Current), st.Floor, pins)}
}
