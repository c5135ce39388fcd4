package ramdisk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

const testMAC = "52:54:00:12:34:56"

// noSystem is a machine that is ready: nothing to mount, load or configure.
type noSystem struct{ networks atomic.Int32 }

func (*noSystem) Prepare(context.Context, *slog.Logger) error { return nil }
func (s *noSystem) Network(context.Context, *slog.Logger) error {
	s.networks.Add(1)
	return nil
}

// gateway is agenttest's gateway driven for the ramdisk: it records every status by
// command, acknowledges statuses and events (unless told not to), and hands the
// test the connection to send commands on.
type gateway struct {
	*agenttest.Gateway
	conns chan *agenttest.Conn

	mu       sync.Mutex
	statuses map[string][]protocol.Status
	events   []protocol.Event
	lastAck  uint64
	changed  chan struct{}
	noAck    atomic.Bool
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{Gateway: agenttest.New(t), conns: make(chan *agenttest.Conn, 4),
		statuses: map[string][]protocol.Status{}, changed: make(chan struct{}, 1)}
	g.Nonces[nonce] = agenttest.Nonce{MAC: testMAC, Site: "fsn1", NodeID: "ramdisk_1"}
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		g.conns <- c
		for {
			f, err := c.Read(ctx)
			if err != nil {
				return
			}
			switch f.Type {
			case protocol.FrameStatus:
				var st protocol.Status
				_ = f.Decode(&st)
				g.mu.Lock()
				g.statuses[st.CommandID] = append(g.statuses[st.CommandID], st)
				g.mu.Unlock()
			case protocol.FrameEvent:
				var ev protocol.Event
				_ = f.Decode(&ev)
				g.mu.Lock()
				g.events = append(g.events, ev)
				g.mu.Unlock()
			default:
				continue
			}
			if !g.noAck.Load() {
				// Recorded before the send: the agent may act on the ack
				// before Send returns here.
				seq := agenttest.Seq(f)
				g.mu.Lock()
				g.lastAck = max(g.lastAck, seq)
				g.mu.Unlock()
				if err := c.Send(ctx, protocol.FrameAck, protocol.Ack{Seq: seq}); err != nil {
					return
				}
			}
			select {
			case g.changed <- struct{}{}:
			default:
			}
		}
	}
	return g
}

func (g *gateway) acked() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastAck
}

func (g *gateway) statusesOf(id string) []protocol.Status {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]protocol.Status(nil), g.statuses[id]...)
}

func (g *gateway) eventsSoFar() []protocol.Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]protocol.Event(nil), g.events...)
}

// terminal waits for command id's terminal status and returns all its statuses.
func (g *gateway) terminal(t *testing.T, id string) []protocol.Status {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		sts := g.statusesOf(id)
		if len(sts) > 0 && protocol.Terminal(sts[len(sts)-1].State) {
			return sts
		}
		select {
		case <-g.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("command %s: no terminal status; got %+v", id, sts)
		}
	}
}

func (g *gateway) params() Params {
	return Params{
		GatewayURL: g.URL,
		ServerName: "127.0.0.1",
		Site:       "fsn1",
		Pins:       g.Pins,
		BootNonce:  nonce,
		LogLevel:   slog.LevelDebug,
	}
}

// fakeMachine records what it is asked and what the gateway had acknowledged then.
type fakeMachine struct {
	g       *gateway
	mu      sync.Mutex
	calls   []string
	ackedAt []uint64
	err     error
}

func (m *fakeMachine) record(what string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, what)
	m.ackedAt = append(m.ackedAt, m.g.acked())
	return m.err
}

func (m *fakeMachine) KexecLoad(kernel, initrd *os.File, cmdline string) error {
	return m.record("kexec-load")
}
func (m *fakeMachine) KexecExec() error { return m.record("kexec") }
func (m *fakeMachine) Reboot() error    { return m.record("reboot") }
func (m *fakeMachine) PowerOff() error  { return m.record("poweroff") }

func (m *fakeMachine) called() ([]string, []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.calls...), append([]uint64(nil), m.ackedAt...)
}

// fakeDeployer reports progress like deploy does and finishes through the machine.
type fakeDeployer struct {
	m *fakeMachine
}

// badDigest is the image digest fakeDeployer fails on, as deploy fails a mismatch.
var badDigest = strings.Repeat("00", 32)

