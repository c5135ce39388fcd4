package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// The transitions of the lifecycle, one step at a time: a machine is put in
// a state (a record in the fake store, as the controller would have left
// it), something happens (a command's status, a session, a binding, the
// clock moving past a deadline), and c.step is called once. Deadlines are
// crossed by moving the injected clock, never by sleeping; no goroutine
// runs. The whole control plane, on SQLite, is controlplane/lifecycle_test.go.

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// The records of a world, by id.
const (
	machineID  = "m_1"
	depID      = "dep_1"
	siteAgent  = "n_site"
	oldRamdisk = "n_rd_old" // the ramdisk the deploy found, left behind by the PXE boot
	ramdiskID  = "n_rd"     // the ramdisk that joins for the deployment
	nodeID     = "n_inst"   // the installed OS's node of the current attempt
	tokenID    = "tok_1"    // its join token
	bmcCmd     = "c_bmc"
	invCmd     = "c_inv"
	deployCmd  = "c_dep"
)

// Timeouts of every world: the defaults, spelt out so that the rows' clock
// moves read as what they cross.
var tmo = Timeouts{}.WithDefaults()

type world struct {
	s   *fakeStore
	c   *Controller
	now time.Time
}

func testInstall(t *testing.T) *machines.Install {
	b := cptest.NewBundle(t)
	return &machines.Install{GatewayURL: "https://gw.example.test:8444", GatewayServerName: "gw.internal.test",
		Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK}
}

