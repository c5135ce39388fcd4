package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"github.com/better-compute/bcd/internal/syncbuf"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// The lifecycle tests run the control plane on its real loopback listeners
// with fake agents that speak the real protocol with real certificates: a
// site agent whose bmc.power cycle "boots" a fake machine (boot stages and a
// nonce reported over the site's session, then a ramdisk that joins with the
// nonce), ramdisks that run deploy.image as each machine's behaviour says,
// and installed OSes that join with the token their deploy.image carried.
// Nothing but the CLI-equivalent api calls drives a step.

// labTimeouts are short enough for tests, long enough for a loaded machine.
const labTimeouts = "bmc=3s,ramdisk=5s,inventory=3s,deploy=10s,install=5s,grace=1s"

// conn is one fake agent's session.
type conn struct {
	t     *testing.T
	agent *cptest.Agent
	res   protocol.JoinResult
	sess  *cptest.Session
	seq   atomic.Uint64
	acked atomic.Uint64
	cmds  chan protocol.Command
	done  chan struct{}
	mu    sync.Mutex
	specs []protocol.Spec
}

func dial(t *testing.T, gw string, roots *x509.CertPool, a *cptest.Agent, res protocol.JoinResult, bootID string) *conn {
	t.Helper()
	s := a.DialBoot(t, gw, roots, res, bootID)
	c := &conn{t: t, agent: a, res: res, sess: s, cmds: make(chan protocol.Command, 64), done: make(chan struct{})}
	go c.read()
	return c
}

func (c *conn) read() {
	defer close(c.done)
	for {
		f, err := c.sess.Read(context.Background())
		if err != nil {
			return
		}
		switch f.Type {
		case protocol.FrameCommand:
			var cmd protocol.Command
			if f.Decode(&cmd) == nil {
				c.cmds <- cmd
			}
		case protocol.FrameAck:
			var a protocol.Ack
			if f.Decode(&a) == nil {
				c.acked.Store(a.Seq)
			}
		case protocol.FrameSpec:
			var s protocol.Spec
			if f.Decode(&s) == nil {
				c.mu.Lock()
				c.specs = append(c.specs, s)
				c.mu.Unlock()
			}
		}
	}
}

// status reports on a command as an agent's journal would: numbered, and
// kept until acknowledged.
func (c *conn) status(st protocol.Status) protocol.Status {
	st.Seq = c.seq.Add(1)
	if st.Time.IsZero() {
		st.Time = time.Now()
	}
	c.sess.Write(protocol.FrameStatus, st)
	return st
}

func (c *conn) event(kind string, data any) {
	b, _ := json.Marshal(data)
	c.sess.Write(protocol.FrameEvent, protocol.Event{Seq: c.seq.Add(1), Kind: kind, Time: time.Now(), Data: b})
}

// flush waits until everything sent is acknowledged, as the ramdisk does
// before it kexecs.
func (c *conn) flush() {
	for deadline := time.Now().Add(5 * time.Second); c.acked.Load() < c.seq.Load() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *conn) lastSpec() protocol.Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.specs) == 0 {
		return protocol.Spec{}
	}
	return c.specs[len(c.specs)-1]
}

// deployFunc is how a fake ramdisk runs deploy.image.
type deployFunc func(l *lab, fm *fakeMachine, rd *conn, c protocol.Command, p protocol.DeployImageParams)

// fakeMachine is a machine of the lab: what a power cycle does and how its
// ramdisks deploy.
type fakeMachine struct {
	id, mac string
	mu      sync.Mutex
	// boots says whether the n-th power cycle (from 1) boots the ramdisk.
	boots   func(n int) bool
	deploy  deployFunc
	cycles  int
	ramdisk *conn
	node    *conn
	// deploys are the deploy.image commands its ramdisks got.
	deploys []protocol.Command
}

func (fm *fakeMachine) set(f func(fm *fakeMachine)) {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	f(fm)
}

func (fm *fakeMachine) deployCommands() []protocol.Command {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	return append([]protocol.Command(nil), fm.deploys...)
}