func (d *fakeDeployer) Deploy(ctx context.Context, p deploy.Request, progress func(deploy.Progress)) (deploy.Result, error) {
	total := p.Image.Size
	for _, pr := range []deploy.Progress{
		{Stage: deploy.StageSelect, Total: total},
		{Stage: deploy.StageWrite, Done: total / 2, Total: total, Rate: 1e6},
		{Stage: deploy.StageWrite, Done: total, Total: total, Rate: 2e6},
		{Stage: deploy.StageDone, Done: total, Total: total, Rate: 2e6},
	} {
		progress(pr)
	}
	if p.Image.SHA256 == badDigest {
		return deploy.Result{}, &deploy.Error{Reason: protocol.DeployReasonDigest, Err: errors.New("deploy: sha256 mismatch")}
	}
	res := deploy.Result{Target: deploy.Disk{Path: "/dev/vda"}, ImageSize: total, Size: total, SHA256: p.Image.SHA256, After: p.After.Action}
	if res.After == "" {
		res.After = protocol.AfterNone
	}
	if res.After == protocol.AfterKexec {
		res.Kernel = "root:/boot/vmlinuz"
		if err := d.m.KexecLoad(nil, nil, ""); err != nil {
			return deploy.Result{}, err
		}
	}
	return res, nil
}

func (d *fakeDeployer) Finish(r deploy.Result) error {
	switch r.After {
	case protocol.AfterKexec:
		return d.m.KexecExec()
	case protocol.AfterReboot:
		return d.m.Reboot()
	case protocol.AfterPowerOff:
		return d.m.PowerOff()
	}
	return nil
}

// loaderDeployer also loads an installed OS's kernel, as deploy.Deployer does.
type loaderDeployer struct {
	fakeDeployer
	asked []deploy.After
}

func (d *loaderDeployer) LoadInstalled(ctx context.Context, sel deploy.Target, after deploy.After) (deploy.Result, error) {
	d.asked = append(d.asked, after)
	if sel.Serial == "missing" {
		return deploy.Result{}, &deploy.Error{Reason: protocol.DeployReasonNoDisk, Err: errors.New("deploy: target: 0 disks report serial")}
	}
	if err := d.m.KexecLoad(nil, nil, ""); err != nil {
		return deploy.Result{}, err
	}
	return deploy.Result{Target: deploy.Disk{Path: "/dev/vda"}, After: protocol.AfterKexec, Kernel: "root:/boot/vmlinuz-6.1"}, nil
}

type harness struct {
	g       *gateway
	a       *Agent
	m       *fakeMachine
	console *syncbuf.Buffer
	done    chan error
	cancel  context.CancelFunc
	conn    *agenttest.Conn
}

func newHarness(t *testing.T, g *gateway, edit func(*Agent)) *harness {
	t.Helper()
	m := &fakeMachine{g: g}
	d := &fakeDeployer{m: m}
	console := &syncbuf.Buffer{}
	fast := agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	a := &Agent{
		Params:       g.params(),
		Logger:       NewLogger(console, slog.LevelDebug),
		DataDir:      filepath.Join(t.TempDir(), "run-bcd"),
		System:       &noSystem{},
		Claims:       func(context.Context) protocol.Claims { return protocol.Claims{MACs: []string{testMAC}, CPUs: 2} },
		Deployer:     d,
		Machine:      m,
		DCGMI:        "-",
		BootID:       func() (string, error) { return "boot-1", nil },
		FlushTimeout: 5 * time.Second,
		Backoff:      fast,
		JoinBackoff:  fast,
		MaxDeferral:  10 * time.Millisecond,
	}
	if edit != nil {
		edit(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{g: g, a: a, m: m, console: console, done: make(chan error, 1), cancel: cancel}
	go func() { h.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("the agent did not stop")
		}
		if t.Failed() {
			t.Logf("console:\n%s", console.String())
		}
	})
	return h
}

