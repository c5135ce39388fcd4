package nodeagent

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/human"
)

// UpdateManager is the self-update Manager for the configuration at path, for
// bcd update and bcd doctor: it finds the slots and records as the daemons do
// ([update] slots_dir, else /usr/local/lib/bcd under the helper, else
// <data_dir>/bin with the records in data_dir), and touches nothing until a
// method is called.
func UpdateManager(c *config.Config, path string) (*selfupdate.Manager, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return selfupdate.New(selfupdate.OptionsFor(c, path))
}

// WriteUpdateStatus writes st as bcd update's table: the entrypoint, the
// slots, the release floor, a pending update and the failed versions.
func WriteUpdateStatus(w io.Writer, st selfupdate.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	entry := "is a plain file (not adopted: the slots are unused)"
	switch {
	case st.EntrypointLinked:
		entry = "links to " + st.EntrypointTarget
	case st.EntrypointTarget != "":
		entry = "links to " + st.EntrypointTarget + ", NOT to " + filepath.Join(st.SlotsDir, selfupdate.CurrentLink)
	}
	fmt.Fprintf(tw, "entrypoint:\t%s %s\n", st.Entrypoint, entry)
	fmt.Fprintf(tw, "slots:\t%s\n", st.SlotsDir)
	fmt.Fprintf(tw, "release floor:\t%d\n", st.Floor)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "SLOT\tVERSION\tSEQUENCE\tSIZE\tSHA256\tLINKS")
	names := make([]string, 0, len(st.Slots))
	for name := range st.Slots {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) == 0 {
		fmt.Fprintln(tw, "-\t-\t-\t-\t-\t-")
	}
	for _, name := range names {
		s := st.Slots[name]
		var links []string
		if st.Current == name {
			links = append(links, selfupdate.CurrentLink)
		}
		if st.Previous == name {
			links = append(links, selfupdate.PreviousLink)
		}
		seq := "unknown"
		if s.Sequence > 0 {
			seq = fmt.Sprint(s.Sequence)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", selfupdate.SlotFile(name), s.Version, seq, human.Size(s.Size), human.ShortN(s.SHA256, 16), orDash(strings.Join(links, ",")))
	}
	fmt.Fprintln(tw)
	if p := st.Pending; p == nil {
		fmt.Fprintln(tw, "pending update:\tnone")
	} else {
		what := fmt.Sprintf("bcd %s (sequence %d) in %s, awaiting its first Welcome until %s", p.Version, p.Sequence, selfupdate.SlotFile(p.ToSlot), p.Deadline.UTC().Format(time.RFC3339))
		if p.SwappedBack != nil {
			what = fmt.Sprintf("bcd %s, swapped back to %s at %s: %s", p.Version, selfupdate.SlotFile(p.FromSlot), p.SwappedBack.At.UTC().Format(time.RFC3339), p.SwappedBack.Why)
		}
		if p.CommandID != "" {
			what += " (daemon.upgrade " + p.CommandID + ")"
		}
		fmt.Fprintf(tw, "pending update:\t%s\n", what)
	}
	if len(st.Failed) == 0 {
		fmt.Fprintln(tw, "failed versions:\tnone")
	}
	for i, f := range st.Failed {
		label := ""
		if i == 0 {
			label = "failed versions:"
		}
		fmt.Fprintf(tw, "%s\t%s at %s: %s\n", label, f.Version, f.At.UTC().Format(time.RFC3339), f.Reason)
	}
	if len(st.Failed) > 0 {
		fmt.Fprintln(tw, "\tbcd update --clear-failed allows them again")
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
