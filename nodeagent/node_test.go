package nodeagent

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/nodeagent/helper"
	"github.com/better-compute/bcd/protocol"
)

type nodeFixture struct {
	g       *agenttest.Gateway
	cfgPath string
	cfg     *config.Config
	dataDir string
}

func newNodeFixture(t *testing.T, role string) *nodeFixture {
	t.Helper()
	g := agenttest.New(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	g.Identity(t, dataDir, role, "node_a")
	path := g.WriteConfig(t, t.TempDir(), dataDir)
	cfg, err := config.Load(path, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &nodeFixture{g: g, cfgPath: path, cfg: cfg, dataDir: dataDir}
}

// start runs a Node ("a process") until stop is called; stop waits for Run.
func (f *nodeFixture) start(t *testing.T, bootID string, reboot Rebooter) (n *Node, stop func() error) {
	t.Helper()
	n = &Node{
		Config:   f.cfg,
		Rebooter: reboot,
		BootID:   func() (string, error) { return bootID, nil },
		Claims:   func(context.Context) protocol.Claims { return protocol.Claims{Hostname: "test"} },
		Backoff:  agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}
	listening := make(chan struct{})
	n.Listening = func(string) { close(listening) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-listening:
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("node did not start")
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return n, stop
}

// statuses collects every status the gateway receives, acknowledging each.
type statuses struct {
	mu  sync.Mutex
	all []protocol.Status
}

func (s *statuses) record(f protocol.Frame) {
	if f.Type != protocol.FrameStatus {
		return
	}
	var st protocol.Status
	if f.Decode(&st) == nil {
		s.mu.Lock()
		s.all = append(s.all, st)
		s.mu.Unlock()
	}
}

func (s *statuses) find(cmdID, state string) *protocol.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.all {
		if s.all[i].CommandID == cmdID && s.all[i].State == state {
			return &s.all[i]
		}
	}
	return nil
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testReboot(t *testing.T, newBootID, wantState, wantMessage string) {
	f := newNodeFixture(t, protocol.RoleNode)
	var got statuses
	var sentOnce sync.Once
	f.g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		sentOnce.Do(func() {
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_reboot", Kind: protocol.KindNodeReboot})
		})
		agenttest.AckAll(ctx, c, got.record)
	}
	rebooted := make(chan struct{})
	fake := RebooterFunc(func() error { close(rebooted); return nil })
	_, stop := f.start(t, "boot-1", fake)
	select {
	case <-rebooted:
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not reboot")
	}
	if got.find("cmd_reboot", protocol.StateRunning) == nil {
		t.Error("no RUNNING before the reboot")
	}
	// The machine goes down: the process ends.
	if err := stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	// The next process, after the restart.
	f.start(t, newBootID, RebooterFunc(func() error { t.Error("rebooted again"); return nil }))
	waitFor(t, "the end of node.reboot", func() bool { return got.find("cmd_reboot", wantState) != nil })
	st := got.find("cmd_reboot", wantState)
	if !strings.Contains(st.Message, wantMessage) {
		t.Errorf("status = %+v, want message %q", st, wantMessage)
	}
	if f.g.Hellos()[1].BootID != newBootID {
		t.Errorf("second hello boot id = %q", f.g.Hellos()[1].BootID)
	}
}

func TestRebootSucceedsWithNewBootID(t *testing.T) {
	testReboot(t, "boot-2", protocol.StateSucceeded, "rebooted")
}

func TestRebootFailsWithSameBootID(t *testing.T) {
	testReboot(t, "boot-1", protocol.StateFailed, "the node did not reboot")
}

func TestRebootErrorIsFailed(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	var got statuses
	f.g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_reboot", Kind: protocol.KindNodeReboot})
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_power", Kind: protocol.KindBMCPower})
		agenttest.AckAll(ctx, c, got.record)
	}
	f.start(t, "boot-1", RebooterFunc(func() error { return os.ErrPermission }))
	waitFor(t, "FAILED", func() bool { return got.find("cmd_reboot", protocol.StateFailed) != nil })
	waitFor(t, "UNSUPPORTED bmc.power", func() bool { return got.find("cmd_power", protocol.StateUnsupported) != nil })
}

// TestDaemonUpgradeWithoutReleasePins: bcd node runs daemon.upgrade, and
// without [update] release_pins refuses every release before anything else.
func TestDaemonUpgradeWithoutReleasePins(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	var got statuses
	params, _ := json.Marshal(protocol.DaemonSection{Version: "9.9.9", URL: "https://127.0.0.1:1/bcd", SHA256: strings.Repeat("a", 64), Signature: "{}"})
	f.g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_upgrade", Kind: protocol.KindDaemonUpgrade, Params: params})
		agenttest.AckAll(ctx, c, got.record)
	}
	f.start(t, "boot-1", nil)
	waitFor(t, "FAILED daemon.upgrade", func() bool { return got.find("cmd_upgrade", protocol.StateFailed) != nil })
	st := got.find("cmd_upgrade", protocol.StateFailed)
	if st.Reason != protocol.CommandReasonReleaseRefused || !strings.HasPrefix(st.Message, "NO_RELEASE_PINS: ") {
		t.Errorf("status = %+v, want release-refused NO_RELEASE_PINS", st)
	}
	if got.find("cmd_upgrade", protocol.StateRunning) == nil {
		t.Error("no RUNNING before the refusal")
	}
}