// session waits for the agent's session and returns it.
func (h *harness) session(t *testing.T) *agenttest.Conn {
	t.Helper()
	if h.conn != nil {
		return h.conn
	}
	select {
	case h.conn = <-h.g.conns:
		return h.conn
	case err := <-h.done:
		t.Fatalf("the agent ended before its session: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("no session")
	}
	return nil
}

func (h *harness) send(t *testing.T, id, kind string, params any) []protocol.Status {
	t.Helper()
	c := h.session(t)
	cmd := protocol.Command{ID: id, Kind: kind}
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Params = b
	}
	if err := c.Send(context.Background(), protocol.FrameCommand, cmd); err != nil {
		t.Fatal(err)
	}
	return h.g.terminal(t, id)
}

func (h *harness) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-h.done:
		h.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the agent did not end")
	}
	return nil
}

func states(sts []protocol.Status) string {
	var s []string
	for _, st := range sts {
		s = append(s, st.State)
	}
	return strings.Join(s, ",")
}

func imageParams(after string) protocol.DeployImageParams {
	return protocol.DeployImageParams{
		Image: protocol.DeployImage{URL: "https://images.example.com/debian.raw?token=secret", SHA256: strings.Repeat("ab", 32), Size: 4 << 20},
		After: protocol.DeployAfter{Action: after},
	}
}