func testSpec() store.DeploySpec {
	return store.DeploySpec{Image: protocol.DeployImage{URL: "https://images.example.test/ubuntu.raw.zst", SHA256: strings.Repeat("ab", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}, After: protocol.AfterKexec, Pool: "default"}
}

// newWorld: a registered machine with a BMC, whose site has a connected
// site agent, and the ramdisk of its last boot known but disconnected.
func newWorld(in *machines.Install) *world {
	w := &world{s: newFakeStore(), now: t0}
	w.c = &Controller{Store: w.s, Install: in, Now: func() time.Time { return w.now }}
	// What Run, Deploy and Kick do first: the maps step keeps up.
	w.c.init()
	w.s.nodes[siteAgent] = store.Node{ID: siteAgent, Role: protocol.RoleSite, Site: cptest.Site, SessionID: 1, LastSeenAt: t0}
	w.s.nodes[oldRamdisk] = store.Node{ID: oldRamdisk, Role: protocol.RoleRamdisk, Site: cptest.Site}
	w.s.machines[machineID] = store.Machine{ID: machineID, Site: cptest.Site,
		MachineSpec:     store.MachineSpec{MACs: []string{"52:54:00:00:00:01"}, BMC: &store.MachineBMC{Address: "10.0.0.9", Username: "admin"}, Firmware: store.FirmwareBIOS},
		MachineStatus:   store.MachineStatus{State: store.MachineRegistered, RamdiskNode: oldRamdisk, BindApplied: 1},
		MachineObserved: store.MachineObserved{BoundRamdisk: oldRamdisk, BindSeq: 1}}
	return w
}

func (w *world) machine() store.Machine { return w.s.machines[machineID] }

func (w *world) editMachine(f func(*store.Machine)) {
	m := w.s.machines[machineID]
	f(&m)
	w.s.machines[machineID] = m
}

func (w *world) editDep(f func(*store.Deployment)) {
	d := w.s.deps[depID]
	f(&d)
	w.s.deps[depID] = d
}

// put makes d the machine's running deployment, the machine in state.
func (w *world) put(state string, d store.Deployment) {
	d.ID, d.MachineID, d.Spec, d.Version, d.CreatedAt = depID, machineID, testSpec(), 3, t0.Add(-time.Hour)
	if d.Step == StepDone && d.FinishedAt.IsZero() {
		d.FinishedAt = t0.Add(-time.Minute)
	}
	w.s.deps[depID] = d
	w.editMachine(func(m *store.Machine) {
		m.State, m.Deployment = state, depID
		if m.BootMode == "" {
			m.BootMode = protocol.BootRamdisk
		}
	})
}

func (w *world) addCommand(id, node, kind, state string) {
	w.s.commands[id] = store.Command{ID: id, NodeID: node, MachineID: machineID, Kind: kind, State: state, CreatedAt: w.now, UpdatedAt: w.now}
}

// status is an agent's report on a command.
func (w *world) status(id, state, reason, msg string) {
	c := w.s.commands[id]
	c.State, c.Reason, c.Message, c.UpdatedAt = state, reason, msg, w.now
	w.s.commands[id] = c
}

// connect opens a session of node with boot id boot; disconnect closes it.
func (w *world) connect(node string, session int64, boot string) {
	n := w.s.nodes[node]
	n.SessionID, n.LastSeenAt = session, w.now
	w.s.nodes[node] = n
	w.s.sessions[session] = store.Session{ID: session, NodeID: node, Role: n.Role, BootID: boot, ConnectedAt: w.now}
}

func (w *world) disconnect(node string) {
	n := w.s.nodes[node]
	n.SessionID = 0
	w.s.nodes[node] = n
}

func (w *world) retire(node string) {
	n := w.s.nodes[node]
	n.DeletedAt, n.SessionID = w.now, 0
	w.s.nodes[node] = n
}

// bindRamdisk is the JoinService binding a ramdisk that joined (connected
// or not yet) for the machine; bindNode the installed OS's join, which
// clears the bound ramdisk.
func (w *world) bindRamdisk(node string, session int64) {
	w.s.nodes[node] = store.Node{ID: node, Role: protocol.RoleRamdisk, Site: cptest.Site, JoinedAt: w.now}
	if session != 0 {
		w.connect(node, session, "boot-"+node)
	}
	w.editMachine(func(m *store.Machine) { m.BoundRamdisk, m.BindSeq = node, m.BindSeq+1 })
}

func (w *world) bindNode(node, state string, session int64, boot string) {
	w.s.nodes[node] = store.Node{ID: node, Role: protocol.RoleNode, Site: cptest.Site, Pool: "default", State: state, JoinedAt: w.now}
	if session != 0 {
		w.connect(node, session, boot)
	}
	w.editMachine(func(m *store.Machine) { m.BoundRamdisk, m.BoundNode, m.BindSeq = "", node, m.BindSeq+1 })
}

func (w *world) addToken(id string) {
	w.s.tokens[id] = store.Token{ID: id, Role: protocol.RoleNode, NodeID: nodeID, MachineID: machineID, CreatedAt: w.now, ExpiresAt: w.now.Add(DefaultTokenTTL)}
}

// The states a row starts from: the machine and its deployment as the
// controller leaves them on entering the step, at t0.

func atBootdev(w *world) { // bmc.bootdev sent, first try, not answered yet
	w.addCommand(bmcCmd, siteAgent, protocol.KindBMCBootdev, store.CommandPending)
	w.put(store.MachinePXEBooting, store.Deployment{Step: StepBootdev, CommandID: bmcCmd, BMCAttempts: 1,
		Deadline: t0.Add(tmo.BMC), LeftRamdisk: oldRamdisk})
}

func atBootdevUnsent(w *world) { // as Deploy leaves it: nothing sent yet
	w.put(store.MachinePXEBooting, store.Deployment{Step: StepBootdev, LeftRamdisk: oldRamdisk})
}

func atBootdevWaitingForAgent(w *world) { // no site agent was connected to send bmc.bootdev to
	w.disconnect(siteAgent)
	w.put(store.MachinePXEBooting, store.Deployment{Step: StepBootdev, Deadline: t0.Add(tmo.BMC), LeftRamdisk: oldRamdisk})
}

func atPower(w *world) { // bmc.power cycle sent, first try
	w.addCommand(bmcCmd, siteAgent, protocol.KindBMCPower, store.CommandPending)
	w.put(store.MachinePXEBooting, store.Deployment{Step: StepPower, CommandID: bmcCmd, BMCAttempts: 1,
		Deadline: t0.Add(tmo.BMC), LeftRamdisk: oldRamdisk})
}

func atWaitJoin(w *world) { // power cycled once; waiting for a new ramdisk
	w.put(store.MachinePXEBooting, store.Deployment{Step: StepWaitJoin, BootAttempts: 1, Deadline: t0.Add(tmo.Ramdisk), LeftRamdisk: oldRamdisk})
}

func atWaitJoinNoBMC(w *world) {
	w.editMachine(func(m *store.Machine) { m.BMC = nil })
	atWaitJoin(w)
}

func atWaitJoinLastBoot(w *world) { // the third power cycle's wait: the boot budget is used up
	atWaitJoin(w)
	w.editDep(func(d *store.Deployment) { d.BootAttempts = 1 + DefaultBootRetries })
}

// inRamdisk: the new ramdisk joined, was adopted and is connected.
func inRamdisk(w *world) {
	w.bindRamdisk(ramdiskID, 5)
	w.editMachine(func(m *store.Machine) { m.RamdiskNode, m.BindApplied = ramdiskID, m.BindSeq })
}

func atInventory(w *world) {
	inRamdisk(w)
	w.addCommand(invCmd, ramdiskID, protocol.KindInventory, store.CommandPending)
	w.put(store.MachineRamdisk, store.Deployment{Step: StepInventory, CommandID: invCmd, RamdiskNode: ramdiskID, BootAttempts: 1,
		Deadline: t0.Add(tmo.Inventory)})
}

// enrollEK enrolls a TPM endorsement key for the machine.
func enrollEK(ek string) func(*world) {
	return func(w *world) { w.editMachine(func(m *store.Machine) { m.TPMEKSHA256 = ek }) }
}

// provenEK: the deployment's ramdisk proved ek when it joined.
func provenEK(ek string) func(*world) {
	return func(w *world) {
		n := w.s.nodes[ramdiskID]
		n.ProvenEKSHA256 = ek
		w.s.nodes[ramdiskID] = n
	}
}

// noDeployHeld: no deploy.image and no join token for a held deploy.
func noDeployHeld(t *testing.T, w *world, d store.Deployment) {
	t.Helper()
	for _, c := range w.s.commands {
		if c.Kind == protocol.KindDeployImage {
			t.Errorf("deploy.image %s was queued for %s", c.ID, c.NodeID)
		}
	}
	want(t, "token", d.TokenID, "")
	want(t, "tokens minted", len(w.s.tokens), 0)
}

func atInventoryLost(w *world) { // its session closed 30 s ago
	atInventory(w)
	w.disconnect(ramdiskID)
	w.editDep(func(d *store.Deployment) { d.LostAt = t0.Add(-30 * time.Second) })
}

func atDeploy(w *world) { // deploy.image sent (attempt 1), running
	inRamdisk(w)
	w.addCommand(deployCmd, ramdiskID, protocol.KindDeployImage, protocol.StateRunning)
	w.addToken(tokenID)
	w.put(store.MachineDeploying, store.Deployment{Step: StepDeploy, CommandID: deployCmd, RamdiskNode: ramdiskID, NodeID: nodeID,
		TokenID: tokenID, BootAttempts: 1, DeployAttempts: 1, Deadline: t0.Add(tmo.Deploy)})
}

func atDeployReboot(w *world) { // … of a spec that reboots after the write
	atDeploy(w)
	w.editDep(func(d *store.Deployment) { d.Spec.After = protocol.AfterReboot })
}

func atDeployLastTry(w *world) { // the retry of a FAILED deploy.image
	atDeploy(w)
	w.editDep(func(d *store.Deployment) { d.DeployAttempts, d.DeployFailures = 2, 1 })
}

func atDeployLastBoot(w *world) { // deploy.image on the last power cycle
	atDeploy(w)
	w.editDep(func(d *store.Deployment) { d.BootAttempts = 1 + DefaultBootRetries })
}

func atDeployLost(w *world) { // the ramdisk's session closed 30 s ago
	atDeploy(w)
	w.disconnect(ramdiskID)
	w.editDep(func(d *store.Deployment) { d.LostAt = t0.Add(-30 * time.Second) })
}

func atInstall(w *world) { // deploy.image SUCCEEDED; the ramdisk kexec'd
	atDeploy(w)
	w.status(deployCmd, protocol.StateSucceeded, "", "")
	w.disconnect(ramdiskID)
	w.editMachine(func(m *store.Machine) { m.State = store.MachineInstalling })
	w.editDep(func(d *store.Deployment) { d.Step, d.CommandID, d.Deadline = StepWaitNode, "", t0.Add(tmo.Install) })
}

func atInstallLastBoot(w *world) {
	atInstall(w)
	w.editDep(func(d *store.Deployment) { d.BootAttempts = 1 + DefaultBootRetries })
}

// atProvisioned: the installed OS's node is ready with session 7 of boot
// b1; the deployment finished.
func atProvisioned(w *world) {
	atInstall(w)
	w.bindNode(nodeID, protocol.NodeReady, 7, "b1")
	w.editMachine(func(m *store.Machine) {
		m.State, m.BootMode, m.RamdiskNode, m.Node, m.BindApplied = store.MachineProvisioned, protocol.BootLocal, "", nodeID, m.BindSeq
	})
	w.editDep(func(d *store.Deployment) {
		d.Step, d.Deadline, d.NodeSession, d.NodeBootID = StepDone, time.Time{}, 7, "b1"
		d.Outcome, d.FinishedAt = OutcomeProvisioned, t0.Add(-time.Minute)
	})
}

func atProvisionedOffline(w *world) { // its session was seen closed
	atProvisioned(w)
	w.disconnect(nodeID)
	w.editDep(func(d *store.Deployment) { d.NodeSession = 0 })
}

func atFailed(w *world) { // deploy.image failed for good
	atDeploy(w)
	w.status(deployCmd, protocol.StateFailed, "WriteFailed", "disk full")
	w.editMachine(func(m *store.Machine) { m.State = store.MachineFailed })
	w.editDep(func(d *store.Deployment) {
		d.Step, d.CommandID, d.Deadline, d.Outcome, d.FinishedAt = StepDone, "", time.Time{}, OutcomeFailed, t0.Add(-time.Minute)
	})
}

func atRegistered(*world) {}

// Events: what happens before the step.

func after(d time.Duration) func(*world) { return func(w *world) { w.now = w.now.Add(d) } }

func nothing(*world) {}

func then(fs ...func(*world)) func(*world) {
	return func(w *world) {
		for _, f := range fs {
			f(w)
		}
	}
}

func cmdStatus(id, state, reason string) func(*world) {
	return func(w *world) { w.status(id, state, reason, "") }
}

// A row's expectation of the commands: kind@node, in the order queued.
func cmd(kind, node string) string { return kind + "@" + node }

type transition struct {
	name  string
	from  func(*world)
	event func(*world)

	state  string   // the machine's state after the step
	step   string   // the deployment's step after it
	cmds   []string // commands queued (kind@node)
	events []string // kinds of the timeline events written, in order
	// noWrite: the step writes nothing at all (no adoption either).
	noWrite bool
	// reason is a part of the machine's state reason, when the step
	// entered a state.
	reason string
	check  func(t *testing.T, w *world, d store.Deployment)
}

const (
	evState   = protocol.MachineEventState
	evCommand = protocol.MachineEventCommand
)

func transitions() []transition {
	bootdev, power, inv, deploy := protocol.KindBMCBootdev, protocol.KindBMCPower, protocol.KindInventory, protocol.KindDeployImage
	return []transition{
		// pxe-booting / bootdev
		{name: "bootdev/SUCCEEDED sends power", from: atBootdev, event: cmdStatus(bmcCmd, protocol.StateSucceeded, ""),
			state: store.MachinePXEBooting, step: StepPower, cmds: []string{cmd(power, siteAgent)}, events: []string{evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "bmc attempts", d.BMCAttempts, 1)
				want(t, "deadline", d.Deadline, w.now.Add(tmo.BMC))
				var p protocol.BMCPowerParams
				json.Unmarshal(w.s.commands[d.CommandID].Params, &p)
				want(t, "power params", p, protocol.BMCPowerParams{Machine: machineID, Action: protocol.PowerCycle})
			}},
		{name: "bootdev/pending within the deadline waits", from: atBootdev, event: after(tmo.BMC - time.Second),
			state: store.MachinePXEBooting, step: StepBootdev, noWrite: true},
		{name: "bootdev/FAILED with a retry left sends it again", from: atBootdev, event: cmdStatus(bmcCmd, protocol.StateFailed, "IPMIError"),
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "bmc attempts", d.BMCAttempts, 2) }},
		{name: "bootdev/FAILED with no retry left fails", from: then(atBootdev, func(w *world) { w.editDep(func(d *store.Deployment) { d.BMCAttempts = 2 }) }),
			event: cmdStatus(bmcCmd, protocol.StateFailed, "IPMIError"),
			state: store.MachineFailed, step: StepDone, events: []string{evState}, reason: "bmc.bootdev pxe FAILED: IPMIError",
			check: outcome(OutcomeFailed)},
		{name: "bootdev/UNSUPPORTED counts as FAILED", from: atBootdev, event: cmdStatus(bmcCmd, protocol.StateUnsupported, ""),
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand}},
		{name: "bootdev/no answer past the deadline sends it again", from: atBootdev, event: after(tmo.BMC),
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand}},
		{name: "bootdev/no answer past the deadline, no retry left, fails",
			from:  then(atBootdev, func(w *world) { w.editDep(func(d *store.Deployment) { d.BMCAttempts = 2 }) }),
			event: after(tmo.BMC), state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "bmc.bootdev pxe: no answer from site agent n_site within 2m0s", check: outcome(OutcomeFailed)},
		{name: "bootdev/command gone is sent again", from: atBootdev, event: func(w *world) { delete(w.s.commands, bmcCmd) },
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand}},
		{name: "bootdev/unsent with a site agent is sent", from: atBootdevUnsent, event: nothing,
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				var p protocol.BMCBootdevParams
				json.Unmarshal(w.s.commands[d.CommandID].Params, &p)
				want(t, "bootdev params", p, protocol.BMCBootdevParams{Machine: machineID, Device: protocol.BootDevicePXE})
				want(t, "bmc attempts", d.BMCAttempts, 1)
			}},
		{name: "bootdev/unsent, uefi firmware asks for EFI", from: then(atBootdevUnsent, func(w *world) {
			w.editMachine(func(m *store.Machine) { m.Firmware = store.FirmwareUEFI })
		}), event: nothing,
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				var p protocol.BMCBootdevParams
				json.Unmarshal(w.s.commands[d.CommandID].Params, &p)
				want(t, "bootdev params", p, protocol.BMCBootdevParams{Machine: machineID, Device: protocol.BootDevicePXE, EFI: true})
			}},
		{name: "bootdev/no site agent connected waits for one", from: atBootdevUnsent, event: func(w *world) { w.disconnect(siteAgent) },
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "deadline", d.Deadline, w.now.Add(tmo.BMC))
				want(t, "command", d.CommandID, "")
			}},
		{name: "bootdev/a site agent of another site does not count", from: atBootdevUnsent, event: func(w *world) {
			w.disconnect(siteAgent)
			w.s.nodes["n_site_other"] = store.Node{ID: "n_site_other", Role: protocol.RoleSite, Site: "other", SessionID: 9}
		}, state: store.MachinePXEBooting, step: StepBootdev, events: []string{protocol.MachineEventNote}},
		{name: "bootdev/a site agent connects within the wait", from: atBootdevWaitingForAgent,
			event: then(after(tmo.BMC-time.Second), func(w *world) { w.connect(siteAgent, 2, "") }),
			state: store.MachinePXEBooting, step: StepBootdev, cmds: []string{cmd(bootdev, siteAgent)}, events: []string{evCommand}},
		{name: "bootdev/still no site agent within the wait", from: atBootdevWaitingForAgent, event: after(tmo.BMC - time.Second),
			state: store.MachinePXEBooting, step: StepBootdev, noWrite: true},
		{name: "bootdev/no site agent by the deadline fails", from: atBootdevWaitingForAgent, event: after(tmo.BMC),
			state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "no site agent of site fsn1 connected within 2m0s to drive the BMC", check: outcome(OutcomeFailed)},

		// pxe-booting / power
		{name: "power/SUCCEEDED waits for the ramdisk", from: atPower, event: cmdStatus(bmcCmd, protocol.StateSucceeded, ""),
			state: store.MachinePXEBooting, step: StepWaitJoin, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "boot attempts", d.BootAttempts, 1)
				want(t, "bmc attempts", d.BMCAttempts, 0)
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Ramdisk))
				want(t, "command", d.CommandID, "")
			}},
		{name: "power/FAILED with a retry left sends it again", from: atPower, event: cmdStatus(bmcCmd, protocol.StateFailed, ""),
			state: store.MachinePXEBooting, step: StepPower, cmds: []string{cmd(power, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand}},
		{name: "power/FAILED with no retry left fails", from: then(atPower, func(w *world) { w.editDep(func(d *store.Deployment) { d.BMCAttempts = 2 }) }),
			event: cmdStatus(bmcCmd, protocol.StateFailed, "IPMIError"), state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "bmc.power cycle FAILED: IPMIError", check: outcome(OutcomeFailed)},
		{name: "power/no answer past the deadline sends it again", from: atPower, event: after(tmo.BMC),
			state: store.MachinePXEBooting, step: StepPower, cmds: []string{cmd(power, siteAgent)}, events: []string{protocol.MachineEventNote, evCommand}},
		{name: "power/a retry finds no site agent: waits for one", from: atPower,
			event: then(cmdStatus(bmcCmd, protocol.StateFailed, ""), func(w *world) { w.disconnect(siteAgent) }),
			state: store.MachinePXEBooting, step: StepPower, events: []string{protocol.MachineEventNote, protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "command", d.CommandID, "")
				want(t, "deadline", d.Deadline, w.now.Add(tmo.BMC))
			}},

		// pxe-booting / wait-join
		{name: "wait-join/a ramdisk bound and connected enters ramdisk", from: atWaitJoin, event: func(w *world) { w.bindRamdisk(ramdiskID, 5) },
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(inv, ramdiskID)}, events: []string{evState, evCommand},
			reason: "ramdisk node n_rd joined and is connected",
			check: func(t *testing.T, w *world, d store.Deployment) {
				adopted(t, w, ramdiskID, "")
				want(t, "ramdisk", d.RamdiskNode, ramdiskID)
				want(t, "left ramdisk", d.LeftRamdisk, "")
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Inventory))
			}},
		{name: "wait-join/a ramdisk bound, not connected, is adopted only", from: atWaitJoin, event: func(w *world) { w.bindRamdisk(ramdiskID, 0) },
			state: store.MachinePXEBooting, step: StepWaitJoin,
			check: func(t *testing.T, w *world, d store.Deployment) {
				adopted(t, w, ramdiskID, "")
				want(t, "ramdisk", d.RamdiskNode, "")
			}},
		{name: "wait-join/the adopted ramdisk connects", from: then(atWaitJoin, func(w *world) {
			w.bindRamdisk(ramdiskID, 0)
			w.editMachine(func(m *store.Machine) { m.RamdiskNode, m.BindApplied = ramdiskID, m.BindSeq })
		}), event: func(w *world) { w.connect(ramdiskID, 5, "b") },
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(inv, ramdiskID)}, events: []string{evState, evCommand}},
		{name: "wait-join/the left-behind ramdisk reconnecting is not new", from: atWaitJoin, event: func(w *world) { w.connect(oldRamdisk, 4, "old") },
			state: store.MachinePXEBooting, step: StepWaitJoin, noWrite: true},
		{name: "wait-join/the left-behind ramdisk bound again is not new", from: atWaitJoin, event: func(w *world) { w.bindRamdisk(oldRamdisk, 4) },
			state: store.MachinePXEBooting, step: StepWaitJoin,
			check: func(t *testing.T, w *world, d store.Deployment) { adopted(t, w, oldRamdisk, "") }},
		{name: "wait-join/a retired ramdisk bound is not entered", from: atWaitJoin, event: func(w *world) {
			w.bindRamdisk(ramdiskID, 5)
			w.retire(ramdiskID)
		}, state: store.MachinePXEBooting, step: StepWaitJoin},
		{name: "wait-join/within the ramdisk timeout waits", from: atWaitJoin, event: after(tmo.Ramdisk - time.Second),
			state: store.MachinePXEBooting, step: StepWaitJoin, noWrite: true},
		{name: "wait-join/no ramdisk within the timeout power-cycles again", from: atWaitJoin, event: after(tmo.Ramdisk),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			reason: "no ramdisk joined within 10m0s; PXE-booting the ramdisk again (power cycle 2 of 3)",
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "boot attempts", d.BootAttempts, 1)
				want(t, "left ramdisk", d.LeftRamdisk, oldRamdisk)
				want(t, "boot mode", w.machine().BootMode, protocol.BootRamdisk)
				want(t, "deadline", d.Deadline, time.Time{})
			}},
		{name: "wait-join/boot budget used up fails", from: atWaitJoinLastBoot, event: after(tmo.Ramdisk),
			state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "no ramdisk joined within 10m0s; gave up after 3 power cycles", check: outcome(OutcomeFailed)},
		{name: "wait-join/no BMC: no ramdisk within the timeout fails", from: atWaitJoinNoBMC, event: after(tmo.Ramdisk),
			state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "no ramdisk joined within 10m0s; the machine has no BMC to power-cycle it", check: outcome(OutcomeFailed)},
		{name: "wait-join/no BMC: a ramdisk joins", from: atWaitJoinNoBMC, event: func(w *world) { w.bindRamdisk(ramdiskID, 5) },
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(inv, ramdiskID)}, events: []string{evState, evCommand}},

		// ramdisk / inventory
		{name: "inventory/answered sends deploy.image", from: atInventory, event: cmdStatus(invCmd, protocol.StateSucceeded, ""),
			state: store.MachineDeploying, step: StepDeploy, cmds: []string{cmd(deploy, ramdiskID)}, events: []string{evState, evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				freshAttempt(t, w, d, "")
				want(t, "deploy attempts", d.DeployAttempts, 1)
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Deploy))
			}},
		{name: "inventory/answered, machine's EK proven by the ramdisk, sends deploy.image", from: then(atInventory, enrollEK("ek_m"), provenEK("ek_m")),
			event: cmdStatus(invCmd, protocol.StateSucceeded, ""),
			state: store.MachineDeploying, step: StepDeploy, cmds: []string{cmd(deploy, ramdiskID)}, events: []string{evState, evCommand}},
		{name: "inventory/answered, machine's EK not proven by the ramdisk, holds deploy.image and power-cycles",
			from: then(atInventory, enrollEK("ek_m")), event: cmdStatus(invCmd, protocol.StateSucceeded, ""),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState, protocol.MachineEventDeployHeld},
			reason: "ramdisk node n_rd proved no TPM endorsement key", check: noDeployHeld},
		{name: "inventory/answered, ramdisk proved another EK, holds deploy.image",
			from: then(atInventory, enrollEK("ek_m"), provenEK("ek_other")), event: cmdStatus(invCmd, protocol.StateSucceeded, ""),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState, protocol.MachineEventDeployHeld},
			reason: "proved endorsement key ek_other", check: noDeployHeld},
		{name: "inventory/answered, EK not proven, boot budget used up, fails", from: then(atInventory, enrollEK("ek_m"), func(w *world) {
			w.editDep(func(d *store.Deployment) { d.BootAttempts = 1 + DefaultBootRetries })
		}), event: cmdStatus(invCmd, protocol.StateSucceeded, ""), state: store.MachineFailed, step: StepDone,
			events: []string{evState, protocol.MachineEventDeployHeld}, reason: "deploy.image held", check: noDeployHeld},
		{name: "inventory/FAILED deploys all the same", from: atInventory, event: cmdStatus(invCmd, protocol.StateFailed, "NoLshw"),
			state: store.MachineDeploying, step: StepDeploy, cmds: []string{cmd(deploy, ramdiskID)}, events: []string{evState, protocol.MachineEventNote, evCommand}},
		{name: "inventory/pending within its timeout waits", from: atInventory, event: after(tmo.Inventory - time.Second),
			state: store.MachineRamdisk, step: StepInventory, noWrite: true},
		{name: "inventory/not within its timeout deploys without it", from: atInventory, event: after(tmo.Inventory),
			state: store.MachineDeploying, step: StepDeploy, cmds: []string{cmd(deploy, ramdiskID)}, events: []string{evState, protocol.MachineEventNote, evCommand}},
		{name: "inventory/ramdisk session lost starts the grace", from: atInventory, event: func(w *world) { w.disconnect(ramdiskID) },
			state: store.MachineRamdisk, step: StepInventory, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "lost at", d.LostAt, w.now) }},
		{name: "inventory/ramdisk back within grace", from: atInventoryLost, event: func(w *world) { w.connect(ramdiskID, 6, "b") },
			state: store.MachineRamdisk, step: StepInventory, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "lost at", d.LostAt, time.Time{}) }},
		{name: "inventory/ramdisk still lost within grace waits", from: atInventoryLost, event: after(tmo.Grace - 31*time.Second),
			state: store.MachineRamdisk, step: StepInventory, noWrite: true},
		{name: "inventory/ramdisk lost past grace power-cycles again", from: atInventoryLost, event: after(tmo.Grace - 30*time.Second),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			reason: "the ramdisk disconnected during inventory and did not come back within 1m0s",
			check:  leftBehind(ramdiskID)},
		{name: "inventory/ramdisk retired power-cycles again", from: atInventory, event: func(w *world) { w.retire(ramdiskID) },
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			reason: "ramdisk node n_rd was retired during inventory", check: leftBehind(ramdiskID)},
		{name: "inventory/ramdisk lost past grace, boot budget used up, fails", from: then(atInventoryLost, func(w *world) {
			w.editDep(func(d *store.Deployment) { d.BootAttempts = 1 + DefaultBootRetries })
		}), event: after(tmo.Grace), state: store.MachineFailed, step: StepDone, events: []string{evState}, check: outcome(OutcomeFailed)},

		// deploying / deploy
		{name: "deploy/SUCCEEDED (kexec) installs", from: atDeploy, event: cmdStatus(deployCmd, protocol.StateSucceeded, ""),
			state: store.MachineInstalling, step: StepWaitNode, events: []string{evState, protocol.MachineEventDeployDone},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Install))
				want(t, "boot mode", w.machine().BootMode, protocol.BootRamdisk)
				want(t, "node", d.NodeID, nodeID)
				want(t, "token revoked", w.s.tokens[tokenID].RevokedAt, time.Time{})
			}},
		{name: "deploy/SUCCEEDED (reboot) sets the boot entry local", from: atDeployReboot, event: cmdStatus(deployCmd, protocol.StateSucceeded, ""),
			state: store.MachineInstalling, step: StepWaitNode, events: []string{evState, protocol.MachineEventDeployDone},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "boot mode", w.machine().BootMode, protocol.BootLocal)
			}},
		{name: "deploy/SUCCEEDED then the session closed (kexec) is not a lost ramdisk", from: atDeploy,
			event: then(cmdStatus(deployCmd, protocol.StateSucceeded, ""), func(w *world) { w.disconnect(ramdiskID) }),
			state: store.MachineInstalling, step: StepWaitNode, events: []string{evState, protocol.MachineEventDeployDone}},
		{name: "deploy/running within its timeout waits", from: atDeploy, event: after(tmo.Deploy - time.Second),
			state: store.MachineDeploying, step: StepDeploy, noWrite: true},
		{name: "deploy/FAILED with a retry left sends it again", from: atDeploy, event: cmdStatus(deployCmd, protocol.StateFailed, "WriteFailed"),
			state: store.MachineDeploying, step: StepDeploy, cmds: []string{cmd(deploy, ramdiskID)}, events: []string{evState, evCommand},
			reason: "deploy.image FAILED: WriteFailed; sending it again; deploy.image",
			check: func(t *testing.T, w *world, d store.Deployment) {
				freshAttempt(t, w, d, tokenID)
				want(t, "deploy attempts", d.DeployAttempts, 2)
				want(t, "deploy failures", d.DeployFailures, 1)
			}},
		{name: "deploy/FAILED with a retry left, ramdisk gone, PXE-boots", from: atDeploy,
			event: then(cmdStatus(deployCmd, protocol.StateFailed, "WriteFailed"), func(w *world) { w.disconnect(ramdiskID) }),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState}, reason: "deploy.image FAILED: WriteFailed; PXE-booting",
			check: func(t *testing.T, w *world, d store.Deployment) {
				leftBehind(ramdiskID)(t, w, d)
				want(t, "deploy failures", d.DeployFailures, 1)
			}},
		{name: "deploy/FAILED with no retry left fails", from: atDeployLastTry, event: cmdStatus(deployCmd, protocol.StateFailed, "WriteFailed"),
			state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "deploy.image FAILED: WriteFailed; gave up after 2 failed deploy.image attempts",
			check: func(t *testing.T, w *world, d store.Deployment) {
				outcome(OutcomeFailed)(t, w, d)
				revoked(t, w, tokenID)
			}},
		{name: "deploy/FAILED NodeDeleted: the ramdisk was retired", from: atDeploy,
			event: cmdStatus(deployCmd, protocol.StateFailed, protocol.ReasonNodeDeleted),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState}, reason: "ramdisk node n_rd was retired during deploy.image",
			check: func(t *testing.T, w *world, d store.Deployment) {
				leftBehind(ramdiskID)(t, w, d)
				want(t, "deploy failures", d.DeployFailures, 0)
			}},
		{name: "deploy/past its timeout power-cycles again", from: atDeploy, event: after(tmo.Deploy),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState}, reason: "deploy.image did not finish within 1h0m0s",
			check: leftBehind(ramdiskID)},
		{name: "deploy/past its timeout, boot budget used up, fails", from: atDeployLastBoot, event: after(tmo.Deploy),
			state: store.MachineFailed, step: StepDone, events: []string{evState}, reason: "gave up after 3 power cycles",
			check: func(t *testing.T, w *world, d store.Deployment) {
				outcome(OutcomeFailed)(t, w, d)
				revoked(t, w, tokenID)
			}},
		{name: "deploy/ramdisk session lost starts the grace", from: atDeploy, event: func(w *world) { w.disconnect(ramdiskID) },
			state: store.MachineDeploying, step: StepDeploy, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "lost at", d.LostAt, w.now) }},
		{name: "deploy/ramdisk back within grace", from: atDeployLost, event: func(w *world) { w.connect(ramdiskID, 6, "b") },
			state: store.MachineDeploying, step: StepDeploy, events: []string{protocol.MachineEventNote},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "lost at", d.LostAt, time.Time{}) }},
		{name: "deploy/ramdisk lost past grace power-cycles again", from: atDeployLost, event: after(tmo.Grace - 30*time.Second),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			reason: "the ramdisk disconnected during deploy.image and did not come back within 1m0s", check: leftBehind(ramdiskID)},
		{name: "deploy/ramdisk retired power-cycles again", from: atDeploy, event: func(w *world) { w.retire(ramdiskID) },
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState}, reason: "ramdisk node n_rd was retired during deploy.image",
			check: leftBehind(ramdiskID)},
		{name: "deploy/no BMC: ramdisk lost past grace fails", from: then(atDeployLost, func(w *world) {
			w.editMachine(func(m *store.Machine) { m.BMC = nil })
		}), event: after(tmo.Grace), state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "the machine has no BMC to power-cycle it", check: outcome(OutcomeFailed)},

		// installing / wait-node
		{name: "install/the node joined and is ready: provisioned", from: atInstall, event: func(w *world) { w.bindNode(nodeID, protocol.NodeReady, 7, "b1") },
			state: store.MachineProvisioned, step: StepDone, events: []string{evState, protocol.MachineEventNodeReady}, reason: "node n_inst ready",
			check: func(t *testing.T, w *world, d store.Deployment) {
				outcome(OutcomeProvisioned)(t, w, d)
				adopted(t, w, "", nodeID)
				want(t, "boot mode", w.machine().BootMode, protocol.BootLocal)
				want(t, "node session", d.NodeSession, int64(7))
				want(t, "node boot", d.NodeBootID, "b1")
			}},
		{name: "install/the node joined, still adopting, is adopted only", from: atInstall,
			event: func(w *world) { w.bindNode(nodeID, protocol.NodeAdopting, 7, "b1") },
			state: store.MachineInstalling, step: StepWaitNode,
			check: func(t *testing.T, w *world, d store.Deployment) { adopted(t, w, "", nodeID) }},
		{name: "install/another node joined for the machine does not count", from: atInstall,
			event: func(w *world) { w.bindNode("n_other", protocol.NodeReady, 8, "b2") },
			state: store.MachineInstalling, step: StepWaitNode},
		{name: "install/within the install timeout waits", from: atInstall, event: after(tmo.Install - time.Second),
			state: store.MachineInstalling, step: StepWaitNode, noWrite: true},
		{name: "install/not within the install timeout power-cycles again", from: atInstall, event: after(tmo.Install),
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			reason: "the installed OS did not join as node n_inst and connect within 15m0s",
			check: func(t *testing.T, w *world, d store.Deployment) {
				leftBehind(ramdiskID)(t, w, d)
				revoked(t, w, tokenID)
			}},
		{name: "install/not within the install timeout, boot budget used up, fails", from: atInstallLastBoot, event: after(tmo.Install),
			state: store.MachineFailed, step: StepDone, events: []string{evState}, reason: "gave up after 3 power cycles", check: outcome(OutcomeFailed)},

		// provisioned
		{name: "provisioned/nothing changed", from: atProvisioned, event: after(time.Hour),
			state: store.MachineProvisioned, step: StepDone, noWrite: true},
		{name: "provisioned/node lost its session", from: atProvisioned, event: func(w *world) { w.disconnect(nodeID) },
			state: store.MachineProvisioned, step: StepDone, events: []string{protocol.MachineEventNodeOffline},
			check: func(t *testing.T, w *world, d store.Deployment) { want(t, "node session", d.NodeSession, int64(0)) }},
		{name: "provisioned/node back with the same boot id", from: atProvisionedOffline, event: func(w *world) { w.connect(nodeID, 8, "b1") },
			state: store.MachineProvisioned, step: StepDone, events: []string{protocol.MachineEventNodeBack},
			check: func(t *testing.T, w *world, d store.Deployment) {
				nodeBack(t, w, false, "b1")
				want(t, "node session", d.NodeSession, int64(8))
			}},
		{name: "provisioned/node back with another boot id: a reboot", from: atProvisionedOffline, event: func(w *world) { w.connect(nodeID, 8, "b2") },
			state: store.MachineProvisioned, step: StepDone, events: []string{protocol.MachineEventNodeBack},
			check: func(t *testing.T, w *world, d store.Deployment) {
				nodeBack(t, w, true, "b2")
				want(t, "node boot", d.NodeBootID, "b2")
			}},
		{name: "provisioned/a new session without the closed one seen", from: atProvisioned, event: func(w *world) { w.connect(nodeID, 8, "b2") },
			state: store.MachineProvisioned, step: StepDone, events: []string{protocol.MachineEventNodeBack},
			check: func(t *testing.T, w *world, d store.Deployment) { nodeBack(t, w, true, "b2") }},
		{name: "provisioned/still offline writes nothing more", from: atProvisionedOffline, event: after(time.Hour),
			state: store.MachineProvisioned, step: StepDone, noWrite: true},
		{name: "provisioned/a late status of the old deploy.image is ignored", from: atProvisioned,
			event: cmdStatus(deployCmd, protocol.StateFailed, "Late"), state: store.MachineProvisioned, step: StepDone, noWrite: true},

		// failed (finished)
		{name: "failed/a late SUCCEEDED is ignored", from: atFailed, event: cmdStatus(deployCmd, protocol.StateSucceeded, ""),
			state: store.MachineFailed, step: StepDone, noWrite: true},
		{name: "failed/past every deadline writes nothing", from: atFailed, event: after(48 * time.Hour),
			state: store.MachineFailed, step: StepDone, noWrite: true},
		{name: "failed/a ramdisk bound afterwards is adopted only", from: atFailed, event: func(w *world) { w.bindRamdisk("n_rd2", 9) },
			state: store.MachineFailed, step: StepDone,
			check: func(t *testing.T, w *world, d store.Deployment) { adopted(t, w, "n_rd2", "") }},

		// a running deployment in a state it does not run in
		{name: "registered with a running deployment fails", from: then(atDeploy, func(w *world) {
			w.editMachine(func(m *store.Machine) { m.State = store.MachineRegistered })
		}), event: nothing, state: store.MachineFailed, step: StepDone, events: []string{evState},
			reason: "the machine is registered, a state its deployment does not run in",
			check: func(t *testing.T, w *world, d store.Deployment) {
				outcome(OutcomeFailed)(t, w, d)
				revoked(t, w, tokenID)
			}},

		// no deployment
		{name: "registered/nothing to do", from: atRegistered, event: after(time.Hour), state: store.MachineRegistered, noWrite: true},
		{name: "registered/a pending binding is adopted", from: atRegistered, event: func(w *world) { w.bindRamdisk(ramdiskID, 5) },
			state: store.MachineRegistered,
			check: func(t *testing.T, w *world, d store.Deployment) { adopted(t, w, ramdiskID, "") }},
	}
}