// lab is a control plane with a fake site agent.
type lab struct {
	t        *testing.T
	pkiDir   string
	dataDir  string
	timeouts string
	s        *Server
	opToken  string
	op       *client.Client
	site     *conn
	// siteKey and siteID sign the ramdisks' witnesses, as bcd site does.
	siteKey  *ecdsa.PrivateKey
	siteID   string
	mu       sync.Mutex
	machines map[string]*fakeMachine
	// bmc are the BMC commands the site agent got, in order.
	bmc []protocol.Command
	// powerFails says whether the n-th bmc.power (from 1) of a machine
	// fails.
	powerFails func(machine string, n int) bool
	// tune changes the Server before each start.
	tune func(*Server)
}

func newLab(t *testing.T, timeouts string) *lab { return newLabWith(t, timeouts, nil) }

func newLabWith(t *testing.T, timeouts string, tune func(*Server)) *lab {
	t.Helper()
	l := &lab{t: t, pkiDir: newPKI(t), dataDir: filepath.Join(t.TempDir(), "data"), timeouts: timeouts, machines: map[string]*fakeMachine{}, tune: tune}
	var out *syncbuf.Buffer
	l.s, out = l.start()
	l.opToken = opToken.FindString(out.String())
	l.op = operator(t, l.s, out)
	if _, err := l.op.CreateSite(ctx, cptest.Site); err != nil {
		t.Fatal(err)
	}
	tok, err := l.op.CreateToken(ctx, apitype.TokenCreate{Pool: "sites", Site: cptest.Site, Role: protocol.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	a := cptest.NewAgent(t)
	jr, er := cptest.PostJoin(t, l.hc(), l.gw(), a.Request(t, l.s.Bundle(), protocol.RoleSite, tok.Token, nil))
	if er != nil {
		t.Fatalf("site join: %+v", er)
	}
	siteRes := a.Verify(t, l.s.Bundle(), jr)
	l.siteKey, l.siteID = a.Key, siteRes.NodeID
	l.site = dial(t, l.gw(), l.roots(), a, siteRes, "site-boot")
	go l.siteLoop(l.site)
	waitFor(t, "the site agent's session", func() bool {
		nodes, _ := l.op.ListNodes(ctx)
		for _, n := range nodes {
			if n.Role == protocol.RoleSite && n.Connected {
				return true
			}
		}
		return false
	})
	return l
}

func (l *lab) start() (*Server, *syncbuf.Buffer) {
	return startServer(l.t, l.pkiDir, l.dataDir, func(s *Server) {
		s.LifecycleTimeouts = l.timeouts
		s.LifecycleTick = 50 * time.Millisecond
		if l.tune != nil {
			l.tune(s)
		}
	})
}

// restart stops the control plane and starts another on the same store.
func (l *lab) restart(down func()) {
	l.t.Helper()
	c, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := l.s.Shutdown(c); err != nil {
		l.t.Fatal(err)
	}
	if down != nil {
		down()
	}
	l.s, _ = l.start()
	op, err := client.New(l.s.APIURL(), l.opToken, l.roots())
	if err != nil {
		l.t.Fatal(err)
	}
	l.op = op
}

func (l *lab) gw() string            { return l.s.AdvertisedGatewayURL() }
func (l *lab) roots() *x509.CertPool { return l.s.Bundle().Public.ServingCAPool() }
func (l *lab) hc() *http.Client      { return cptest.HTTPClient(l.roots(), nil) }
func (l *lab) bmcCommands() []protocol.Command {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]protocol.Command(nil), l.bmc...)
}

// addMachine registers a machine with a BMC that boots on every power
// cycle and deploys successfully, changed by mut.
func (l *lab) addMachine(mac string, uefi bool, mut func(*fakeMachine)) *fakeMachine {
	l.t.Helper()
	pw := "calvin"
	in := apitype.MachineCreate{Site: cptest.Site, MACs: []string{mac}, BMC: &apitype.MachineBMCInput{Address: "10.0.0.5", Username: "root", Password: &pw}}
	if uefi {
		in.Firmware = store.FirmwareUEFI
	}
	m, err := l.op.CreateMachine(ctx, in)
	if err != nil {
		l.t.Fatal(err)
	}
	fm := &fakeMachine{id: m.ID, mac: mac, boots: func(int) bool { return true }, deploy: deployOK}
	if mut != nil {
		mut(fm)
	}
	l.mu.Lock()
	l.machines[m.ID] = fm
	l.mu.Unlock()
	return fm
}