func TestCommands(t *testing.T) {
	g := newGateway(t)
	disk := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte{0xff}, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dcgmi := filepath.Join(t.TempDir(), "dcgmi")
	script := "#!/bin/sh\nprintf '{\"args\":\"%s\"}\\n' \"$*\"\n"
	if err := os.WriteFile(dcgmi, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, g, func(a *Agent) {
		a.DCGMI = dcgmi
		a.Disks = func() ([]deploy.Disk, error) {
			return []deploy.Disk{{Name: "vda", Path: disk, Size: 4 << 20, Serial: "SERIAL1"}}, nil
		}
	})

	h.session(t)
	// The join: discovery, the nonce, the MACs, no token.
	joins := g.Joins()
	if len(joins) != 1 || joins[0].Attestor != protocol.AttestorDiscovery || joins[0].Role != protocol.RoleRamdisk ||
		joins[0].BootNonce != nonce || joins[0].SealedToken != "" || joins[0].Claims.MACs[0] != testMAC {
		t.Fatalf("join requests: %+v", joins)
	}
	if hello := h.session(t).Hello; hello.Role != protocol.RoleRamdisk || hello.NodeID != "ramdisk_1" || hello.BootID != "boot-1" {
		t.Fatalf("hello: %+v", hello)
	}

	sts := h.send(t, "c1", protocol.KindInventory, nil)
	if states(sts) != "RUNNING,SUCCEEDED" {
		t.Fatalf("inventory: %+v", sts)
	}
	var claims protocol.Claims
	if err := json.Unmarshal(sts[1].Result, &claims); err != nil || claims.MACs[0] != testMAC {
		t.Fatalf("inventory result %s: %v", sts[1].Result, err)
	}

	for _, kind := range []string{protocol.KindNodeReboot, "no.such.kind", protocol.KindBMCPower} {
		sts = h.send(t, "u-"+kind, kind, nil)
		if states(sts) != "UNSUPPORTED" {
			t.Fatalf("%s: %+v", kind, sts)
		}
	}

	sts = h.send(t, "c3", protocol.KindDiagDCGM, protocol.DiagDCGMParams{Level: 2})
	if states(sts) != "RUNNING,SUCCEEDED" || string(sts[1].Result) != `{"args":"diag -r 2 -j"}` {
		t.Fatalf("diag.dcgm: %+v", sts)
	}
	sts = h.send(t, "c3b", protocol.KindDiagDCGM, map[string]int{"level": 9})
	if states(sts) != "FAILED" || sts[0].Reason != protocol.RamdiskReasonInvalid {
		t.Fatalf("diag.dcgm level 9: %+v", sts)
	}

	sts = h.send(t, "c4", protocol.KindDiskWipe, protocol.DiskWipeParams{})
	if states(sts) != "FAILED" || !strings.Contains(sts[0].Message, "name the disk") {
		t.Fatalf("disk.wipe without a disk: %+v", sts)
	}
	sts = h.send(t, "c4b", protocol.KindDiskWipe, map[string]any{"disk": map[string]string{"serial": "SERIAL1"}, "force": true})
	if states(sts) != "FAILED" || !strings.Contains(sts[0].Message, "unknown field") {
		t.Fatalf("disk.wipe with an unknown field: %+v", sts)
	}
	sts = h.send(t, "c5", protocol.KindDiskWipe, protocol.DiskWipeParams{Disk: protocol.DeployTarget{Serial: "SERIAL1"}})
	if states(sts) != "RUNNING,SUCCEEDED" {
		t.Fatalf("disk.wipe: %+v", sts)
	}
	b, _ := os.ReadFile(disk)
	if !bytes.Equal(b[:1<<20], make([]byte, 1<<20)) || !bytes.Equal(b[3<<20:], make([]byte, 1<<20)) || b[2<<20] != 0xff {
		t.Fatal("disk.wipe did not zero the first and last MiB only")
	}

	sts = h.send(t, "c6", protocol.KindDeployImage, imageParams(protocol.AfterNone))
	if st := states(sts); st != "RUNNING,RUNNING,RUNNING,RUNNING,RUNNING,SUCCEEDED" {
		t.Fatalf("deploy.image states %s: %+v", st, sts)
	}
	if strings.Contains(sts[0].Message, "secret") || !strings.Contains(sts[0].Message, "https://images.example.com/debian.raw") {
		t.Fatalf("deploy.image message %q", sts[0].Message)
	}
	if p := sts[3].Progress; p == nil || p.Done != 4<<20 || p.Total != 4<<20 || p.Unit != "bytes" || p.Rate != 2e6 {
		t.Fatalf("progress: %+v", sts[3].Progress)
	}
	var res protocol.DeployImageResult
	if err := json.Unmarshal(sts[5].Result, &res); err != nil || res.Target.Path != "/dev/vda" || res.After != protocol.AfterNone {
		t.Fatalf("deploy result %s: %v", sts[5].Result, err)
	}

	bad := imageParams(protocol.AfterKexec)
	bad.Image.SHA256 = badDigest
	sts = h.send(t, "c7", protocol.KindDeployImage, bad)
	if last := sts[len(sts)-1]; last.State != protocol.StateFailed || last.Reason != protocol.DeployReasonDigest {
		t.Fatalf("failed deploy: %+v", sts)
	}
	sts = h.send(t, "c8", protocol.KindDeployImage, map[string]any{"image": map[string]string{"url": "ftp://x"}})
	if states(sts) != "FAILED" || sts[0].Reason != protocol.DeployReasonInvalid {
		t.Fatalf("invalid deploy: %+v", sts)
	}
	sts = h.send(t, "c9", protocol.KindMachineKexec, nil)
	if states(sts) != "RUNNING,FAILED" || sts[1].Reason != protocol.RamdiskReasonNotImplemented {
		t.Fatalf("machine.kexec with no kernel: %+v", sts)
	}
	if calls, _ := h.m.called(); len(calls) != 0 {
		t.Fatalf("the machine was asked for %v", calls)
	}

	// The deploy that kexecs: SUCCEEDED is acknowledged before the jump.
	sts = h.send(t, "c10", protocol.KindDeployImage, imageParams(protocol.AfterKexec))
	if last := sts[len(sts)-1]; last.State != protocol.StateSucceeded {
		t.Fatalf("deploy with kexec: %+v", sts)
	}
	if err := h.wait(t); err != nil {
		t.Fatalf("Run after the kexec: %v", err)
	}
	calls, ackedAt := h.m.called()
	if strings.Join(calls, ",") != "kexec-load,kexec" {
		t.Fatalf("machine calls: %v", calls)
	}
	if last := sts[len(sts)-1]; ackedAt[1] < last.Seq {
		t.Fatalf("kexec with ack %d, before the gateway acknowledged SUCCEEDED (seq %d)", ackedAt[1], last.Seq)
	}

	// What the agent logged reached the control plane as events.
	var sawStart bool
	for _, ev := range g.eventsSoFar() {
		if ev.Kind == protocol.EventLog && ev.Message == "bcd ramdisk starting" {
			sawStart = true
			if strings.Contains(string(ev.Data), nonce) {
				t.Fatalf("the nonce reached an event: %s", ev.Data)
			}
		}
	}
	if !sawStart {
		t.Fatalf("no log event for the start among %d events", len(g.eventsSoFar()))
	}
	if strings.Contains(h.console.String(), nonce) || strings.Contains(h.console.String(), "token=secret") {
		t.Fatal("the console shows the nonce or the image URL's query")
	}
}