// The checks rows share.

func want[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func outcome(o string) func(*testing.T, *world, store.Deployment) {
	return func(t *testing.T, w *world, d store.Deployment) {
		t.Helper()
		want(t, "outcome", d.Outcome, o)
		want(t, "finished at", d.FinishedAt, w.now)
		want(t, "command", d.CommandID, "")
		want(t, "deadline", d.Deadline, time.Time{})
	}
}

// adopted: the machine's status took the bindings.
func adopted(t *testing.T, w *world, ramdisk, node string) {
	t.Helper()
	m := w.machine()
	want(t, "machine ramdisk", m.RamdiskNode, ramdisk)
	want(t, "machine node", m.Node, node)
	want(t, "bind applied", m.BindApplied, m.BindSeq)
}

// leftBehind: back to pxe-booting with node as the ramdisk left behind, the
// attempt's token revoked, nothing sent yet.
func leftBehind(node string) func(*testing.T, *world, store.Deployment) {
	return func(t *testing.T, w *world, d store.Deployment) {
		t.Helper()
		want(t, "left ramdisk", d.LeftRamdisk, node)
		want(t, "ramdisk", d.RamdiskNode, "")
		want(t, "command", d.CommandID, "")
		want(t, "bmc attempts", d.BMCAttempts, 0)
		want(t, "lost at", d.LostAt, time.Time{})
		want(t, "boot mode", w.machine().BootMode, protocol.BootRamdisk)
		if _, ok := w.s.tokens[tokenID]; ok {
			revoked(t, w, tokenID)
		}
	}
}

func revoked(t *testing.T, w *world, id string) {
	t.Helper()
	if w.s.tokens[id].RevokedAt.IsZero() {
		t.Errorf("token %s not revoked", id)
	}
}

// freshAttempt: deploy.image carries a new node id and a new token bound to
// it; old, when set, is revoked.
func freshAttempt(t *testing.T, w *world, d store.Deployment, old string) {
	t.Helper()
	if d.NodeID == "" || d.NodeID == nodeID || !protocol.ValidNodeID(d.NodeID) {
		t.Errorf("node id %q: want a fresh one", d.NodeID)
	}
	tok, ok := w.s.tokens[d.TokenID]
	switch {
	case !ok || d.TokenID == old:
		t.Errorf("token %q: want a fresh one", d.TokenID)
	case tok.NodeID != d.NodeID || tok.MachineID != machineID || tok.Role != protocol.RoleNode || tok.Pool != "default" || tok.Site != cptest.Site ||
		!tok.ExpiresAt.Equal(w.now.Add(DefaultTokenTTL)) || !tok.RevokedAt.IsZero():
		t.Errorf("token %+v", tok)
	}
	if old != "" {
		revoked(t, w, old)
	}
	var p protocol.DeployImageParams
	if err := json.Unmarshal(w.s.commands[d.CommandID].Params, &p); err != nil || len(p.Files) != 4 || p.Image != testSpec().Image {
		t.Errorf("deploy.image params %+v %v", p, err)
	}
	want(t, "ramdisk", d.RamdiskNode, ramdiskID)
	want(t, "lost at", d.LostAt, time.Time{})
}

func nodeBack(t *testing.T, w *world, reboot bool, boot string) {
	t.Helper()
	e := w.s.events[len(w.s.events)-1]
	var data struct {
		Node   string `json:"node"`
		Reboot bool   `json:"reboot"`
		BootID string `json:"boot_id"`
	}
	json.Unmarshal(e.Data, &data)
	want(t, "node.back node", data.Node, nodeID)
	want(t, "node.back reboot", data.Reboot, reboot)
	want(t, "node.back boot id", data.BootID, boot)
}

// newCommands are the commands written since the first n, as kind@node.
func newCommands(s *fakeStore, n int) []string {
	var out []string
	for _, id := range s.cmdOrder[n:] {
		c := s.commands[id]
		out = append(out, cmd(c.Kind, c.NodeID))
	}
	return out
}

func newEvents(s *fakeStore, n int) []string {
	var out []string
	for _, e := range s.events[n:] {
		out = append(out, e.Kind)
	}
	return out
}

// TestTransitions: state × event → next state, step, commands queued,
// events written.
func TestTransitions(t *testing.T) {
	in := testInstall(t)
	ctx := context.Background()
	seen := map[string]bool{}
	for _, tc := range transitions() {
		if seen[tc.name] {
			t.Fatalf("two rows named %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(in)
			tc.from(w)
			tc.event(w)
			cmds, events, writes := len(w.s.cmdOrder), len(w.s.events), w.s.writes
			before := w.s.deps[depID]
			if err := w.c.step(ctx, machineID); err != nil {
				t.Fatalf("step: %v", err)
			}
			m := w.machine()
			d := w.s.deps[depID]
			want(t, "state", m.State, tc.state)
			want(t, "step", d.Step, tc.step)
			if got := newCommands(w.s, cmds); !slices.Equal(got, tc.cmds) {
				t.Errorf("commands %v, want %v", got, tc.cmds)
			}
			if got := newEvents(w.s, events); !slices.Equal(got, tc.events) {
				t.Errorf("events %v, want %v", got, tc.events)
			}
			switch {
			case tc.noWrite && w.s.writes != writes:
				t.Errorf("%d writes, want none", w.s.writes-writes)
			case !tc.noWrite && w.s.writes != writes+1:
				t.Errorf("%d writes, want one", w.s.writes-writes)
			}
			if tc.reason != "" && !strings.Contains(m.StateReason, tc.reason) {
				t.Errorf("state reason %q, want it to contain %q", m.StateReason, tc.reason)
			}
			if slices.Contains(tc.events, evState) != !m.StateChangedAt.IsZero() {
				t.Errorf("state changed at %v with events %v", m.StateChangedAt, tc.events)
			}
			if d.ID != "" && !tc.noWrite {
				want(t, "version", d.Version, before.Version+1)
			}
			// The command the step waits for is a command of the store.
			if d.CommandID != "" {
				if _, ok := w.s.commands[d.CommandID]; !ok {
					t.Errorf("deployment waits for command %s, which does not exist", d.CommandID)
				}
			}
			if tc.check != nil {
				tc.check(t, w, d)
			}
		})
	}
}

func refusalCode(err error) string {
	if r := refusal.As(err); r != nil {
		return r.Code
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return ""
}

// TestDeployTransitions: where Deploy starts a deployment, or why it
// refuses.
func TestDeployTransitions(t *testing.T) {
	in := testInstall(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		setup  func(*world)
		noInst bool
		id     string // the machine deployed, machineID unless set

		code   string // the refusal's, "" for none
		state  string
		step   string
		cmds   []string
		events []string
		check  func(t *testing.T, w *world, d store.Deployment)
	}{
		{name: "its ramdisk connected: ramdisk", setup: func(w *world) { w.connect(oldRamdisk, 4, "b") },
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(protocol.KindInventory, oldRamdisk)}, events: []string{evState, evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "ramdisk", d.RamdiskNode, oldRamdisk)
				want(t, "left ramdisk", d.LeftRamdisk, "")
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Inventory))
				want(t, "boot attempts", d.BootAttempts, 0)
			}},
		{name: "a BMC: pxe-booting, bootdev", setup: nothing,
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "left ramdisk", d.LeftRamdisk, oldRamdisk)
				want(t, "boot mode", w.machine().BootMode, protocol.BootRamdisk)
				want(t, "boot attempts", d.BootAttempts, 0)
				want(t, "deadline", d.Deadline, time.Time{})
				want(t, "command", d.CommandID, "")
			}},
		{name: "its ramdisk retired: pxe-booting", setup: func(w *world) { w.retire(oldRamdisk) },
			state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState}},
		{name: "no BMC: pxe-booting, wait-join", setup: func(w *world) { w.editMachine(func(m *store.Machine) { m.BMC = nil }) },
			state: store.MachinePXEBooting, step: StepWaitJoin, events: []string{evState},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "boot attempts", d.BootAttempts, 1)
				want(t, "deadline", d.Deadline, w.now.Add(tmo.Ramdisk))
				want(t, "left ramdisk", d.LeftRamdisk, oldRamdisk)
				want(t, "boot mode", w.machine().BootMode, protocol.BootRamdisk)
			}},
		{name: "a pending binding is adopted", setup: func(w *world) { w.bindRamdisk(ramdiskID, 5) },
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(protocol.KindInventory, ramdiskID)}, events: []string{evState, evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				adopted(t, w, ramdiskID, "")
				want(t, "ramdisk", d.RamdiskNode, ramdiskID)
			}},
		{name: "the operator's boot override is cleared", setup: func(w *world) {
			w.editMachine(func(m *store.Machine) { m.BootOverride = protocol.BootLocal })
		}, state: store.MachinePXEBooting, step: StepBootdev, events: []string{evState},
			check: func(t *testing.T, w *world, d store.Deployment) {
				want(t, "boot override", w.machine().BootOverride, "")
			}},
		{name: "after a failed deployment, its ramdisk connected: ramdisk, its unused token revoked", setup: atFailed,
			state: store.MachineRamdisk, step: StepInventory, cmds: []string{cmd(protocol.KindInventory, ramdiskID)}, events: []string{evState, evCommand},
			check: func(t *testing.T, w *world, d store.Deployment) {
				revoked(t, w, tokenID)
				want(t, "deployment", w.machine().Deployment, d.ID)
			}},
		{name: "a deployment already running: ALREADY_EXISTS", setup: atDeploy, code: protocol.CodeAlreadyExists,
			state: store.MachineDeploying, step: StepDeploy},
		{name: "an installing machine: ALREADY_EXISTS", setup: atInstall, code: protocol.CodeAlreadyExists,
			state: store.MachineInstalling, step: StepWaitNode},
		{name: "no install configuration: UNSUPPORTED", setup: nothing, noInst: true, code: protocol.CodeUnsupported,
			state: store.MachineRegistered},
		{name: "a machine that does not exist: NOT_FOUND", setup: nothing, id: "m_gone", code: protocol.CodeNotFound,
			state: store.MachineRegistered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(in)
			if tc.noInst {
				w.c.Install = nil
			}
			tc.setup(w)
			w.now = w.now.Add(time.Minute)
			m := w.machine()
			if tc.id != "" {
				m = store.Machine{ID: tc.id, Site: cptest.Site}
			}
			cmds, events, writes := len(w.s.cmdOrder), len(w.s.events), w.s.writes
			before := w.machine().Deployment
			got, started, err := w.c.Deploy(ctx, m, testSpec())
			want(t, "refusal", refusalCode(err), tc.code)
			after := w.machine()
			want(t, "state", after.State, tc.state)
			if tc.code != "" {
				want(t, "writes", w.s.writes, writes)
				want(t, "deployment", after.Deployment, before)
				want(t, "returned", got.ID, "")
				if tc.step != "" {
					want(t, "step", w.s.deps[after.Deployment].Step, tc.step)
				}
				return
			}
			d := w.s.deps[after.Deployment]
			want(t, "deployment", after.Deployment, got.ID)
			want(t, "step", d.Step, tc.step)
			want(t, "returned step", got.Step, tc.step)
			want(t, "returned version", got.Version, int64(1))
			want(t, "started state", started.State, tc.state)
			want(t, "started deployment", started.Deployment, got.ID)
			if got := newCommands(w.s, cmds); !slices.Equal(got, tc.cmds) {
				t.Errorf("commands %v, want %v", got, tc.cmds)
			}
			if got := newEvents(w.s, events); !slices.Equal(got, tc.events) {
				t.Errorf("events %v, want %v", got, tc.events)
			}
			if tc.check != nil {
				tc.check(t, w, d)
			}
		})
	}
}

