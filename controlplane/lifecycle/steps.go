package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// Steps of a deployment within its machine's state (store.Deployment.Step).
const (
	StepBootdev   = "bootdev"   // pxe-booting: bmc.bootdev pxe, to send or sent
	StepPower     = "power"     // pxe-booting: bmc.power cycle, to send or sent
	StepWaitJoin  = "wait-join" // pxe-booting: waiting for a ramdisk to join and connect
	StepInventory = "inventory" // ramdisk: inventory sent
	StepDeploy    = "deploy"    // deploying: deploy.image sent
	StepWaitNode  = "wait-node" // installing: waiting for the installed OS's node
	StepDone      = "done"      // provisioned, failed or cancelled
)

// Outcomes of a finished deployment (store.Deployment.Outcome).
const (
	OutcomeProvisioned = "provisioned"
	OutcomeFailed      = "failed"
	OutcomeCancelled   = "cancelled"
)

// plan is one step of one machine: the deployment as it will be written and
// what goes with it in the same transaction.
type plan struct {
	c          *Controller
	m          store.Machine
	d          store.Deployment
	ch         store.DeploymentChange
	now        time.Time
	dirty      bool
	oldCommand string
	// written is the result of the deploy.image this step saw succeed.
	written *protocol.DeployImageResult
}

func (p *plan) state(state, reason string) {
	p.ch.State, p.ch.Reason = state, reason
	p.dirty = true
}

func (p *plan) note(kind, msg string, data map[string]any) {
	if data == nil {
		data = map[string]any{}
	}
	data["deployment"] = p.d.ID
	b, _ := json.Marshal(data)
	p.ch.Events = append(p.ch.Events, store.MachineEvent{Time: p.now, Kind: kind, Message: msg, Data: b})
	p.dirty = true
}

// command queues a command about the machine for node, as the step's.
func (p *plan) command(node, kind string, params any) {
	c, err := machines.NewCommand(p.now, node, p.m.ID, kind, params)
	if err != nil {
		// The params are the protocol's own types: they always encode.
		panic(err)
	}
	p.ch.Commands = append(p.ch.Commands, c)
	p.d.CommandID = c.ID
	p.dirty = true
}

// adopt takes the bindings the JoinService recorded (MachineObserved) into
// the machine's status, written with the step: the lifecycle is the only
// writer of a machine's status, and it learns that a node joined for the
// machine from BindSeq, not by comparing records.
func (p *plan) adopt() {
	m := &p.m
	if !m.PendingBindings() {
		return
	}
	p.ch.Adopt = &store.StatusChange{BindSeq: m.BindSeq, RamdiskNode: m.BoundRamdisk, Node: m.BoundNode, At: p.now}
	m.RamdiskNode, m.Node, m.BindApplied = m.BoundRamdisk, m.BoundNode, m.BindSeq
	p.dirty = true
}

func (p *plan) revokeToken() {
	if p.d.TokenID != "" {
		p.ch.RevokeTokens = append(p.ch.RevokeTokens, p.d.TokenID)
	}
}

// fail ends the deployment: the machine is failed with reason.
func (p *plan) fail(reason, outcome string) {
	p.revokeToken()
	p.d.Step, p.d.CommandID, p.d.Deadline, p.d.LostAt = StepDone, "", time.Time{}, time.Time{}
	p.state(store.MachineFailed, reason)
	p.ch.Finish = outcome
}