func TestMachineCommandsWaitForTheAck(t *testing.T) {
	for _, tc := range []struct {
		kind, call string
	}{
		{protocol.KindMachineReboot, "reboot"},
		{protocol.KindMachineOff, "poweroff"},
		{protocol.KindDeployImage, "reboot"},
	} {
		t.Run(tc.kind+"-"+tc.call, func(t *testing.T) {
			g := newGateway(t)
			h := newHarness(t, g, nil)
			var params any
			if tc.kind == protocol.KindDeployImage {
				params = imageParams(protocol.AfterReboot)
			}
			sts := h.send(t, "m1", tc.kind, params)
			last := sts[len(sts)-1]
			if sts[0].State != protocol.StateRunning || last.State != protocol.StateSucceeded {
				t.Fatalf("statuses: %+v", sts)
			}
			if err := h.wait(t); err != nil {
				t.Fatal(err)
			}
			calls, ackedAt := h.m.called()
			if len(calls) != 1 || calls[0] != tc.call || ackedAt[0] < last.Seq {
				t.Fatalf("calls %v with ack %v; SUCCEEDED is seq %d", calls, ackedAt, last.Seq)
			}
		})
	}
}

func TestMachineKexecLoadsTheInstalledKernel(t *testing.T) {
	g := newGateway(t)
	var d *loaderDeployer
	h := newHarness(t, g, func(a *Agent) {
		d = &loaderDeployer{fakeDeployer: fakeDeployer{m: a.Machine.(*fakeMachine)}}
		a.Deployer = d
	})
	sts := h.send(t, "k1", protocol.KindMachineKexec, protocol.MachineKexecParams{Target: protocol.DeployTarget{Serial: "missing"}})
	if states(sts) != "RUNNING,FAILED" || sts[1].Reason != protocol.DeployReasonNoDisk {
		t.Fatalf("kexec of a missing disk: %+v", sts)
	}
	sts = h.send(t, "k2", protocol.KindMachineKexec, protocol.MachineKexecParams{Target: protocol.DeployTarget{Serial: "S1"}, Cmdline: "ro quiet"})
	if states(sts) != "RUNNING,SUCCEEDED" || !strings.Contains(sts[1].Message, "vmlinuz-6.1") {
		t.Fatalf("kexec: %+v", sts)
	}
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	calls, ackedAt := h.m.called()
	if strings.Join(calls, ",") != "kexec-load,kexec" || ackedAt[1] < sts[1].Seq {
		t.Fatalf("calls %v, acked %v, SUCCEEDED seq %d", calls, ackedAt, sts[1].Seq)
	}
	if len(d.asked) != 2 || d.asked[1].Cmdline != "ro quiet" {
		t.Fatalf("LoadInstalled got %+v", d.asked)
	}
}

func TestMachineGoesDownWithoutAckAfterTheTimeout(t *testing.T) {
	g := newGateway(t)
	h := newHarness(t, g, func(a *Agent) { a.FlushTimeout = 300 * time.Millisecond })
	h.session(t)
	g.noAck.Store(true)
	start := time.Now()
	h.send(t, "m1", protocol.KindMachineOff, nil)
	if err := h.wait(t); err != nil {
		t.Fatal(err)
	}
	if calls, _ := h.m.called(); len(calls) != 1 || calls[0] != "poweroff" {
		t.Fatalf("calls %v", calls)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("powered off after %s, without waiting for the ack", d)
	}
}

func TestDiagWithoutDCGMI(t *testing.T) {
	h := newHarness(t, newGateway(t), nil)
	sts := h.send(t, "d1", protocol.KindDiagDCGM, nil)
	if states(sts) != "UNSUPPORTED" || sts[0].Message != MsgNoDCGMI {
		t.Fatalf("diag.dcgm without dcgmi: %+v", sts)
	}
}

func TestMachineThatStaysUpKeepsTheAgent(t *testing.T) {
	g := newGateway(t)
	h := newHarness(t, g, func(a *Agent) {
		a.Machine.(*fakeMachine).err = errors.New("reboot: operation not permitted")
	})
	h.send(t, "m1", protocol.KindMachineReboot, nil)
	// Still running: the next command is answered.
	if sts := h.send(t, "m2", protocol.KindInventory, nil); states(sts) != "RUNNING,SUCCEEDED" {
		t.Fatalf("after a failed reboot: %+v", sts)
	}
	select {
	case err := <-h.done:
		t.Fatalf("Run ended: %v", err)
	default:
	}
}