func TestNodeRefusesAnotherRole(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleSite)
	err := (&Node{Config: f.cfg, BootID: func() (string, error) { return "b", nil }}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "only a node identity") {
		t.Fatalf("Run with a site identity = %v", err)
	}
}

func TestNodeRefusesForeignJournal(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	j, err := journal.Open(JournalPath(f.cfg), "node_old", journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	err = (&Node{Config: f.cfg, BootID: func() (string, error) { return "b", nil }}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "the journal belongs to node node_old, not node_a") {
		t.Fatalf("Run with another node's journal = %v", err)
	}
}

func TestNodeNotJoined(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	f.cfg.DataDir = t.TempDir()
	err := (&Node{Config: f.cfg}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "run bcd join first") {
		t.Fatalf("Run without an identity = %v", err)
	}
}

func unixClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		},
	}, Timeout: 5 * time.Second}
}

func TestStatusSocket(t *testing.T) {
	for _, underHelper := range []bool{false, true} {
		f := newNodeFixture(t, protocol.RoleNode)
		sock := SocketPath(f.cfg)
		if underHelper {
			f.cfg.Helper = &config.Helper{User: "bcd", Socket: standInHelper(t)}
		}
		// A stale socket from a crashed run: nobody answers, so it is replaced.
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()

		f.start(t, "boot-1", nil)
		fi, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if underHelper {
			want = 0o660
		}
		if fi.Mode().Perm() != want {
			t.Errorf("underHelper=%v: socket mode %04o, want %04o", underHelper, fi.Mode().Perm(), want)
		}
		client := unixClient(sock)
		var st Status
		waitFor(t, "connected", func() bool {
			resp, err := client.Get("http://bcd" + StatusPath)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			st = Status{}
			json.NewDecoder(resp.Body).Decode(&st)
			return st.Connected
		})
		if st.NodeID != "node_a" || st.Role != "node" || st.State != protocol.NodeReady || st.Gateway != f.g.URL ||
			st.Version != version.Version || st.BootID != "boot-1" {
			t.Errorf("status = %+v", st)
		}
		// A second node on the same socket is refused while the first serves.
		_, err = listenStatus(sock, false)
		if err == nil || !strings.Contains(err.Error(), "already running") {
			t.Errorf("second listener: %v", err)
		}
	}
}

func TestStatusSocketRefusesNonSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bcd.sock")
	os.WriteFile(path, []byte("not a socket"), 0o600)
	if _, err := listenStatus(path, false); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listenStatus over a file = %v", err)
	}
}

// standInHelper answers update.resume with "no update under way" on a unix
// socket, the one call a node under [helper] makes before its session runs.
// It stands in for bcd helper (nodeagent/helper's tests and internal/e2e run
// the real one); every other operation fails the test.
func standInHelper(t *testing.T) string {
	return standInHelperWith(t, nil)
}