// TestCancelTransitions: cancel fails the machine, revokes the attempt's
// token, and whatever the agent reports afterwards is ignored.
func TestCancelTransitions(t *testing.T) {
	in := testInstall(t)
	ctx := context.Background()
	for _, from := range []struct {
		name string
		at   func(*world)
	}{{"bootdev", atBootdev}, {"wait-join", atWaitJoin}, {"inventory", atInventory}, {"deploy", atDeploy}, {"install", atInstall}} {
		t.Run(from.name, func(t *testing.T) {
			w := newWorld(in)
			from.at(w)
			w.now = w.now.Add(time.Minute)
			events := len(w.s.events)
			d, err := w.c.Cancel(ctx, w.machine())
			if err != nil {
				t.Fatal(err)
			}
			m := w.machine()
			want(t, "state", m.State, store.MachineFailed)
			want(t, "reason", m.StateReason, "cancelled by operator")
			want(t, "returned outcome", d.Outcome, OutcomeCancelled)
			stored := w.s.deps[depID]
			want(t, "step", stored.Step, StepDone)
			outcome(OutcomeCancelled)(t, w, stored)
			if got := newEvents(w.s, events); !slices.Equal(got, []string{evState}) {
				t.Errorf("events %v", got)
			}
			if _, ok := w.s.tokens[tokenID]; ok {
				revoked(t, w, tokenID)
			}
			// Whatever the agents report now changes nothing.
			for _, id := range []string{bmcCmd, invCmd, deployCmd} {
				if _, ok := w.s.commands[id]; ok {
					w.status(id, protocol.StateSucceeded, "", "")
				}
			}
			w.bindRamdisk("n_rd9", 9)
			w.editMachine(func(m *store.Machine) { m.BindApplied = m.BindSeq })
			writes := w.s.writes
			w.now = w.now.Add(48 * time.Hour)
			if err := w.c.step(ctx, machineID); err != nil {
				t.Fatal(err)
			}
			want(t, "writes after cancel", w.s.writes, writes)
			want(t, "state after cancel", w.machine().State, store.MachineFailed)

			_, err = w.c.Cancel(ctx, w.machine())
			want(t, "cancel again", refusalCode(err), protocol.CodeInvalidInput)
		})
	}
	t.Run("no deployment", func(t *testing.T) {
		w := newWorld(in)
		_, err := w.c.Cancel(ctx, w.machine())
		want(t, "refusal", refusalCode(err), protocol.CodeInvalidInput)
	})
	t.Run("a step wrote meanwhile", func(t *testing.T) {
		w := newWorld(in)
		atDeploy(w)
		stale := w.machine()
		once := false
		w.s.beforeWrite = func() {
			if !once {
				once = true
				w.editDep(func(d *store.Deployment) { d.Version++ })
			}
		}
		if _, err := w.c.Cancel(ctx, stale); err != nil {
			t.Fatal(err)
		}
		want(t, "state", w.machine().State, store.MachineFailed)
		want(t, "outcome", w.s.deps[depID].Outcome, OutcomeCancelled)
	})
}