// step looks at one machine and moves its deployment on as far as what is
// stored allows.
func (c *Controller) step(ctx context.Context, id string) error {
	m, err := c.Store.GetMachine(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	p := &plan{c: c, m: m, now: c.now()}
	p.adopt()
	var d store.Deployment
	if m.Deployment != "" {
		d, err = c.Store.GetDeployment(ctx, m.Deployment)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	if d.ID == "" {
		// No deployment to step: only the bindings to adopt.
		if p.ch.Adopt == nil {
			return nil
		}
		if _, err := c.Store.AdoptBindings(ctx, m.ID, *p.ch.Adopt); err != nil {
			return err
		}
		c.watchNode(p.m.RamdiskNode, m.ID)
		c.watchNode(p.m.Node, m.ID)
		return nil
	}
	c.watchCommand(d.CommandID, m.ID)
	c.watchNode(d.RamdiskNode, m.ID)
	c.watchNode(d.NodeID, m.ID)
	p.d, p.oldCommand = d, d.CommandID
	m = p.m
	if d.Finished() {
		if d.Outcome == OutcomeProvisioned && m.State == store.MachineProvisioned {
			err = p.provisioned(ctx)
		}
	} else {
		switch m.State {
		case store.MachinePXEBooting:
			err = p.pxeBooting(ctx)
		case store.MachineRamdisk:
			err = p.ramdisk(ctx)
		case store.MachineDeploying:
			err = p.deploying(ctx)
		case store.MachineInstalling:
			err = p.installing(ctx)
		default:
			p.fail(fmt.Sprintf("the machine is %s, a state its deployment does not run in", m.State), OutcomeFailed)
		}
	}
	if err != nil || !p.dirty {
		return err
	}
	p.ch.At = p.now
	if _, err := c.Store.AdvanceDeployment(ctx, p.d, p.ch); err != nil {
		return err
	}
	if p.ch.State != "" {
		c.log().Info("machine state", "machine", m.ID, "deployment", d.ID, "from", m.State, "to", p.ch.State, "reason", p.ch.Reason)
	}
	c.applied(p)
	return nil
}

// pxeBooting: the boot entry is ramdisk; bmc.bootdev pxe, then bmc.power
// cycle, then the wait for a ramdisk that is not the one left behind.
func (p *plan) pxeBooting(ctx context.Context) error {
	d, m := &p.d, p.m
	if m.RamdiskNode != "" && m.RamdiskNode != d.LeftRamdisk {
		live, err := p.c.liveRamdisk(ctx, m.RamdiskNode)
		if err != nil {
			return err
		}
		if live {
			p.enterRamdisk(m.RamdiskNode, fmt.Sprintf("ramdisk node %s joined and is connected", m.RamdiskNode))
			return nil
		}
	}
	switch d.Step {
	case StepBootdev, StepPower:
		return p.bmc(ctx)
	case StepWaitJoin:
		if p.now.Before(d.Deadline) {
			return nil
		}
		return p.rebootIntoRamdisk(fmt.Sprintf("no ramdisk joined within %s", p.c.timeouts().Ramdisk))
	}
	d.Step, d.CommandID, d.Deadline = StepBootdev, "", time.Time{}
	p.dirty = true
	return nil
}

// bmc drives the BMC command of the step: send it, and on its answer go on,
// send it again (BMCRetries), or fail.
func (p *plan) bmc(ctx context.Context) error {
	d := &p.d
	t := p.c.timeouts()
	what := "bmc.bootdev pxe"
	if d.Step == StepPower {
		what = "bmc.power cycle"
	}
	if d.CommandID == "" {
		return p.sendBMC(ctx)
	}
	cmd, err := p.c.Store.GetCommand(ctx, d.CommandID)
	if errors.Is(err, store.ErrNotFound) {
		return p.bmcFailed(ctx, fmt.Sprintf("%s: command %s is gone", what, d.CommandID))
	}
	if err != nil {
		return err
	}
	switch cmd.State {
	case protocol.StateSucceeded:
		d.CommandID, d.BMCAttempts, d.Deadline = "", 0, time.Time{}
		if d.Step == StepBootdev {
			d.Step = StepPower
			return p.sendBMC(ctx)
		}
		d.BootAttempts++
		d.Step, d.Deadline = StepWaitJoin, p.now.Add(t.Ramdisk)
		p.note(protocol.MachineEventNote, fmt.Sprintf("power cycled (%d of %d); waiting up to %s for the ramdisk to join", d.BootAttempts,
			1+p.c.bootRetries(), t.Ramdisk), map[string]any{"boot_attempt": d.BootAttempts})
		return nil
	case protocol.StateFailed, protocol.StateUnsupported:
		return p.bmcFailed(ctx, fmt.Sprintf("%s %s: %s", what, cmd.State, reasonOf(cmd)))
	}
	if p.now.Before(d.Deadline) {
		return nil
	}
	return p.bmcFailed(ctx, fmt.Sprintf("%s: no answer from site agent %s within %s (command %s is %s)", what, cmd.NodeID, t.BMC, cmd.ID, cmd.State))
}

func (p *plan) bmcFailed(ctx context.Context, why string) error {
	d := &p.d
	if d.BMCAttempts > p.c.bmcRetries() {
		p.fail(why, OutcomeFailed)
		return nil
	}
	p.note(protocol.MachineEventNote, why+"; sending it again", nil)
	d.CommandID, d.Deadline = "", time.Time{}
	return p.sendBMC(ctx)
}

// sendBMC sends the step's BMC command to a connected site agent of the
// machine's site, waiting up to the BMC timeout for one to be connected.
func (p *plan) sendBMC(ctx context.Context) error {
	d, m := &p.d, p.m
	t := p.c.timeouts()
	agent, err := p.c.siteAgent(ctx, m.Site)
	if err != nil {
		return err
	}
	if agent == "" {
		switch {
		case d.Deadline.IsZero():
			d.Deadline = p.now.Add(t.BMC)
			p.note(protocol.MachineEventNote, fmt.Sprintf("no site agent of site %s is connected to drive the BMC; waiting up to %s for one", m.Site, t.BMC), nil)
		case !p.now.Before(d.Deadline):
			p.fail(fmt.Sprintf("no site agent of site %s connected within %s to drive the BMC", m.Site, t.BMC), OutcomeFailed)
		}
		return nil
	}
	d.BMCAttempts++
	d.Deadline = p.now.Add(t.BMC)
	if d.Step == StepPower {
		p.command(agent, protocol.KindBMCPower, protocol.BMCPowerParams{Machine: m.ID, Action: protocol.PowerCycle})
		return nil
	}
	p.command(agent, protocol.KindBMCBootdev, protocol.BMCBootdevParams{Machine: m.ID, Device: protocol.BootDevicePXE,
		EFI: m.Firmware == store.FirmwareUEFI})
	return nil
}

// siteAgent is the connected site agent of site seen last, "" for none.
func (c *Controller) siteAgent(ctx context.Context, site string) (string, error) {
	nodes, err := c.Store.ListNodes(ctx)
	if err != nil {
		return "", err
	}
	best, _ := machines.PickSiteAgent(nodes, site)
	return best.ID, nil
}

// rebootIntoRamdisk goes back to pxe-booting, within the boot budget, or
// fails with why.
func (p *plan) rebootIntoRamdisk(why string) error {
	d := &p.d
	budget := 1 + p.c.bootRetries()
	switch {
	case p.m.BMC == nil:
		p.fail(why+"; the machine has no BMC to power-cycle it", OutcomeFailed)
		return nil
	case d.BootAttempts >= budget:
		p.fail(fmt.Sprintf("%s; gave up after %d power cycles", why, d.BootAttempts), OutcomeFailed)
		return nil
	}
	p.revokeToken()
	// The ramdisk in use, if any, is the one left behind: the next to join
	// is another node.
	if d.RamdiskNode != "" {
		d.LeftRamdisk = d.RamdiskNode
	}
	d.RamdiskNode = ""
	d.Step, d.CommandID, d.BMCAttempts, d.Deadline, d.LostAt = StepBootdev, "", 0, time.Time{}, time.Time{}
	mode := protocol.BootRamdisk
	p.ch.BootMode = &mode
	p.state(store.MachinePXEBooting, fmt.Sprintf("%s; PXE-booting the ramdisk again (power cycle %d of %d)", why, d.BootAttempts+1, budget))
	return nil
}

// enterRamdisk makes node the deployment's ramdisk and asks it for its
// inventory.
func (p *plan) enterRamdisk(node, why string) {
	d := &p.d
	d.RamdiskNode, d.LeftRamdisk, d.LostAt, d.BMCAttempts = node, "", time.Time{}, 0
	d.Step, d.Deadline = StepInventory, p.now.Add(p.c.timeouts().Inventory)
	p.command(node, protocol.KindInventory, nil)
	p.state(store.MachineRamdisk, why)
}

// ramdisk: the inventory, then deploy.image.
func (p *plan) ramdisk(ctx context.Context) error {
	seen, err := p.observeRamdisk(ctx)
	if err != nil {
		return err
	}
	if handled, err := p.checkRamdisk(seen, "inventory"); handled || err != nil {
		return err
	}
	d := &p.d
	if d.CommandID != "" {
		cmd, err := p.c.Store.GetCommand(ctx, d.CommandID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		done := err == nil && protocol.Terminal(cmd.State)
		if !done && p.now.Before(d.Deadline) {
			return nil
		}
		switch {
		case !done:
			p.note(protocol.MachineEventNote, fmt.Sprintf("no inventory within %s; deploying without it", p.c.timeouts().Inventory), nil)
		case cmd.State != protocol.StateSucceeded:
			p.note(protocol.MachineEventNote, fmt.Sprintf("inventory %s: %s; deploying all the same", cmd.State, reasonOf(cmd)), nil)
		}
	}
	return p.startDeploy(ctx, "")
}

// startDeploy sends deploy.image with a fresh node id and token, to a
// ramdisk that proved the machine's enrolled TPM endorsement key when it
// has one (see heldForEK).
func (p *plan) startDeploy(ctx context.Context, why string) error {
	d, m := &p.d, p.m
	t := p.c.timeouts()
	if held, err := p.heldForEK(ctx); held || err != nil {
		return err
	}
	nodeID := ids.New(ids.PrefixNode, p.now)
	j := token.NewJoin(p.now)
	// The node agent a stock image gets is built for the ramdisk's
	// architecture, the machine's.
	arch := ""
	if n, err := p.c.Store.GetNode(ctx, d.RamdiskNode); err == nil {
		arch = n.DaemonArch
	}
	params, err := p.c.deployParams(m, d.Spec, j.Token, nodeID, arch)
	if err != nil {
		p.fail(fmt.Sprintf("building deploy.image: %v", err), OutcomeFailed)
		return nil
	}
	ttl := p.c.TokenTTL
	if ttl <= 0 {
		ttl = DefaultTokenTTL
	}
	p.revokeToken()
	p.ch.Tokens = append(p.ch.Tokens, store.Token{ID: j.ID, Hash: j.Hash, Pool: d.Spec.Pool, Site: m.Site, Role: protocol.RoleNode,
		NodeID: nodeID, MachineID: m.ID, CreatedAt: p.now, ExpiresAt: p.now.Add(ttl)})
	d.DeployAttempts++
	d.NodeID, d.TokenID, d.LostAt = nodeID, j.ID, time.Time{}
	d.Step, d.Deadline = StepDeploy, p.now.Add(t.Deploy)
	p.command(d.RamdiskNode, protocol.KindDeployImage, params)
	reason := fmt.Sprintf("deploy.image %s to ramdisk node %s (attempt %d); the installed OS will join as node %s",
		protocol.RedactURL(d.Spec.Image.URL), d.RamdiskNode, d.DeployAttempts, nodeID)
	if why != "" {
		reason = why + "; " + reason
	}
	p.state(store.MachineDeploying, reason)
	return nil
}

// heldForEK holds deploy.image, which carries the installed OS's join
// token, from a ramdisk that did not prove the machine's enrolled TPM
// endorsement key (store.Node.ProvenEKSHA256): one that joined before the
// EK was enrolled, or with another. A deploy.held entry goes on the
// timeline and the machine PXE-boots the ramdisk again (whose join then
// proves the EK), within the boot budget.
func (p *plan) heldForEK(ctx context.Context) (bool, error) {
	d, m := &p.d, p.m
	if m.TPMEKSHA256 == "" {
		return false, nil
	}
	n, err := p.c.Store.GetNode(ctx, d.RamdiskNode)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	if n.ProvenEKSHA256 == m.TPMEKSHA256 {
		return false, nil
	}
	proved := "proved no TPM endorsement key"
	if n.ProvenEKSHA256 != "" {
		proved = "proved endorsement key " + n.ProvenEKSHA256
	}
	why := fmt.Sprintf("deploy.image held: machine %s has TPM endorsement key %s enrolled and ramdisk node %s %s; the installed OS's join token goes only to a ramdisk that proves the machine's TPM",
		m.ID, m.TPMEKSHA256, d.RamdiskNode, proved)
	p.note(protocol.MachineEventDeployHeld, why, map[string]any{"ramdisk": d.RamdiskNode, "enrolled_ek_sha256": m.TPMEKSHA256,
		"proven_ek_sha256": n.ProvenEKSHA256})
	return true, p.rebootIntoRamdisk(why)
}

// deployParams are an attempt's deploy.image params: the spec and the four
// files the installed OS joins with. They hold the token: they go into the
// command and nowhere else.
func (c *Controller) deployParams(m store.Machine, spec store.DeploySpec, tok, nodeID, arch string) (protocol.DeployImageParams, error) {
	if c.Install == nil {
		return protocol.DeployImageParams{}, errors.New("the control plane has no install configuration")
	}
	in := *c.Install
	in.Site, in.Token, in.NodeID = m.Site, tok, nodeID
	files, err := machines.InstallFiles(in)
	if err != nil {
		return protocol.DeployImageParams{}, err
	}
	seed, err := machines.SeedFiles(spec.Seed, nodeID)
	if err != nil {
		return protocol.DeployImageParams{}, err
	}
	p := spec.Params(append(files, seed...))
	if spec.BCDVersion != "" {
		if arch == "" {
			arch = "amd64" // a ramdisk that reported none is an amd64 build
		}
		var found bool
		for _, b := range spec.NodeAgent {
			if b.Arch == arch {
				p.NodeAgent = &protocol.DeployNodeAgent{Version: spec.BCDVersion, URL: b.URL, SHA256: b.SHA256, Size: b.Size}
				found = true
			}
		}
		if !found {
			return protocol.DeployImageParams{}, fmt.Errorf("release %s has no bcd for linux/%s (the ramdisk's architecture)", spec.BCDVersion, arch)
		}
	}
	if err := p.Validate(); err != nil {
		return protocol.DeployImageParams{}, err
	}
	return p, nil
}

// deploying: deploy.image runs; SUCCEEDED is the only way on.
func (p *plan) deploying(ctx context.Context) error {
	d := &p.d
	t := p.c.timeouts()
	// The ramdisk before the command: a session that closed after a
	// terminal status was stored (a kexec) then shows that status, so a
	// deploy that succeeded is never taken for a ramdisk lost mid-way.
	seen, err := p.observeRamdisk(ctx)
	if err != nil {
		return err
	}
	cmd, err := p.c.Store.GetCommand(ctx, d.CommandID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return p.deployFailed(ctx, fmt.Sprintf("deploy.image command %s is gone", d.CommandID))
	case err != nil:
		return err
	case cmd.State == protocol.StateSucceeded:
		p.installed(cmd)
		return nil
	case cmd.State == protocol.StateFailed && cmd.Reason == protocol.ReasonNodeDeleted:
		return p.rebootIntoRamdisk(fmt.Sprintf("ramdisk node %s was retired during deploy.image (%s)", d.RamdiskNode, cmd.Message))
	case cmd.State == protocol.StateFailed || cmd.State == protocol.StateUnsupported:
		return p.deployFailed(ctx, fmt.Sprintf("deploy.image %s: %s", cmd.State, reasonOf(cmd)))
	}
	if handled, err := p.checkRamdisk(seen, "deploy.image"); handled || err != nil {
		return err
	}
	if p.now.Before(d.Deadline) {
		return nil
	}
	return p.rebootIntoRamdisk(fmt.Sprintf("deploy.image did not finish within %s (command %s is %s)", t.Deploy, cmd.ID, cmd.State))
}

// deployFailed sends deploy.image again while the deploy budget lasts: to
// the same ramdisk when it is connected, else through a new PXE boot. Only
// FAILED reports count against it; a ramdisk lost mid-way counts against
// the power cycles.
func (p *plan) deployFailed(ctx context.Context, why string) error {
	d := &p.d
	d.DeployFailures++
	if d.DeployFailures > p.c.deployRetries() {
		p.fail(fmt.Sprintf("%s; gave up after %d failed deploy.image attempts", why, d.DeployFailures), OutcomeFailed)
		return nil
	}
	live, err := p.c.liveRamdisk(ctx, d.RamdiskNode)
	if err != nil {
		return err
	}
	if live {
		return p.startDeploy(ctx, why+"; sending it again")
	}
	return p.rebootIntoRamdisk(why)
}

// installed: deploy.image SUCCEEDED; the installed OS boots.
func (p *plan) installed(cmd store.Command) {
	d := &p.d
	t := p.c.timeouts()
	var res protocol.DeployImageResult
	json.Unmarshal(cmd.Result, &res)
	p.written = &res
	summary, data := deploySummary(res)
	p.note(protocol.MachineEventDeployDone, "deploy.image "+summary, data)
	d.Step, d.CommandID, d.Deadline, d.LostAt = StepWaitNode, "", p.now.Add(t.Install), time.Time{}
	next := "the ramdisk kexecs into the installed OS"
	if d.Spec.After == protocol.AfterReboot {
		// The machine reboots at once: it must find the local entry, not
		// the ramdisk's.
		mode := protocol.BootLocal
		p.ch.BootMode = &mode
		next = "the machine reboots from its disk (boot entry local)"
	}
	p.state(store.MachineInstalling, fmt.Sprintf("deploy.image succeeded; %s; waiting up to %s for node %s", next, t.Install, d.NodeID))
}

// installing: waits for the installed OS's node to join and be welcomed.
func (p *plan) installing(ctx context.Context) error {
	d := &p.d
	if p.m.Node == d.NodeID && d.NodeID != "" {
		n, err := p.c.Store.GetNode(ctx, d.NodeID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if err == nil && !n.Deleted() && n.SessionID != 0 && n.State == protocol.NodeReady {
			se, err := p.c.Store.GetSession(ctx, n.SessionID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			mode := protocol.BootLocal
			p.ch.BootMode = &mode
			d.NodeSession, d.NodeBootID = n.SessionID, se.BootID
			d.Step, d.Deadline = StepDone, time.Time{}
			p.state(store.MachineProvisioned, fmt.Sprintf("node %s ready", n.ID))
			p.note(protocol.MachineEventNodeReady, fmt.Sprintf("node ready: the installed OS joined as node %s and its session was welcomed; boot entry local", n.ID),
				map[string]any{"node": n.ID})
			p.ch.Finish = OutcomeProvisioned
			return nil
		}
	}
	if p.now.Before(d.Deadline) {
		return nil
	}
	return p.rebootIntoRamdisk(fmt.Sprintf("the installed OS did not join as node %s and connect within %s", d.NodeID, p.c.timeouts().Install))
}

// ramdiskSeen is the deployment's ramdisk as a step found it.
type ramdiskSeen struct {
	gone      bool // retired, or unknown
	connected bool
}

func (p *plan) observeRamdisk(ctx context.Context) (ramdiskSeen, error) {
	n, err := p.c.Store.GetNode(ctx, p.d.RamdiskNode)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return ramdiskSeen{gone: true}, nil
	case err != nil:
		return ramdiskSeen{}, err
	}
	return ramdiskSeen{gone: n.Deleted(), connected: n.SessionID != 0}, nil
}

// checkRamdisk acts on the deployment's ramdisk as seen: retired is lost at
// once; a closed session is lost once it stays closed for the grace period
// (a gateway restart comes back well within it). handled says the step has
// nothing more to do now.
func (p *plan) checkRamdisk(seen ramdiskSeen, during string) (handled bool, err error) {
	d := &p.d
	grace := p.c.timeouts().Grace
	switch {
	case seen.gone:
		return true, p.rebootIntoRamdisk(fmt.Sprintf("ramdisk node %s was retired during %s", d.RamdiskNode, during))
	case !seen.connected && d.LostAt.IsZero():
		d.LostAt = p.now
		p.note(protocol.MachineEventNote, fmt.Sprintf("ramdisk node %s disconnected during %s; waiting up to %s for it to come back", d.RamdiskNode, during, grace), nil)
		return true, nil
	case !seen.connected && p.now.Sub(d.LostAt) < grace:
		return true, nil
	case !seen.connected:
		return true, p.rebootIntoRamdisk(fmt.Sprintf("the ramdisk disconnected during %s and did not come back within %s", during, grace))
	case !d.LostAt.IsZero():
		d.LostAt = time.Time{}
		p.note(protocol.MachineEventNote, fmt.Sprintf("ramdisk node %s reconnected", d.RamdiskNode), nil)
	}
	return false, nil
}

// provisioned puts a provisioned machine's node going away and coming back
// on its timeline.
func (p *plan) provisioned(ctx context.Context) error {
	d := &p.d
	if p.m.Node == "" || p.m.Node != d.NodeID {
		return nil
	}
	n, err := p.c.Store.GetNode(ctx, d.NodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil || n.Deleted() {
		return err
	}
	switch {
	case n.SessionID == 0 && d.NodeSession != 0:
		d.NodeSession = 0
		p.note(protocol.MachineEventNodeOffline, fmt.Sprintf("node %s lost its session (reboot, power off, network, or a control plane restart)", n.ID),
			map[string]any{"node": n.ID})
	case n.SessionID != 0 && n.SessionID != d.NodeSession:
		se, err := p.c.Store.GetSession(ctx, n.SessionID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		reboot := d.NodeBootID != "" && se.BootID != "" && se.BootID != d.NodeBootID
		msg := fmt.Sprintf("node back: node %s reconnected (same boot)", n.ID)
		if reboot {
			msg = fmt.Sprintf("node back: node %s came back after a reboot with the same identity", n.ID)
		}
		p.note(protocol.MachineEventNodeBack, msg, map[string]any{"node": n.ID, "reboot": reboot, "boot_id": se.BootID})
		d.NodeSession, d.NodeBootID = n.SessionID, se.BootID
	}
	return nil
}

func reasonOf(c store.Command) string {
	switch {
	case c.Reason != "" && c.Message != "":
		return c.Reason + ": " + c.Message
	case c.Reason != "":
		return c.Reason
	case c.Message != "":
		return c.Message
	}
	return "no reason given"
}

// deploySummary says what a deploy wrote and how fast, in words and as the
// event's data. The data keeps its keys (disk, bytes_written, bytes_received):
// they are what machines events has always shown, whatever the result calls them.
func deploySummary(r protocol.DeployImageResult) (string, map[string]any) {
	data := map[string]any{"disk": r.Target.Path, "bytes_written": r.ImageSize, "bytes_received": r.Size,
		"duration_ms": r.DurationMS, "after": r.After}
	msg := fmt.Sprintf("wrote %s to %s", human.Size(r.ImageSize), orDash(r.Target.Path))
	if r.DurationMS > 0 {
		secs := float64(r.DurationMS) / 1000
		rate := float64(r.ImageSize) / 1e6 / secs
		data["mb_per_s"] = float64(int64(rate*10+0.5)) / 10
		msg += fmt.Sprintf(" in %.1f s (%.1f MB/s)", secs, rate)
	}
	if r.ChosenBy != "" {
		msg += " (chosen by " + r.ChosenBy + ")"
		data["chosen_by"] = r.ChosenBy
	}
	if len(r.Wiped) > 0 {
		msg += "; wiped: " + strings.Join(r.Wiped, ", ")
		data["wiped"] = r.Wiped
	}
	if r.BootOrder != "" {
		msg += "; UEFI " + r.BootOrder
		data["boot_order"] = r.BootOrder
	}
	if r.After != "" {
		msg += "; after: " + r.After
	}
	// What went wrong without failing the deploy ("cloud-init was not found
	// in the image: …") is on the timeline machines show prints.
	for _, w := range r.Warnings {
		msg += "; note: " + w
	}
	if len(r.Warnings) > 0 {
		data["warnings"] = r.Warnings
	}
	return msg, data
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