func (l *lab) deploy(fm *fakeMachine) apitype.DeployCreated {
	l.t.Helper()
	out, err := l.op.Deploy(ctx, fm.id, apitype.DeployCreate{Image: protocol.DeployImage{URL: "https://images.example.test/os.raw",
		SHA256: strings.Repeat("ab", 32), Size: 64 << 20}})
	if err != nil {
		l.t.Fatalf("deploy %s: %v", fm.id, err)
	}
	return out
}

// siteLoop is the site agent: it answers BMC commands, and a power cycle
// that boots starts the machine's PXE boot.
func (l *lab) siteLoop(site *conn) {
	powers := map[string]int{}
	for {
		var c protocol.Command
		select {
		case c = <-site.cmds:
		case <-site.done:
			return
		}
		var p struct {
			Machine string `json:"machine"`
			Action  string `json:"action"`
		}
		json.Unmarshal(c.Params, &p)
		l.mu.Lock()
		l.bmc = append(l.bmc, c)
		fm := l.machines[p.Machine]
		fails := l.powerFails
		l.mu.Unlock()
		switch c.Kind {
		case protocol.KindBMCBootdev:
			var bp protocol.BMCBootdevParams
			json.Unmarshal(c.Params, &bp)
			res, _ := json.Marshal(protocol.BMCBootdevResult(bp))
			site.status(protocol.Status{CommandID: c.ID, State: protocol.StateRunning})
			site.status(protocol.Status{CommandID: c.ID, State: protocol.StateSucceeded, Result: res})
		case protocol.KindBMCPower:
			powers[p.Machine]++
			if fails != nil && fails(p.Machine, powers[p.Machine]) {
				site.status(protocol.Status{CommandID: c.ID, State: protocol.StateFailed, Reason: protocol.ReasonPluginFailed,
					Message: "the bcx-ipmi plugin exited"})
				continue
			}
			res, _ := json.Marshal(protocol.BMCPowerResult{Machine: p.Machine, Action: p.Action, Power: protocol.PowerStateOn})
			site.status(protocol.Status{CommandID: c.ID, State: protocol.StateSucceeded, Result: res})
			if fm != nil && p.Action == protocol.PowerCycle {
				go l.boot(fm)
			}
		}
	}
}

// boot is a machine's PXE boot after a power cycle: the site reports the
// stages it served and the nonce, and the ramdisk joins with it.
func (l *lab) boot(fm *fakeMachine) {
	fm.mu.Lock()
	fm.cycles++
	n := fm.cycles
	boots := fm.boots(n)
	old := fm.ramdisk
	fm.mu.Unlock()
	if old != nil {
		// The power cycle ends the ramdisk that ran.
		old.sess.Close()
	}
	if !boots {
		return
	}
	now := time.Now()
	for _, stage := range []string{protocol.StageDHCP, protocol.StageTFTP, protocol.StageScript, protocol.StageKernel, protocol.StageInitrd} {
		l.site.event(protocol.EventMachineBooted, protocol.MachineBooted{MAC: fm.mac, Stage: stage, Time: now})
	}
	b := make([]byte, 16)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	l.site.event(protocol.EventBootNonce, protocol.BootNonce{MAC: fm.mac, Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)})
	a := cptest.NewAgent(l.t)
	req := a.DiscoveryRequest(nonce, fm.mac)
	req.Site = cptest.Site
	req.Witness = cptest.SignWitness(l.siteKey, l.siteID, nonce, pki.CSRSHA256(a.CSRDER), fm.mac, nil)
	var jr *protocol.JoinResponse
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var er *protocol.ErrorResponse
		jr, er = cptest.PostJoin(l.t, l.hc(), l.gw(), req)
		if er == nil {
			break
		}
		if er.Code != protocol.CodeNonceUnknown || time.Now().After(deadline) {
			l.t.Errorf("ramdisk join of %s: %+v", fm.id, er)
			return
		}
	}
	rd := dial(l.t, l.gw(), l.roots(), a, a.Verify(l.t, l.s.Bundle(), jr), "ramdisk-boot")
	fm.set(func(fm *fakeMachine) { fm.ramdisk = rd })
	go l.ramdiskLoop(fm, rd)
}