// TestStepConflict: a step whose deployment or bindings changed between its
// read and its write writes nothing and reports ErrConflict (runStep then
// steps the machine again).
func TestStepConflict(t *testing.T) {
	in := testInstall(t)
	ctx := context.Background()
	t.Run("deployment version", func(t *testing.T) {
		w := newWorld(in)
		atBootdev(w)
		w.status(bmcCmd, protocol.StateSucceeded, "", "")
		w.s.beforeWrite = func() { w.editDep(func(d *store.Deployment) { d.Version++ }) }
		err := w.c.step(ctx, machineID)
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("step: %v, want ErrConflict", err)
		}
		want(t, "commands", len(w.s.cmdOrder), 0)
		want(t, "step", w.s.deps[depID].Step, StepBootdev)
	})
	for name, at := range map[string]func(*world){"no deployment": atRegistered, "waiting for a ramdisk": atWaitJoin} {
		t.Run("a binding arrives meanwhile, "+name, func(t *testing.T) {
			w := newWorld(in)
			at(w)
			w.bindRamdisk(ramdiskID, 0)
			w.s.beforeWrite = func() { w.bindRamdisk("n_rd2", 6) }
			err := w.c.step(ctx, machineID)
			if !errors.Is(err, store.ErrConflict) {
				t.Fatalf("step: %v, want ErrConflict", err)
			}
			want(t, "machine ramdisk", w.machine().RamdiskNode, oldRamdisk)
			w.s.beforeWrite = nil
			if err := w.c.step(ctx, machineID); err != nil {
				t.Fatal(err)
			}
			adopted(t, w, "n_rd2", "")
		})
	}
}