func TestDiscoveryDeferralRetriesTheSameCSR(t *testing.T) {
	g := newGateway(t)
	g.Defer = 2
	h := newHarness(t, g, nil)
	h.session(t)
	joins := g.Joins()
	if len(joins) != 3 {
		t.Fatalf("%d join requests, want 3", len(joins))
	}
	for _, j := range joins[1:] {
		if j.CSR != joins[0].CSR {
			t.Fatal("a deferred join was retried with another CSR")
		}
	}
	if !strings.Contains(h.console.String(), "WAITING FOR APPROVAL") {
		t.Fatalf("the console does not say the machine waits for approval:\n%s", h.console.String())
	}
	// The identity is on the data directory, 0600.
	fi, err := os.Stat(filepath.Join(h.a.DataDir, agent.KeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("node.key: %v %v", fi, err)
	}
}

func TestRefusedJoinEndsTheAgent(t *testing.T) {
	g := newGateway(t)
	delete(g.Nonces, nonce)
	h := newHarness(t, g, nil)
	err := h.wait(t)
	if err == nil || !strings.Contains(err.Error(), protocol.CodeAttestorRefused) {
		t.Fatalf("Run: %v", err)
	}
	if strings.Contains(err.Error(), nonce) {
		t.Fatal("the error repeats the nonce")
	}
}

func TestAlreadyJoinedInThisBoot(t *testing.T) {
	g := newGateway(t)
	dir := filepath.Join(t.TempDir(), "run-bcd")
	g.Identity(t, dir, protocol.RoleRamdisk, "ramdisk_9")
	h := newHarness(t, g, func(a *Agent) { a.DataDir = dir })
	if hello := h.session(t).Hello; hello.NodeID != "ramdisk_9" {
		t.Fatalf("hello %+v", hello)
	}
	if n := len(g.Joins()); n != 0 {
		t.Fatalf("%d joins: the nonce was spent again", n)
	}
}

// connectProxy is a tiny HTTP CONNECT proxy on 127.0.0.1 that tunnels only to
// 127.0.0.1 and records where it was asked to go.
type connectProxy struct {
	URL *url.URL
	mu  sync.Mutex
	to  []string
}

func (p *connectProxy) targets() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.to...)
}

func startProxy(t *testing.T) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{URL: &url.URL{Scheme: "http", Host: ln.Addr().String()}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		if host, _, err := net.SplitHostPort(r.Host); err != nil || host != "127.0.0.1" {
			http.Error(w, "only 127.0.0.1", http.StatusForbidden)
			return
		}
		p.mu.Lock()
		p.to = append(p.to, r.Host)
		p.mu.Unlock()
		up, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer up.Close()
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
		go func() {
			io.Copy(up, brw)
			up.(*net.TCPConn).CloseWrite()
		}()
		io.Copy(conn, up)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return p
}

func TestJoinAndSessionThroughTheProxy(t *testing.T) {
	g := newGateway(t)
	proxy := startProxy(t)
	h := newHarness(t, g, func(a *Agent) { a.Params.Proxy = proxy.URL })
	if sts := h.send(t, "p1", protocol.KindInventory, nil); states(sts) != "RUNNING,SUCCEEDED" {
		t.Fatalf("inventory through the proxy: %+v", sts)
	}
	gw, _ := url.Parse(g.URL)
	var n int
	for _, to := range proxy.targets() {
		if to != gw.Host {
			t.Fatalf("the proxy was asked for %s, not the gateway %s", to, gw.Host)
		}
		n++
	}
	// One tunnel for the join, one for the session.
	if n < 2 {
		t.Fatalf("%d tunnels through the proxy, want the join's and the session's", n)
	}
}

func TestProxyRefusalIsAnError(t *testing.T) {
	proxy := startProxy(t)
	dial := agent.ProxyDialer(proxy.URL, nil)
	_, err := dial(context.Background(), "tcp", "192.0.2.1:443")
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("CONNECT to a forbidden host: %v", err)
	}
	// A proxy that is not there fails fast with its address.
	dead := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	_, err = agent.ProxyDialer(dead, nil)(context.Background(), "tcp", "127.0.0.1:443")
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("dead proxy: %v", err)
	}
}

