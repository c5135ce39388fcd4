package daemonupdate

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/daemonupdate/updatetest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// fixture is one host's self-update files in a temp dir, a release server on
// 127.0.0.1 and the journal every "process" (an Updater on a real
// selfupdate.Manager) reports into, as bcd node's processes share journal.db.
// Nothing execs: a test reads ExecRequested instead.
type fixture struct {
	t    *testing.T
	opts selfupdate.Options
	rel  *updatetest.Releaser
	j    *journal.Journal
	seen int
}

func newFixture(t *testing.T, pins bool) *fixture {
	t.Helper()
	root := t.TempDir()
	data := filepath.Join(root, "var/lib/bcd")
	entry := filepath.Join(root, "usr/local/bin/bcd")
	for _, d := range []string{data, filepath.Dir(entry)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(entry, []byte("#!/bin/sh\necho the install script's bcd\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	rel := updatetest.New(t, updatetest.TLSServer)
	j, err := journal.Open(filepath.Join(data, "journal.db"), "node_a", journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	f := &fixture{t: t, rel: rel, j: j, opts: selfupdate.Options{
		Threshold: 1, ConfigFloor: 10,
		SlotsDir: filepath.Join(data, "bin"), RecordsDir: data, DataDir: data, Entrypoint: entry,
		ConfigPath: filepath.Join(root, "etc/bcd/config.toml"), UnitDir: filepath.Join(root, "etc/systemd/system"),
		RequireRoot: os.Geteuid() == 0, Deadline: time.Minute, IdleTimeout: 5 * time.Second,
		HTTPClient: rel.Server.Client(),
	}}
	if pins {
		f.opts.Pins = []string{rel.Pin}
	}
	return f
}

// process starts an Updater as the bcd of version running would, welcomed at
// serverTime unless it is zero.
func (f *fixture) process(running string, edit ...func(*selfupdate.Options)) *Updater {
	f.t.Helper()
	o := f.opts
	o.Running = running
	for _, e := range edit {
		e(&o)
	}
	u := New(o)
	if u.off != nil {
		f.t.Fatalf("updater off: %v", u.off)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(func() { cancel(); u.Wait() })
	u.Start(ctx, &agent.Session{Journal: f.j})
	return u
}

func welcome(u *Updater, serverTime time.Time) {
	u.OnWelcome(context.Background(), protocol.Welcome{ServerTime: serverTime}, true)
}

// spec pushes a spec holding sec as the daemon section and waits for the
// update it starts to end or to ask for the exec.
func spec(u *Updater, revision int64, sec any) {
	raw, _ := json.Marshal(sec)
	u.OnSpec(context.Background(), protocol.Spec{Revision: revision, Sections: map[string]json.RawMessage{protocol.SectionDaemon: raw}})
	u.wg.Wait()
}

// upgrade runs daemon.upgrade as the session would, its statuses journaled.
func upgrade(t *testing.T, u *Updater, id string, sec protocol.DaemonSection) {
	t.Helper()
	params, _ := json.Marshal(sec)
	report := func(st protocol.Status) error { st.CommandID = id; return u.session.ReportStatus(st) }
	if err := u.Upgrade(context.Background(), protocol.Command{ID: id, Kind: protocol.KindDaemonUpgrade, Params: params}, report); err != nil {
		t.Fatalf("daemon.upgrade: %v", err)
	}
}

// reports returns what was journaled since the last call, one line each:
// "section <rev> <state> <reason> <version>: <message>" or
// "command <id> <state> <reason>: <message>".
func (f *fixture) reports() []string {
	f.t.Helper()
	entries, err := f.j.Pending()
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range entries[f.seen:] {
		switch e.Type {
		case protocol.FrameStatus:
			var st protocol.Status
			json.Unmarshal(e.Data, &st)
			out = append(out, fmt.Sprintf("command %s %s %s: %s", st.CommandID, st.State, st.Reason, st.Message))
		case protocol.FrameEvent:
			var ev protocol.Event
			json.Unmarshal(e.Data, &ev)
			var st protocol.SectionStatus
			if ev.Kind != protocol.EventSectionStatus || json.Unmarshal(ev.Data, &st) != nil || st.Section != protocol.SectionDaemon {
				f.t.Fatalf("unexpected event %s", e.Data)
			}
			out = append(out, fmt.Sprintf("section %d %s %s %s: %s", st.Revision, st.State, st.Reason, st.Version, st.Message))
		}
	}
	f.seen = len(entries)
	return out
}

// want checks the reports since the last call against prefixes, in order.
func (f *fixture) want(prefixes ...string) {
	f.t.Helper()
	got := f.reports()
	if len(got) != len(prefixes) {
		f.t.Fatalf("reports:\n  %s\nwant %d:\n  %s", strings.Join(got, "\n  "), len(prefixes), strings.Join(prefixes, "\n  "))
	}
	for i := range got {
		if !strings.HasPrefix(got[i], prefixes[i]) {
			f.t.Errorf("report %d = %q, want it to start with %q", i, got[i], prefixes[i])
		}
	}
}

func (f *fixture) current() string {
	target, _ := os.Readlink(filepath.Join(f.opts.SlotsDir, selfupdate.CurrentLink))
	return target
}

func execRequested(u *Updater, within time.Duration) bool {
	if within == 0 {
		return u.execRequested()
	}
	select {
	case <-u.ExecRequested():
		return true
	case <-time.After(within):
		return false
	}
}

// TestSectionDecisions: what a daemon section reports, and that a settled
// one is not applied again at every push.
func TestSectionDecisions(t *testing.T) {
	f := newFixture(t, false)
	u := f.process("0.1.0")
	welcome(u, time.Now())
	sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))

	spec(u, 1, sec)
	f.want("section 1 RUNNING  0.2.0: updating bcd 0.1.0 to 0.2.0", "section 1 FAILED ReleaseRefused 0.2.0: NO_RELEASE_PINS: ")
	spec(u, 1, sec)
	f.want() // the same revision and content: remembered
	spec(u, 2, sec)
	f.want("section 2 RUNNING ", "section 2 FAILED ReleaseRefused 0.2.0: NO_RELEASE_PINS: ") // a new revision tries again
	other := sec
	other.URL += "?mirror"
	spec(u, 2, other)
	f.want("section 2 RUNNING ", "section 2 FAILED ReleaseRefused 0.2.0: NO_RELEASE_PINS: ") // other content too
	spec(u, 3, protocol.DaemonSection{Version: "v0.1.0"})
	f.want("section 3 SUCCEEDED  v0.1.0: bcd 0.1.0 is running")
	spec(u, 3, protocol.DaemonSection{Version: "v0.1.0"})
	f.want()
	spec(u, 4, "not an object")
	f.want("section 4 FAILED ReleaseRefused : SECTION_INVALID: the daemon section does not decode")
	u.OnSpec(context.Background(), protocol.Spec{Revision: 5})
	u.wg.Wait()
	f.want() // no daemon section: nothing to say
	if execRequested(u, 0) || f.current() != "" {
		t.Errorf("a refusal swapped (current %q)", f.current())
	}
}

// TestRefusalsReported: each reason not to take a release is RUNNING, then
// FAILED ReleaseRefused with its code; nothing is swapped, and a refused
// download is not fetched again for the same section.
func TestRefusalsReported(t *testing.T) {
	unpinned := updatetest.New(t, updatetest.TLSServer)
	for _, tc := range []struct {
		name   string
		sec    func(f *fixture) protocol.DaemonSection
		code   string
		server time.Duration // server clock ahead of the host's
	}{
		{"unpinned key", func(f *fixture) protocol.DaemonSection {
			return unpinned.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
		}, "RELEASE_UNTRUSTED", 0},
		{"expired", func(f *fixture) protocol.DaemonSection {
			return f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"), func(r *pki.Release) { r.Expires = time.Now().Add(-time.Minute) })
		}, "RELEASE_EXPIRED", 0},
		{"expired on server time", func(f *fixture) protocol.DaemonSection {
			return f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
		}, "RELEASE_EXPIRED", 2 * time.Hour},
		{"below the floor", func(f *fixture) protocol.DaemonSection {
			return f.rel.Section(t, "0.2.0", 5, []byte("bcd 0.2.0"))
		}, "RELEASE_ROLLBACK", 0},
		{"plain http", func(f *fixture) protocol.DaemonSection {
			sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
			sec.URL = "http" + strings.TrimPrefix(sec.URL, "https")
			return sec
		}, "INSECURE_URL", 0},
		{"binary does not match the manifest", func(f *fixture) protocol.DaemonSection {
			sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
			f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.X")) // same size, other bytes
			return sec
		}, "DIGEST_MISMATCH", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, true)
			u := f.process("0.1.0")
			welcome(u, time.Now().Add(tc.server))
			sec := tc.sec(f)
			spec(u, 1, sec)
			f.want("section 1 RUNNING  0.2.0: updating bcd 0.1.0 to 0.2.0", "section 1 FAILED ReleaseRefused 0.2.0: "+tc.code+": ")
			spec(u, 1, sec)
			f.want()
			if n := f.rel.Downloads("0.2.0"); n > 1 {
				t.Errorf("downloaded %d times", n)
			}
			if execRequested(u, 0) || f.current() != "" {
				t.Errorf("a refusal swapped (current %q)", f.current())
			}
		})
	}
}

// TestSectionSwapsAndConfirms: the old binary reports RUNNING and asks for
// the exec; the new one confirms on its first Welcome and reports SUCCEEDED.
func TestSectionSwapsAndConfirms(t *testing.T) {
	f := newFixture(t, true)
	old := f.process("0.1.0")
	welcome(old, time.Now())
	sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
	spec(old, 5, sec)
	f.want("section 5 RUNNING  0.2.0: ")
	if !execRequested(old, time.Second) || f.current() != "bcd-b" {
		t.Fatalf("no swap: exec requested %v, current %q", execRequested(old, 0), f.current())
	}
	spec(old, 6, sec)
	f.want() // nothing after the swap: the daemon is closing

	neu := f.process("0.2.0")
	f.want() // not before its Welcome
	welcome(neu, time.Now())
	f.want("section 5 SUCCEEDED  0.2.0: bcd 0.2.0 confirmed; the release floor is 20")
	spec(neu, 5, sec)
	f.want() // the Welcome's spec: already reported
	spec(neu, 6, sec)
	f.want("section 6 SUCCEEDED  0.2.0: bcd 0.2.0 is running")
	st, err := neu.m.(*selfupdate.Manager).Status()
	if err != nil || st.Floor != 20 || st.Pending != nil || st.Current != "b" {
		t.Errorf("status %+v, %v", st, err)
	}
	if execRequested(neu, 0) {
		t.Error("the confirmed binary asked for an exec")
	}
}

// TestUpgradeCommandSwapsBack: daemon.upgrade reports RUNNING and swaps; the
// new binary sees no Welcome by the deadline and swaps back; the old one
// reports the command FAILED update-failed and refuses the version again.
func TestUpgradeCommandSwapsBack(t *testing.T) {
	f := newFixture(t, true)
	old := f.process("0.1.0", func(o *selfupdate.Options) { o.Deadline = 300 * time.Millisecond })
	welcome(old, time.Now())
	sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
	upgrade(t, old, "cmd_1", sec)
	f.want("command cmd_1 RUNNING : updating bcd 0.1.0 to 0.2.0")
	if !execRequested(old, 0) || f.current() != "bcd-b" {
		t.Fatalf("no swap: current %q", f.current())
	}

	neu := f.process("0.2.0") // never welcomed
	if !execRequested(neu, 5*time.Second) {
		t.Fatal("the deadline did not swap back")
	}
	if f.current() != "bcd-a" {
		t.Fatalf("current %q after the swap back", f.current())
	}
	f.want() // the new binary reports nothing: the old one does

	back := f.process("0.1.0")
	f.want("command cmd_1 FAILED update-failed: bcd 0.2.0 did not start: no Welcome by its deadline")
	welcome(back, time.Now())
	spec(back, 9, sec)
	f.want("section 9 RUNNING ", "section 9 FAILED ReleaseRefused 0.2.0: UPDATE_FAILED_BEFORE: bcd 0.2.0 failed on this host")
	upgrade(t, back, "cmd_2", sec)
	f.want("command cmd_2 RUNNING ", "command cmd_2 FAILED release-refused: UPDATE_FAILED_BEFORE: ")
	if execRequested(back, 0) {
		t.Error("the refused version swapped")
	}
}

// TestSectionDeadlinePassedBeforeStart: a new binary that starts after its
// deadline swaps back at once; the old one reports the section FAILED
// UpdateFailed once, and a new revision of the same release is refused.
func TestSectionDeadlinePassedBeforeStart(t *testing.T) {
	f := newFixture(t, true)
	old := f.process("0.1.0", func(o *selfupdate.Options) { o.Deadline = time.Millisecond })
	welcome(old, time.Now())
	sec := f.rel.Section(t, "0.2.0", 20, []byte("bcd 0.2.0"))
	spec(old, 7, sec)
	f.want("section 7 RUNNING ")
	time.Sleep(5 * time.Millisecond)
	neu := f.process("0.2.0")
	if !execRequested(neu, 0) || f.current() != "bcd-a" {
		t.Fatalf("no swap back at start: current %q", f.current())
	}
	back := f.process("0.1.0")
	f.want("section 7 FAILED UpdateFailed 0.2.0: bcd 0.2.0 did not start: its deadline ")
	welcome(back, time.Now())
	spec(back, 7, sec)
	f.want() // the spec that asked for it: reported already
	spec(back, 8, sec)
	f.want("section 8 RUNNING ", "section 8 FAILED ReleaseRefused 0.2.0: UPDATE_FAILED_BEFORE: ")
}