// TestWalk: one deployment from Deploy to provisioned, each step on what
// the agents reported, the ramdisk lost once within the grace on the way.
func TestWalk(t *testing.T) {
	in := testInstall(t)
	ctx := context.Background()
	w := newWorld(in)
	if _, _, err := w.c.Deploy(ctx, w.machine(), testSpec()); err != nil {
		t.Fatal(err)
	}
	step := func(state, st string) store.Deployment {
		t.Helper()
		w.now = w.now.Add(time.Second)
		if err := w.c.step(ctx, machineID); err != nil {
			t.Fatal(err)
		}
		d := w.s.deps[w.machine().Deployment]
		if w.machine().State != state || d.Step != st {
			t.Fatalf("%s/%s, want %s/%s (%s)", w.machine().State, d.Step, state, st, w.machine().StateReason)
		}
		return d
	}
	d := step(store.MachinePXEBooting, StepBootdev)
	w.status(d.CommandID, protocol.StateSucceeded, "", "")
	d = step(store.MachinePXEBooting, StepPower)
	w.status(d.CommandID, protocol.StateSucceeded, "", "")
	step(store.MachinePXEBooting, StepWaitJoin)
	w.connect(oldRamdisk, 4, "old")
	step(store.MachinePXEBooting, StepWaitJoin)
	w.bindRamdisk(ramdiskID, 5)
	d = step(store.MachineRamdisk, StepInventory)
	w.status(d.CommandID, protocol.StateSucceeded, "", "")
	d = step(store.MachineDeploying, StepDeploy)
	w.disconnect(ramdiskID)
	step(store.MachineDeploying, StepDeploy)
	w.connect(ramdiskID, 6, "boot-n_rd")
	step(store.MachineDeploying, StepDeploy)
	w.status(d.CommandID, protocol.StateSucceeded, "", "")
	step(store.MachineInstalling, StepWaitNode)
	w.bindNode(d.NodeID, protocol.NodeReady, 7, "b1")
	d = step(store.MachineProvisioned, StepDone)
	want(t, "outcome", d.Outcome, OutcomeProvisioned)
	want(t, "boot attempts", d.BootAttempts, 1)
	want(t, "deploy attempts", d.DeployAttempts, 1)
	adopted(t, w, "", d.NodeID)
	var states []string
	for _, e := range w.s.events {
		if e.Kind == evState {
			var data struct{ To string }
			json.Unmarshal(e.Data, &data)
			states = append(states, data.To)
		}
	}
	if want := []string{store.MachinePXEBooting, store.MachineRamdisk, store.MachineDeploying, store.MachineInstalling, store.MachineProvisioned}; !slices.Equal(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	step(store.MachineProvisioned, StepDone)
}

// fakeStore is a hand-written in-memory fake of the lifecycle's Store
// interface, so that the controller's transitions can be tested alone,
// without SQLite and without goroutines. It applies a store.DeploymentChange
// the way the real store's transaction does (the machine's bindings adopted
// under the BindSeq check, its state with a "state" event, the boot mode,
// revoked and new tokens, the step's events, the commands each with its
// "command" event, Finish), and checks Version (ErrConflict) in
// AdvanceDeployment and a running deployment (ErrDeploymentActive) in
// StartDeployment. controlplane/lifecycle_test.go runs the same controller
// on the real SQLite store, with the gateway and the JoinService.
type fakeStore struct {
	machines map[string]store.Machine
	deps     map[string]store.Deployment
	nodes    map[string]store.Node
	sessions map[int64]store.Session
	commands map[string]store.Command
	tokens   map[string]store.Token

	// cmdOrder is the order commands were created in; events the timeline
	// of every machine, in the order written.
	cmdOrder []string
	events   []store.MachineEvent
	// writes counts the successful StartDeployment, AdvanceDeployment and
	// AdoptBindings calls.
	writes int
	// beforeWrite, when set, runs at the start of each write: another
	// writer getting in between a step's read and its write.
	beforeWrite func()
}

var _ Store = (*fakeStore)(nil)

func newFakeStore() *fakeStore {
	return &fakeStore{
		machines: map[string]store.Machine{},
		deps:     map[string]store.Deployment{},
		nodes:    map[string]store.Node{},
		sessions: map[int64]store.Session{},
		commands: map[string]store.Command{},
		tokens:   map[string]store.Token{},
	}
}

func notFound(what, id string) error {
	return fmt.Errorf("fake store: %s %s: %w", what, id, store.ErrNotFound)
}

func (s *fakeStore) GetMachine(_ context.Context, id string) (store.Machine, error) {
	m, ok := s.machines[id]
	if !ok {
		return m, notFound("machine", id)
	}
	return m, nil
}

func (s *fakeStore) GetNode(_ context.Context, id string) (store.Node, error) {
	n, ok := s.nodes[id]
	if !ok {
		return n, notFound("node", id)
	}
	return n, nil
}

func (s *fakeStore) ListNodes(context.Context) ([]store.Node, error) {
	var out []store.Node
	for _, n := range s.nodes {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *fakeStore) GetCommand(_ context.Context, id string) (store.Command, error) {
	c, ok := s.commands[id]
	if !ok {
		return c, notFound("command", id)
	}
	return c, nil
}

func (s *fakeStore) GetSession(_ context.Context, id int64) (store.Session, error) {
	se, ok := s.sessions[id]
	if !ok {
		return se, notFound("session", fmt.Sprint(id))
	}
	return se, nil
}

func (s *fakeStore) AdoptBindings(_ context.Context, id string, ch store.StatusChange) (store.Machine, error) {
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	m, ok := s.machines[id]
	if !ok {
		return m, notFound("machine", id)
	}
	if err := adoptInto(&m, ch); err != nil {
		return store.Machine{}, err
	}
	s.machines[id] = m
	s.writes++
	return m, nil
}

// adoptInto is the store's adoptBindings: only while ch.BindSeq is still
// the machine's.
func adoptInto(m *store.Machine, ch store.StatusChange) error {
	if m.BindSeq != ch.BindSeq {
		return fmt.Errorf("fake store: adopt bindings of %s: %w", m.ID, store.ErrConflict)
	}
	m.RamdiskNode, m.Node, m.BindApplied, m.UpdatedAt = ch.RamdiskNode, ch.Node, ch.BindSeq, ch.At
	return nil
}

func (s *fakeStore) StartDeployment(_ context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	m, ok := s.machines[d.MachineID]
	if !ok {
		return d, notFound("machine", d.MachineID)
	}
	if cur, ok := s.deps[m.Deployment]; ok {
		if !cur.Finished() {
			return d, fmt.Errorf("fake store: deployment %s: %w", cur.ID, store.ErrDeploymentActive)
		}
		if cur.TokenID != "" {
			ch.RevokeTokens = append(ch.RevokeTokens, cur.TokenID)
		}
	}
	if _, ok := s.deps[d.ID]; ok {
		return d, fmt.Errorf("fake store: deployment %s: %w", d.ID, store.ErrExists)
	}
	d.Version, d.CreatedAt, d.UpdatedAt = 1, ch.At, ch.At
	m.Deployment, m.BootOverride, m.UpdatedAt = d.ID, "", ch.At
	if err := s.apply(&m, d.ID, ch); err != nil {
		return d, err
	}
	if ch.Finish != "" {
		d.Outcome, d.FinishedAt = ch.Finish, ch.At
	}
	s.deps[d.ID] = d
	s.machines[m.ID] = m
	s.writes++
	return d, nil
}

func (s *fakeStore) GetDeployment(_ context.Context, id string) (store.Deployment, error) {
	d, ok := s.deps[id]
	if !ok {
		return d, notFound("deployment", id)
	}
	return d, nil
}

func (s *fakeStore) OpenDeployments(context.Context) ([]store.Deployment, error) {
	var out []store.Deployment
	for _, d := range s.deps {
		if !d.Finished() {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (s *fakeStore) AdvanceDeployment(_ context.Context, d store.Deployment, ch store.DeploymentChange) (store.Deployment, error) {
	if s.beforeWrite != nil {
		s.beforeWrite()
	}
	cur, ok := s.deps[d.ID]
	if !ok {
		return d, notFound("deployment", d.ID)
	}
	if cur.Version != d.Version {
		return d, fmt.Errorf("fake store: advance deployment %s: %w", d.ID, store.ErrConflict)
	}
	m, ok := s.machines[d.MachineID]
	if !ok {
		return d, notFound("machine", d.MachineID)
	}
	if ch.Finish != "" {
		d.Outcome, d.FinishedAt = ch.Finish, ch.At
	}
	if err := s.apply(&m, d.ID, ch); err != nil {
		return d, err
	}
	d.Version++
	d.UpdatedAt = ch.At
	s.deps[d.ID] = d
	s.machines[m.ID] = m
	s.writes++
	return d, nil
}

// apply is the store's applyChange, on copies that the caller keeps only
// when it succeeds (one transaction).
func (s *fakeStore) apply(m *store.Machine, deploymentID string, ch store.DeploymentChange) error {
	if ch.Adopt != nil {
		if err := adoptInto(m, *ch.Adopt); err != nil {
			return err
		}
	}
	var events []store.MachineEvent
	if ch.State != "" {
		msg := ch.State
		if ch.Reason != "" {
			msg += ": " + ch.Reason
		}
		events = append(events, store.MachineEvent{MachineID: m.ID, Time: ch.At, Kind: protocol.MachineEventState, Message: msg,
			Data: []byte(fmt.Sprintf(`{"from":%q,"to":%q,"deployment":%q}`, m.State, ch.State, deploymentID))})
		m.State, m.StateReason, m.StateChangedAt, m.UpdatedAt = ch.State, ch.Reason, ch.At, ch.At
	}
	if ch.BootMode != nil {
		m.BootMode = *ch.BootMode
	}
	tokens := map[string]store.Token{}
	for _, id := range ch.RevokeTokens {
		if t, ok := s.tokens[id]; ok && t.RevokedAt.IsZero() && t.UsedAt.IsZero() {
			t.RevokedAt = ch.At
			tokens[id] = t
		}
	}
	for _, t := range ch.Tokens {
		if _, ok := s.tokens[t.ID]; ok {
			return fmt.Errorf("fake store: token %s: %w", t.ID, store.ErrExists)
		}
		tokens[t.ID] = t
	}
	for _, e := range ch.Events {
		e.MachineID = m.ID
		if e.Time.IsZero() {
			e.Time = ch.At
		}
		events = append(events, e)
	}
	var cmds []string
	for _, c := range ch.Commands {
		if _, ok := s.commands[c.ID]; ok || slices.Contains(cmds, c.ID) {
			return fmt.Errorf("fake store: command %s: %w", c.ID, store.ErrExists)
		}
		cmds = append(cmds, c.ID)
		if c.MachineID != "" {
			events = append(events, store.MachineEvent{MachineID: c.MachineID, Time: c.CreatedAt, Kind: protocol.MachineEventCommand,
				Message: c.Kind + " for node " + c.NodeID, NodeID: c.NodeID, CommandID: c.ID})
		}
	}
	// Nothing failed: the transaction commits.
	for id, t := range tokens {
		s.tokens[id] = t
	}
	for _, c := range ch.Commands {
		s.commands[c.ID] = c
	}
	s.cmdOrder = append(s.cmdOrder, cmds...)
	s.events = append(s.events, events...)
	return nil
}

func (s *fakeStore) FindMachineByNode(_ context.Context, nodeID string) (store.Machine, error) {
	if nodeID != "" {
		for _, m := range s.machines {
			if m.Node == nodeID || m.RamdiskNode == nodeID || m.BoundNode == nodeID || m.BoundRamdisk == nodeID {
				return m, nil
			}
		}
	}
	return store.Machine{}, notFound("machine of node", nodeID)
}

func (s *fakeStore) ListMachinesInState(_ context.Context, state string) ([]store.Machine, error) {
	return s.list(func(m store.Machine) bool { return m.State == state }), nil
}

func (s *fakeStore) ListMachinesWithPendingBindings(context.Context) ([]store.Machine, error) {
	return s.list(store.Machine.PendingBindings), nil
}

func (s *fakeStore) list(keep func(store.Machine) bool) []store.Machine {
	var out []store.Machine
	for _, m := range s.machines {
		if keep(m) {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// TestDeployBindingRace: a binding that arrives while Deploy adopts a
// pending one makes the start conflict; the caller is told to try again
// (a retryable refusal), not given the store's error.
func TestDeployBindingRace(t *testing.T) {
	w := newWorld(testInstall(t))
	w.bindRamdisk(ramdiskID, 0)
	w.s.beforeWrite = func() { w.bindRamdisk("n_rd2", 6) }
	_, _, err := w.c.Deploy(context.Background(), w.machine(), testSpec())
	r := refusal.As(err)
	if r == nil || r.Code != protocol.CodeUnavailable || !r.Retryable {
		t.Fatalf("deploy: %v, want a retryable UNAVAILABLE", err)
	}
	want(t, "deployment", w.machine().Deployment, "")
	w.s.beforeWrite = nil
	if _, _, err := w.c.Deploy(context.Background(), w.machine(), testSpec()); err != nil {
		t.Fatal(err)
	}
	want(t, "state", w.machine().State, store.MachineRamdisk)
	adopted(t, w, "n_rd2", "")
}