func TestUnreachableGatewayRetriesTheNetwork(t *testing.T) {
	g := newGateway(t)
	// A port nothing listens on, then the real gateway: the probe fails, the
	// network is brought up again, and the test swaps the URL back.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := ln.Addr().String()
	ln.Close()
	sys := &noSystem{}
	a := &Agent{Params: g.params(), System: sys, Backoff: agent.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		NetworkRetry: 20 * time.Millisecond}
	a.Params.GatewayURL = "https://" + deadAddr
	a.console = slog.New(slog.DiscardHandler)
	a.log = a.console
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := a.reachGateway(ctx, sys); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("reachGateway: %v", err)
	}
	if n := sys.networks.Load(); n < 2 {
		t.Fatalf("the network was brought up %d times, want again after NetworkRetry", n)
	}
	a.Params.GatewayURL = g.URL
	if err := a.reachGateway(context.Background(), sys); err != nil {
		t.Fatal(err)
	}
}

func TestEventDataFlattensAttributes(t *testing.T) {
	sink := newEventSink()
	console := &syncbuf.Buffer{}
	log := slog.New(newForwardHandler(NewLogger(console, slog.LevelWarn).Handler(), sink))
	log.With("a", 1).WithGroup("g").Info("hello", "err", errors.New("boom"), "d", time.Second, slog.Group("x", "y", true))
	log.Debug("not forwarded")
	sink.close()
	var evs []protocol.Event
	for ev := range sink.ch {
		evs = append(evs, ev)
	}
	if len(evs) != 1 || evs[0].Message != "hello" || evs[0].Level != "INFO" {
		t.Fatalf("events %+v", evs)
	}
	want := `{"a":1,"g.d":"1s","g.err":"boom","g.x.y":true}`
	if string(evs[0].Data) != want {
		t.Fatalf("data %s, want %s", evs[0].Data, want)
	}
	if console.String() != "" {
		t.Fatalf("an info line reached a warn console: %s", console.String())
	}
}

// A join that overtakes the site's boot.nonce event is refused NONCE_UNKNOWN
// (retryable, as serve marks it): the ramdisk asks again and joins.
func TestNonceUnknownIsAskedAgain(t *testing.T) {
	g := newGateway(t)
	g.NonceUnknown = 3
	h := newHarness(t, g, nil)
	h.session(t)
	if n := len(g.Joins()); n != 4 {
		t.Fatalf("%d join requests, want 4 (3 refused NONCE_UNKNOWN, then the join)", n)
	}
}

// The same race with a control plane that does not mark NONCE_UNKNOWN
// retryable: the ramdisk still asks again, saying why on the console, and joins.
func TestNonceUnknownUnflaggedIsAskedAgain(t *testing.T) {
	g := newGateway(t)
	g.NonceUnknown, g.NonceUnknownUnflagged = 3, true
	h := newHarness(t, g, nil)
	h.session(t)
	if n := len(g.Joins()); n != 4 {
		t.Fatalf("%d join requests, want 4 (3 refused NONCE_UNKNOWN, then the join)", n)
	}
	if c := h.console.String(); strings.Count(c, "does not know this boot's nonce yet") != 3 {
		t.Fatalf("the console does not say three times why the join is asked again:\n%s", c)
	}
}

// A nonce that stays unknown is asked again only for NonceWait: then the
// refusal is final and the agent ends, saying how long it waited.
func TestNonceUnknownForTooLongEndsTheAgent(t *testing.T) {
	g := newGateway(t)
	g.NonceUnknown, g.NonceUnknownUnflagged = 1<<30, true
	start := time.Now()
	h := newHarness(t, g, func(a *Agent) { a.NonceWait = 300 * time.Millisecond })
	err := h.wait(t)
	if err == nil || !strings.Contains(err.Error(), protocol.CodeNonceUnknown) || !strings.Contains(err.Error(), "still unknown after") {
		t.Fatalf("Run: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 10*time.Second {
		t.Fatalf("the agent ended after %s, want just after NonceWait (300ms)", d)
	}
	if n := len(g.Joins()); n < 2 {
		t.Fatalf("%d join requests: the refusal was not asked again", n)
	}
}