// ramdiskLoop is a ramdisk's command loop.
func (l *lab) ramdiskLoop(fm *fakeMachine, rd *conn) {
	for {
		var c protocol.Command
		select {
		case c = <-rd.cmds:
		case <-rd.done:
			return
		}
		switch c.Kind {
		case protocol.KindInventory:
			rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateSucceeded, Result: json.RawMessage(`{"hostname":"ramdisk","cpus":8}`)})
		case protocol.KindDeployImage:
			var p protocol.DeployImageParams
			json.Unmarshal(c.Params, &p)
			fm.mu.Lock()
			fm.deploys = append(fm.deploys, c)
			run := fm.deploy
			fm.mu.Unlock()
			run(l, fm, rd, c, p)
		default:
			rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateUnsupported})
		}
	}
}

func progress(rd *conn, c protocol.Command, p protocol.DeployImageParams) {
	rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateRunning, Reason: "deploying", Message: "deploying"})
	rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateRunning, Reason: "deploying", Message: "writing",
		Progress: &protocol.Progress{Done: p.Image.Size / 2, Total: p.Image.Size, Unit: "bytes", Rate: 48e6}})
}

func deployResult(p protocol.DeployImageParams) json.RawMessage {
	b, _ := json.Marshal(protocol.DeployImageResult{Target: protocol.DeployTarget{Path: "/dev/vda"}, ImageSize: p.Image.Size, Size: p.Image.Size,
		SHA256: p.Image.SHA256, DurationMS: 1400, After: p.After.Action})
	return b
}

// deployOK writes the image, kexecs once the gateway has the status, and
// the installed OS joins and connects.
func deployOK(l *lab, fm *fakeMachine, rd *conn, c protocol.Command, p protocol.DeployImageParams) {
	progress(rd, c, p)
	rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateSucceeded, Reason: "deployed", Result: deployResult(p)})
	rd.flush()
	rd.sess.Close()
	l.installedOS(fm, p)
}

// installedOS joins with what deploy.image wrote and opens the node's
// session.
func (l *lab) installedOS(fm *fakeMachine, p protocol.DeployImageParams) {
	files := map[string]string{}
	for _, f := range p.Files {
		files[f.Path] = strings.TrimSpace(string(f.Content))
	}
	a := cptest.NewAgent(l.t)
	jr, er := cptest.PostJoin(l.t, l.hc(), l.gw(), a.Request(l.t, l.s.Bundle(), protocol.RoleNode, files[machines.InstallTokenPath],
		func(r *protocol.JoinRequest) {
			r.Attestor = protocol.AttestorProvisioned
			r.NodeID = files[machines.InstallNodeIDPath]
			r.Site = cptest.Site
		}))
	if er != nil {
		l.t.Errorf("installed OS join of %s: %+v", fm.id, er)
		return
	}
	node := dial(l.t, l.gw(), l.roots(), a, a.Verify(l.t, l.s.Bundle(), jr), "os-boot-1")
	fm.set(func(fm *fakeMachine) { fm.node = node })
}

// deployDigestMismatch fails as the ramdisk does for an image whose SHA-256
// is not the one given, and stays up.
func deployDigestMismatch(l *lab, fm *fakeMachine, rd *conn, c protocol.Command, p protocol.DeployImageParams) {
	progress(rd, c, p)
	rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateFailed, Reason: protocol.DeployReasonDigest,
		Message: "image sha256 is 00ff, want " + p.Image.SHA256})
}

// deployThenPowerLoss starts writing and is cut off: the machine lost power.
func deployThenPowerLoss(l *lab, fm *fakeMachine, rd *conn, c protocol.Command, p protocol.DeployImageParams) {
	progress(rd, c, p)
	rd.flush()
	rd.sess.Close()
}

// waitFor polls ok until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// waitEnd waits for the machine to be provisioned or failed.
func (l *lab) waitEnd(fm *fakeMachine) apitype.MachineInfo {
	l.t.Helper()
	return waitMachine(l.t, l.op, fm.id, func(m apitype.MachineInfo) bool {
		return m.State == store.MachineProvisioned || m.State == store.MachineFailed
	})
}

