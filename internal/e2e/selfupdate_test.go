package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/daemonupdate/updatetest"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/protocol"
)

// TestSelfUpdateRealExec runs real fakehw builds of bcd node against the fake
// gateway (agent/agenttest, in this process), with release binaries signed
// under a pinned release key and served over HTTPS under the control plane's
// serving CA on 127.0.0.1, and an entrypoint and slots in a temp dir:
//
//  1. a daemon section takes 0.1.0 to 0.1.1 by a real exec (same PID), which
//     confirms on its Welcome: SUCCEEDED, floor up, entrypoint → current → bcd-b;
//  2. a labfault_nowelcome 0.1.2 never dials, so its deadline swaps back to
//     0.1.1, which reports FAILED UpdateFailed and refuses 0.1.2 again
//     (ReleaseRefused) until bcd update --clear-failed;
//  3. daemon.upgrade takes 0.1.1 to 0.1.3: RUNNING from the old process,
//     SUCCEEDED from the new one.
//
// A labfault_crash build (0.1.4) is only checked to exit 1 at once: the crash
// loop's rollback needs systemd (the Debian lab).
func TestSelfUpdateRealExec(t *testing.T) {
	start := time.Now()
	bins := buildReleases(t, map[string]string{"0.1.0": "fakehw", "0.1.1": "fakehw", "0.1.2": "fakehw,labfault_nowelcome", "0.1.3": "fakehw",
		"0.1.4": "fakehw,labfault_crash"})
	t.Logf("built five releases in %s", time.Since(start).Round(time.Millisecond))
	// The crash-loop build exits 1 before it reads anything, for systemd to
	// restart until bcd-rollback.service restores the previous slot.
	for _, mode := range []string{"node", "site"} {
		if r := run(t, bins["0.1.4"], nil, "", mode, "--config", "/nonexistent"); r.code != 1 || !strings.Contains(r.stderr, "labfault_crash build: exiting at once") {
			t.Errorf("labfault_crash bcd %s: %s", mode, r)
		}
	}

	gw := newUpdateGateway(t)
	rel := updatetest.New(t, gw.g.API)
	sections := map[string]protocol.DaemonSection{}
	for i, v := range []string{"0.1.1", "0.1.2", "0.1.3"} {
		body, err := os.ReadFile(bins[v])
		if err != nil {
			t.Fatal(err)
		}
		sections[v] = rel.Section(t, v, int64(11+i), body)
	}

	// The host: the install script's 0.1.0 at the entrypoint, joined.
	dir := t.TempDir()
	data := filepath.Join(dir, "var/lib/bcd")
	slots := filepath.Join(data, "bin")
	entry := filepath.Join(dir, "usr/local/bin/bcd")
	if err := os.MkdirAll(filepath.Dir(entry), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, bins["0.1.0"], entry)
	gw.g.Identity(t, data, protocol.RoleNode, "node_a")
	cfg := gw.g.WriteConfig(t, dir, data)
	appendFile(t, cfg, fmt.Sprintf("\n[update]\nrelease_pins = %q\nrelease_sequence = 10\nentrypoint = %q\n", rel.Pin, entry))

	// The test hooks of a fakehw build, which the exec passes on.
	p := startAgentBin(t, entry, []string{"BCD_TEST_UPDATE_DEADLINE=5s", "BCD_TEST_PROTOCOL_VERSION=7"}, "node", "--config", cfg)
	pid := p.cmd.Process.Pid
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nfrom %d frames; bcd node's log:\n%s", append(args, len(gw.all()), p.log)...)
	}
	gw.fail = fail
	exe := func(want string) {
		t.Helper()
		select {
		case <-p.done:
			fail("bcd node (pid %d) exited", pid)
		default:
		}
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || got != filepath.Join(slots, want) {
			fail("pid %d runs %q (%v), want %s", pid, got, err, filepath.Join(slots, want))
		}
	}
	status := func() selfupdate.Status {
		t.Helper()
		r := run(t, bins["0.1.0"], nil, "", "update", "--config", cfg, "-o", "json")
		var st selfupdate.Status
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
			fail("bcd update -o json: %s", r)
		}
		return st
	}
	gw.waitHello("0.1.0", 1)

	// 1. The daemon section: 0.1.0 → 0.1.1 by exec, confirmed on its Welcome.
	step := time.Now()
	gw.push(1, sections["0.1.1"])
	gw.waitSection(1, protocol.SectionRunning, "0.1.1")
	gw.waitHello("0.1.1", 1)
	if st := gw.waitSection(1, protocol.SectionSucceeded, "0.1.1"); !strings.Contains(st.Message, "confirmed; the release floor is 11") {
		fail("SUCCEEDED says %q", st.Message)
	}
	exe("bcd-b")
	st := status()
	if st.Floor != 11 || st.Current != "b" || st.Previous != "a" || !st.EntrypointLinked || st.Pending != nil ||
		st.Slots["a"].Version != "0.1.0" || st.Slots["b"].Version != "0.1.1" || st.Slots["b"].Sequence != 11 {
		fail("after the update, bcd update says %+v", st)
	}
	if target, _ := os.Readlink(entry); target != filepath.Join(slots, selfupdate.CurrentLink) {
		fail("the entrypoint links to %q", target)
	}
	t.Logf("0.1.0 → 0.1.1 by the daemon section in %s", time.Since(step).Round(time.Millisecond))

	// 2. A build that never reaches its Welcome: swapped back by the deadline.
	step = time.Now()
	gw.push(2, sections["0.1.2"])
	gw.waitSection(2, protocol.SectionRunning, "0.1.2")
	gw.waitHello("0.1.1", 2)
	if st := gw.waitSection(2, protocol.SectionFailed, "0.1.2"); st.Reason != protocol.ReasonUpdateFailed || !strings.HasPrefix(st.Message, "bcd 0.1.2 did not start") {
		fail("the swap back reported %+v", st)
	}
	if n := gw.hellos("0.1.2"); n != 0 {
		fail("the labfault_nowelcome build said Hello %d times", n)
	}
	exe("bcd-b")
	if st := status(); len(st.Failed) != 1 || st.Failed[0].Version != "0.1.2" || st.Current != "b" || st.Pending != nil {
		fail("after the swap back, bcd update says %+v", st)
	}
	t.Logf("0.1.2 swapped back by its deadline in %s", time.Since(step).Round(time.Millisecond))

	// ... and refused until --clear-failed; then tried (and swapped back) again.
	gw.push(3, sections["0.1.2"])
	if st := gw.waitSection(3, protocol.SectionFailed, "0.1.2"); st.Reason != protocol.ReasonReleaseRefused || !strings.HasPrefix(st.Message, "UPDATE_FAILED_BEFORE: ") {
		fail("the failed version again: %+v", st)
	}
	if n := rel.Downloads("0.1.2"); n != 1 {
		fail("0.1.2 was downloaded %d times, want once", n)
	}
	if r := run(t, bins["0.1.0"], nil, "", "update", "--config", cfg, "--clear-failed"); r.code != 0 || r.stdout != "cleared 1 failed version(s)\n" {
		fail("bcd update --clear-failed: %s", r)
	}
	gw.push(4, sections["0.1.2"])
	gw.waitSection(4, protocol.SectionRunning, "0.1.2")
	gw.waitHello("0.1.1", 3)
	gw.waitSection(4, protocol.SectionFailed, "0.1.2")

	// 3. daemon.upgrade: RUNNING from 0.1.1, SUCCEEDED from 0.1.3.
	step = time.Now()
	gw.push(5, nil)
	gw.command(protocol.Command{ID: "cmd_upgrade", Kind: protocol.KindDaemonUpgrade, Params: mustJSON(t, sections["0.1.3"])})
	gw.waitStatus("cmd_upgrade", protocol.StateRunning)
	gw.waitHello("0.1.3", 1)
	if st := gw.waitStatus("cmd_upgrade", protocol.StateSucceeded); !strings.Contains(st.Message, "bcd 0.1.3 confirmed; the release floor is 13") {
		fail("daemon.upgrade SUCCEEDED says %q", st.Message)
	}
	exe("bcd-a")
	if st := status(); st.Floor != 13 || st.Current != "a" || st.Slots["a"].Version != "0.1.3" || len(st.Failed) != 1 {
		fail("after daemon.upgrade, bcd update says %+v", st)
	}
	for _, h := range gw.g.Hellos() {
		if h.ProtocolVersion != 7 {
			fail("bcd %s said protocol_version %d, want BCD_TEST_PROTOCOL_VERSION's 7", h.DaemonVersion, h.ProtocolVersion)
		}
	}
	t.Logf("0.1.1 → 0.1.3 by daemon.upgrade in %s; the whole test %s", time.Since(step).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// buildReleases builds cmd/bcd once per version with its tags, in parallel.
func buildReleases(t *testing.T, tags map[string]string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	bins := map[string]string{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for v, tag := range tags {
		bins[v] = filepath.Join(dir, "bcd-"+v)
		wg.Go(func() {
			cmd := exec.Command("go", "build", "-tags="+tag, "-ldflags", "-X github.com/better-compute/bcd/internal/version.Version="+v, "-o", bins[v], "../../cmd/bcd")
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("go build %s: %v\n%s", v, err, out))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n"))
	}
	return bins
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// updateGateway drives agenttest's gateway: the spec it welcomes with and
// pushes, the commands it sends, and every status and event it acknowledges.
type updateGateway struct {
	g    *agenttest.Gateway
	fail func(format string, args ...any)

	mu     sync.Mutex
	spec   protocol.Spec
	conn   *agenttest.Conn
	frames []protocol.Frame
}

func newUpdateGateway(t *testing.T) *updateGateway {
	gw := &updateGateway{g: agenttest.New(t), fail: func(f string, a ...any) { t.Helper(); t.Fatalf(f, a...) }}
	gw.g.WelcomeFor = func(protocol.Hello) protocol.Welcome {
		gw.mu.Lock()
		defer gw.mu.Unlock()
		spec := gw.spec
		return protocol.Welcome{ServerTime: time.Now().UTC(), MinProtocolVersion: protocol.MinVersion, NodeState: protocol.NodeReady, Spec: &spec}
	}
	gw.g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		gw.mu.Lock()
		gw.conn = c
		gw.mu.Unlock()
		agenttest.AckAll(ctx, c, func(f protocol.Frame) {
			gw.mu.Lock()
			gw.frames = append(gw.frames, f)
			gw.mu.Unlock()
		})
	}
	return gw
}

func (gw *updateGateway) all() []protocol.Frame {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return append([]protocol.Frame(nil), gw.frames...)
}

func (gw *updateGateway) send(typ string, v any) {
	gw.mu.Lock()
	c := gw.conn
	gw.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c == nil || c.Send(ctx, typ, v) != nil {
		gw.fail("cannot send a %s frame: no session", typ)
	}
}

// push makes a spec with sec as its daemon section (nil: none) the desired
// state, and sends it.
func (gw *updateGateway) push(revision int64, sec any) {
	spec := protocol.Spec{Revision: revision, Sections: map[string]json.RawMessage{}}
	if sec != nil {
		b, _ := json.Marshal(sec)
		spec.Sections[protocol.SectionDaemon] = b
	}
	gw.mu.Lock()
	gw.spec = spec
	gw.mu.Unlock()
	gw.send(protocol.FrameSpec, spec)
}

func (gw *updateGateway) command(c protocol.Command) { gw.send(protocol.FrameCommand, c) }

func (gw *updateGateway) hellos(version string) int {
	n := 0
	for _, h := range gw.g.Hellos() {
		if h.DaemonVersion == version {
			n++
		}
	}
	return n
}

// waitHello waits for the n-th session of version to be attached.
func (gw *updateGateway) waitHello(version string, n int) {
	gw.wait(fmt.Sprintf("hello #%d from bcd %s", n, version), 20*time.Second, func() bool {
		gw.mu.Lock()
		attached := gw.conn != nil && gw.conn.Hello.DaemonVersion == version
		gw.mu.Unlock()
		return attached && gw.hellos(version) >= n
	})
}

func (gw *updateGateway) waitSection(revision int64, state, version string) protocol.SectionStatus {
	var found protocol.SectionStatus
	gw.wait(fmt.Sprintf("daemon section %d %s (%s)", revision, state, version), 20*time.Second, func() bool {
		for _, f := range gw.all() {
			var ev protocol.Event
			var st protocol.SectionStatus
			if f.Type != protocol.FrameEvent || f.Decode(&ev) != nil || ev.Kind != protocol.EventSectionStatus || json.Unmarshal(ev.Data, &st) != nil {
				continue
			}
			if st.Section == protocol.SectionDaemon && st.Revision == revision && st.State == state && st.Version == version {
				found = st
				return true
			}
		}
		return false
	})
	return found
}

func (gw *updateGateway) waitStatus(id, state string) protocol.Status {
	var found protocol.Status
	gw.wait(fmt.Sprintf("%s %s", id, state), 20*time.Second, func() bool {
		for _, f := range gw.all() {
			var st protocol.Status
			if f.Type == protocol.FrameStatus && f.Decode(&st) == nil && st.CommandID == id && st.State == state {
				found = st
				return true
			}
		}
		return false
	})
	return found
}

func (gw *updateGateway) wait(what string, timeout time.Duration, cond func() bool) {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			gw.fail("no %s within %s", what, timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