// standInHelperWith is standInHelper that also answers reboot with reboot's
// status and error (0: the operation is unexpected).
func standInHelperWith(t *testing.T, reboot func() (int, *helper.Error)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case helper.PathPrefix + helper.OpUpdateResume:
			json.NewEncoder(w).Encode(helper.OutcomeResponse{Outcome: selfupdate.Outcome{State: selfupdate.None}})
			return
		case helper.PathPrefix + helper.OpReboot:
			if reboot != nil {
				status, e := reboot()
				w.WriteHeader(status)
				if e != nil {
					json.NewEncoder(w).Encode(e)
				} else {
					w.Write([]byte("{}"))
				}
				return
			}
		}
		t.Errorf("the node called %s on the stand-in helper", r.URL.Path)
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(helper.Error{Code: helper.CodeUnknownOp, Message: "not in this stand-in"})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestRebootThroughHelper: under [helper], node.reboot is the helper's
// reboot operation; the helper's answer decides RUNNING (the machine goes
// down) or FAILED with the helper's reason.
func TestRebootThroughHelper(t *testing.T) {
	for _, ok := range []bool{true, false} {
		f := newNodeFixture(t, protocol.RoleNode)
		asked := make(chan struct{}, 1)
		f.cfg.Helper = &config.Helper{User: "bcd", Socket: standInHelperWith(t, func() (int, *helper.Error) {
			asked <- struct{}{}
			if ok {
				return http.StatusOK, nil
			}
			return http.StatusInternalServerError, &helper.Error{Code: helper.CodeFailed, Message: "reboot: the test's helper cannot"}
		})}
		var got statuses
		f.g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "cmd_reboot", Kind: protocol.KindNodeReboot})
			agenttest.AckAll(ctx, c, got.record)
		}
		f.start(t, "boot-1", nil)
		select {
		case <-asked:
		case <-time.After(10 * time.Second):
			t.Fatalf("ok=%v: node.reboot did not reach the helper", ok)
		}
		if ok {
			waitFor(t, "RUNNING", func() bool { return got.find("cmd_reboot", protocol.StateRunning) != nil })
			continue
		}
		waitFor(t, "FAILED", func() bool { return got.find("cmd_reboot", protocol.StateFailed) != nil })
		if st := got.find("cmd_reboot", protocol.StateFailed); !strings.Contains(st.Message, "through bcd helper") || !strings.Contains(st.Message, "the test's helper cannot") {
			t.Errorf("FAILED says %q, want the helper's reason", st.Message)
		}
	}
}

// TestNodeKeyRefusedByHelper: under [helper] a node.key that is a TPM record
// loads through tpm.load; the helper's refusal stops the node with a message
// that names the helper, not a join again (the files are fine).
func TestNodeKeyRefusedByHelper(t *testing.T) {
	f := newNodeFixture(t, protocol.RoleNode)
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var asked []string
	var mu sync.Mutex
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(helper.Error{Code: helper.CodePeerRefused, Message: "the caller runs /elsewhere/bcd: not an installed bcd"})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	f.cfg.Helper = &config.Helper{User: "bcd", Socket: sock}
	record := pem.EncodeToMemory(&pem.Block{Type: tpm.NodeKeyPEMType, Headers: map[string]string{"Version": "1"}, Bytes: []byte("not a key")})
	if err := os.WriteFile(filepath.Join(f.dataDir, agent.KeyFile), record, 0o600); err != nil {
		t.Fatal(err)
	}
	err = (&Node{Config: f.cfg, BootID: func() (string, error) { return "b", nil }}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "the identity does not load") || !strings.Contains(err.Error(), helper.CodePeerRefused) ||
		!strings.Contains(err.Error(), "check that bcd-helper.service runs") || strings.Contains(err.Error(), ResetHint) {
		t.Fatalf("Run with the helper refusing = %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != helper.PathPrefix+helper.OpTPMLoad {
		t.Errorf("the node asked the helper %v, want one tpm.load", asked)
	}
}