// timeline is the machine's events; states the lifecycle states it went
// through, in order.
func (l *lab) timeline(fm *fakeMachine) []apitype.MachineEvent {
	l.t.Helper()
	evs, err := l.op.MachineEvents(ctx, fm.id, 0)
	if err != nil {
		l.t.Fatal(err)
	}
	return evs.Events
}

func states(evs []apitype.MachineEvent) string {
	var out []string
	for _, e := range evs {
		if e.Kind == protocol.MachineEventState {
			var d struct{ To string }
			json.Unmarshal(e.Data, &d)
			out = append(out, d.To)
		}
	}
	return strings.Join(out, ",")
}

func kinds(evs []apitype.MachineEvent) map[string]int {
	out := map[string]int{}
	for _, e := range evs {
		out[e.Kind]++
	}
	return out
}

// TestLifecycleHappyPath: one machines deploy takes a UEFI machine through
// every state: its boot entry becomes ramdisk, the site is asked for
// bootdev pxe (EFI) and a power cycle (the first one's FAILED answer is
// retried once), the ramdisk joins and is inventoried, deploy.image runs
// with progress, SUCCEEDED leads to installing, and the installed OS's join
// and welcome to provisioned with the boot entry local. A reboot of the
// node is on the timeline as node offline and node back.
func TestLifecycleHappyPath(t *testing.T) {
	l := newLab(t, labTimeouts)
	l.powerFails = func(_ string, n int) bool { return n == 1 }
	fm := l.addMachine("52:54:00:00:01:01", true, nil)
	out := l.deploy(fm)
	if out.Machine.State != store.MachinePXEBooting || out.Machine.BootMode != protocol.BootRamdisk {
		t.Fatalf("deploy answered %s boot %s", out.Machine.State, out.Machine.BootMode)
	}
	m := l.waitEnd(fm)
	if m.State != store.MachineProvisioned || m.BootMode != protocol.BootLocal || m.Node == "" || !m.NodeConnected || m.RamdiskNode != "" {
		t.Fatalf("machine %+v", m)
	}
	if m.StateReason != "node "+m.Node+" ready" || m.CurrentDeployment.Outcome != lifecycle.OutcomeProvisioned ||
		m.CurrentDeployment.BootAttempts != 1 || m.CurrentDeployment.DeployAttempts != 1 {
		t.Errorf("provisioned %q deployment %+v", m.StateReason, m.CurrentDeployment)
	}

	var got []string
	for _, c := range l.bmcCommands() {
		got = append(got, c.Kind+" "+string(c.Params))
	}
	want := []string{
		`bmc.bootdev {"machine":"` + fm.id + `","device":"pxe","efi":true}`,
		`bmc.power {"machine":"` + fm.id + `","action":"cycle"}`,
		`bmc.power {"machine":"` + fm.id + `","action":"cycle"}`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("BMC commands\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The site agent was told the boot entry is local.
	waitFor(t, "the local boot entry at the site", func() bool {
		var boot protocol.BootSection
		json.Unmarshal(l.site.lastSpec().Sections[protocol.SectionBoot], &boot)
		return len(boot.Entries) == 1 && boot.Entries[0].Mode == protocol.BootLocal && boot.Entries[0].MAC == fm.mac
	})

	evs := l.timeline(fm)
	if s := states(evs); s != "pxe-booting,ramdisk,deploying,installing,provisioned" {
		t.Errorf("states %s", s)
	}
	k := kinds(evs)
	for kind, n := range map[string]int{protocol.EventMachineBooted: 5, protocol.EventBootNonce: 1, protocol.MachineEventJoin: 2, protocol.MachineEventCommand: 5, protocol.MachineEventDeployDone: 1,
		protocol.MachineEventNodeReady: 1} {
		if k[kind] != n {
			t.Errorf("%d %s events, want %d (%v)", k[kind], kind, n, k)
		}
	}
	secret := ""
	for _, c := range fm.deployCommands() {
		var p protocol.DeployImageParams
		json.Unmarshal(c.Params, &p)
		for _, f := range p.Files {
			if f.Path == machines.InstallTokenPath {
				secret = strings.TrimSpace(string(f.Content))
			}
		}
	}
	var sawProgress, sawRate bool
	for _, e := range evs {
		if secret == "" || strings.Contains(e.Message+string(e.Data), secret) {
			t.Errorf("the timeline shows the join token: %+v", e)
		}
		if e.Kind == protocol.MachineEventCommandStatus && strings.Contains(string(e.Data), `"done":33554432`) {
			sawProgress = true
		}
		if e.Kind == protocol.MachineEventDeployDone && strings.Contains(e.Message, "MB/s") && strings.Contains(string(e.Data), `"mb_per_s":47.9`) {
			sawRate = true
		}
	}
	if !sawProgress || !sawRate {
		t.Errorf("progress %v, MB/s %v in the timeline", sawProgress, sawRate)
	}

	// The node reboots: offline, then back with the same identity.
	var node *conn
	fm.set(func(fm *fakeMachine) { node = fm.node })
	if node == nil {
		// The installed OS's join or dial failed (its error is above).
		t.Fatal("the installed OS has no session")
	}
	node.sess.Close()
	waitFor(t, "node offline", func() bool { return kinds(l.timeline(fm))[protocol.MachineEventNodeOffline] == 1 })
	back := dial(t, l.gw(), l.roots(), node.agent, node.res, "os-boot-2")
	defer back.sess.Close()
	waitFor(t, "node back", func() bool { return kinds(l.timeline(fm))[protocol.MachineEventNodeBack] == 1 })
	for _, e := range l.timeline(fm) {
		if e.Kind == protocol.MachineEventNodeBack && (!strings.Contains(e.Message, "after a reboot") || !strings.Contains(string(e.Data), `"reboot":true`)) {
			t.Errorf("node back %+v", e)
		}
	}
	if m, _ := l.op.GetMachine(ctx, fm.id); m.State != store.MachineProvisioned || m.Node != node.res.NodeID {
		t.Errorf("after the reboot %+v", m)
	}
}

// TestLifecycleRamdiskJoinTimeout: a machine whose ramdisk never joins is
// power-cycled again, twice, then failed with the reason.
func TestLifecycleRamdiskJoinTimeout(t *testing.T) {
	l := newLab(t, "ramdisk=300ms,bmc=3s,grace=1s")
	fm := l.addMachine("52:54:00:00:02:01", false, func(fm *fakeMachine) { fm.boots = func(int) bool { return false } })
	l.deploy(fm)
	m := l.waitEnd(fm)
	if m.State != store.MachineFailed || m.StateReason != "no ramdisk joined within 300ms; gave up after 3 power cycles" {
		t.Fatalf("machine %s: %q", m.State, m.StateReason)
	}
	powers, bootdevs := 0, 0
	for _, c := range l.bmcCommands() {
		switch c.Kind {
		case protocol.KindBMCPower:
			powers++
		case protocol.KindBMCBootdev:
			bootdevs++
			if strings.Contains(string(c.Params), "efi") {
				t.Errorf("a BIOS machine was asked for an EFI boot: %s", c.Params)
			}
		}
	}
	if powers != 3 || bootdevs != 3 {
		t.Errorf("%d power cycles and %d bootdevs, want 3 each", powers, bootdevs)
	}
	if s := states(l.timeline(fm)); s != "pxe-booting,pxe-booting,pxe-booting,failed" {
		t.Errorf("states %s", s)
	}
}

// TestLifecycleDeployFails: a deploy.image that FAILED (digest) is sent once
// more to the same ramdisk, then the machine is failed with the ramdisk's
// message; each attempt's token is revoked. Deployed again, it goes
// straight to the connected ramdisk and is provisioned.
func TestLifecycleDeployFails(t *testing.T) {
	l := newLab(t, labTimeouts)
	fm := l.addMachine("52:54:00:00:03:01", false, func(fm *fakeMachine) { fm.deploy = deployDigestMismatch })
	l.deploy(fm)
	m := l.waitEnd(fm)
	if m.State != store.MachineFailed || !strings.HasPrefix(m.StateReason, "deploy.image FAILED: digest-mismatch: image sha256 is 00ff, want abab") ||
		!strings.HasSuffix(m.StateReason, "gave up after 2 failed deploy.image attempts") {
		t.Fatalf("machine %s: %q", m.State, m.StateReason)
	}
	cmds := fm.deployCommands()
	if len(cmds) != 2 || cmds[0].ID == cmds[1].ID {
		t.Fatalf("%d deploy.image commands, want 2", len(cmds))
	}
	toks, _ := l.op.ListTokens(ctx)
	revoked := 0
	for _, tok := range toks {
		if tok.Role == protocol.RoleNode && tok.MachineID == fm.id && tok.State == apitype.TokenRevoked {
			revoked++
		}
	}
	if revoked != 2 {
		t.Errorf("%d revoked deploy tokens, want 2: %+v", revoked, toks)
	}
	if s := states(l.timeline(fm)); s != "pxe-booting,ramdisk,deploying,deploying,failed" {
		t.Errorf("states %s", s)
	}

	fm.set(func(fm *fakeMachine) { fm.deploy = deployOK })
	out := l.deploy(fm)
	if out.Machine.State != store.MachineRamdisk {
		t.Errorf("a deploy with the ramdisk connected starts at %s", out.Machine.State)
	}
	if m := l.waitEnd(fm); m.State != store.MachineProvisioned {
		t.Fatalf("deployed again: %s %q", m.State, m.StateReason)
	}
	if n := len(l.bmcCommands()); n != 2 {
		t.Errorf("%d BMC commands, want the first deployment's 2", n)
	}
}

// TestLifecycleRamdiskLost: the machine loses power mid-deploy (its ramdisk's
// session ends and never comes back): the deploy is not good, the machine
// goes back to pxe-booting, and the next ramdisk deploys it.
func TestLifecycleRamdiskLost(t *testing.T) {
	l := newLab(t, labTimeouts)
	fm := l.addMachine("52:54:00:00:04:01", false, func(fm *fakeMachine) { fm.deploy = deployThenPowerLoss })
	l.deploy(fm)
	waitFor(t, "the first deploy.image", func() bool { return len(fm.deployCommands()) == 1 })
	fm.set(func(fm *fakeMachine) { fm.deploy = deployOK })
	m := l.waitEnd(fm)
	if m.State != store.MachineProvisioned {
		t.Fatalf("machine %s: %q", m.State, m.StateReason)
	}
	evs := l.timeline(fm)
	if s := states(evs); s != "pxe-booting,ramdisk,deploying,pxe-booting,ramdisk,deploying,installing,provisioned" {
		t.Errorf("states %s", s)
	}
	found := false
	for _, e := range evs {
		if e.Kind == protocol.MachineEventState && strings.HasPrefix(e.Message, "pxe-booting: the ramdisk disconnected during deploy.image and did not come back within 1s") {
			found = true
		}
	}
	if !found {
		t.Error("no transition says the ramdisk disconnected during deploy.image")
	}
	first := fm.deployCommands()[0]
	if c, err := l.op.GetCommand(ctx, first.ID); err != nil || c.State == protocol.StateSucceeded {
		t.Errorf("the interrupted deploy.image is %s", c.State)
	}
}

// TestLifecycleControlPlaneRestart: the control plane stops while deploy.image
// runs; the ramdisk finishes meanwhile and, once a new control plane runs on
// the same store, reconnects and replays RUNNING and SUCCEEDED. The
// deployment resumes at deploying, deploy.image is not sent again, and the
// machine is provisioned.
func TestLifecycleControlPlaneRestart(t *testing.T) {
	l := newLab(t, labTimeouts)
	type running struct {
		rd *conn
		c  protocol.Command
		p  protocol.DeployImageParams
		st []protocol.Status
	}
	got := make(chan running, 1)
	fm := l.addMachine("52:54:00:00:05:01", false, func(fm *fakeMachine) {
		fm.deploy = func(l *lab, fm *fakeMachine, rd *conn, c protocol.Command, p protocol.DeployImageParams) {
			st := rd.status(protocol.Status{CommandID: c.ID, State: protocol.StateRunning, Reason: "deploying", Message: "deploying"})
			rd.flush()
			got <- running{rd, c, p, []protocol.Status{st}}
		}
	})
	l.deploy(fm)
	var r running
	select {
	case r = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("deploy.image did not reach the ramdisk")
	}
	waitMachine(t, l.op, fm.id, func(m apitype.MachineInfo) bool { return m.State == store.MachineDeploying })

	l.restart(func() {
		// While the control plane is down the ramdisk finishes: its
		// journal holds the statuses the gateway has not acknowledged.
		<-r.rd.done
		r.st = append(r.st,
			protocol.Status{Seq: r.rd.seq.Add(1), CommandID: r.c.ID, State: protocol.StateRunning, Reason: "deploying",
				Progress: &protocol.Progress{Done: r.p.Image.Size, Total: r.p.Image.Size, Unit: "bytes"}, Time: time.Now()},
			protocol.Status{Seq: r.rd.seq.Add(1), CommandID: r.c.ID, State: protocol.StateSucceeded, Reason: "deployed",
				Result: deployResult(r.p), Time: time.Now()})
	})
	rd := dial(t, l.gw(), l.roots(), r.rd.agent, r.rd.res, "ramdisk-boot")
	for _, st := range r.st[1:] {
		rd.sess.Write(protocol.FrameStatus, st)
	}
	rd.seq.Store(r.st[len(r.st)-1].Seq)
	rd.flush()
	waitMachine(t, l.op, fm.id, func(m apitype.MachineInfo) bool { return m.State == store.MachineInstalling })
	// No deploy.image again, not even once the resend delay has passed.
	select {
	case c := <-rd.cmds:
		t.Fatalf("the ramdisk got %s %s again after the restart", c.Kind, c.ID)
	case <-time.After(2500 * time.Millisecond):
	}
	rd.sess.Close()
	l.installedOS(fm, r.p)
	m := l.waitEnd(fm)
	if m.State != store.MachineProvisioned {
		t.Fatalf("machine %s: %q", m.State, m.StateReason)
	}
	if s := states(l.timeline(fm)); s != "pxe-booting,ramdisk,deploying,installing,provisioned" {
		t.Errorf("states %s", s)
	}
	if n := len(fm.deployCommands()); n != 1 {
		t.Errorf("%d deploy.image commands, want 1", n)
	}
}

// TestLifecycleConcurrentMachines: two machines deploy at once; one fails,
// the other is provisioned as if the first were not there.
func TestLifecycleConcurrentMachines(t *testing.T) {
	l := newLab(t, labTimeouts)
	bad := l.addMachine("52:54:00:00:06:01", false, func(fm *fakeMachine) { fm.deploy = deployDigestMismatch })
	good := l.addMachine("52:54:00:00:06:02", true, nil)
	var wg sync.WaitGroup
	for _, fm := range []*fakeMachine{bad, good} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.deploy(fm)
		}()
	}
	wg.Wait()
	mg, mb := l.waitEnd(good), l.waitEnd(bad)
	if mg.State != store.MachineProvisioned || mb.State != store.MachineFailed || !strings.Contains(mb.StateReason, "digest-mismatch") {
		t.Fatalf("good %s %q, bad %s %q", mg.State, mg.StateReason, mb.State, mb.StateReason)
	}
	if s := states(l.timeline(good)); s != "pxe-booting,ramdisk,deploying,installing,provisioned" {
		t.Errorf("good states %s", s)
	}
	list, err := l.op.ListMachines(ctx, cptest.Site)
	if err != nil || len(list) != 2 {
		t.Fatalf("list %v %v", list, err)
	}
}

// TestLifecycleCancel: a deployment waiting for a ramdisk is cancelled; the
// controller leaves the machine alone afterwards.
func TestLifecycleCancel(t *testing.T) {
	l := newLab(t, "ramdisk=1h")
	fm := l.addMachine("52:54:00:00:07:01", false, func(fm *fakeMachine) { fm.boots = func(int) bool { return false } })
	l.deploy(fm)
	waitFor(t, "the power cycle", func() bool { return len(l.bmcCommands()) == 2 })
	waitMachine(t, l.op, fm.id, func(m apitype.MachineInfo) bool { return m.CurrentDeployment.Step == lifecycle.StepWaitJoin })
	m, err := l.op.CancelDeploy(ctx, fm.id)
	if err != nil || m.State != store.MachineFailed || m.StateReason != "cancelled by operator" {
		t.Fatalf("cancel: %+v %v", m, err)
	}
	time.Sleep(300 * time.Millisecond)
	if m, _ := l.op.GetMachine(ctx, fm.id); m.State != store.MachineFailed || len(l.bmcCommands()) != 2 {
		t.Errorf("after the cancel: %s, %d BMC commands", m.State, len(l.bmcCommands()))
	}
}
