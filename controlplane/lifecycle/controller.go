package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of the Controller's zero fields.
const (
	DefaultBootRetries   = 2
	DefaultDeployRetries = 1
	DefaultBMCRetries    = 1
	DefaultTick          = 2 * time.Second
	DefaultWorkers       = 8
	DefaultTokenTTL      = 24 * time.Hour
)

// stepTimeout bounds one step of one machine: the store answering slowly
// must not hold a worker, and so the other machines, for long.
const stepTimeout = 30 * time.Second

// Store is what the controller reads and writes.
type Store interface {
	GetMachine(ctx context.Context, id string) (store.Machine, error)
	GetNode(ctx context.Context, id string) (store.Node, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	GetCommand(ctx context.Context, id string) (store.Command, error)
	GetSession(ctx context.Context, id int64) (store.Session, error)
	// AdoptBindings writes the bindings a machine without a running
	// deployment adopted.
	AdoptBindings(ctx context.Context, id string, ch store.StatusChange) (store.Machine, error)
	store.Deployments
}

// Notifier reaches agents' sessions: the gateway.
type Notifier interface {
	// Notify: the node has a new command.
	Notify(nodeID string)
	// SpecChanged: what the site's agents are sent changed (a boot entry).
	SpecChanged(site string)
}

// DeployObserver is told how deployments go, for the metrics endpoint. Calls
// must not block.
type DeployObserver interface {
	// DeploymentFinished: a deployment ended with outcome (OutcomeProvisioned,
	// OutcomeFailed, OutcomeCancelled), took after it started.
	DeploymentFinished(outcome string, took time.Duration)
	// ImageWritten: a deploy.image SUCCEEDED, having written bytes to the
	// disk in took (as the ramdisk measured it).
	ImageWritten(bytes int64, took time.Duration)
}

// Controller runs every machine's lifecycle. Set the fields, then Run it;
// Deploy and Cancel start and stop a machine's deployment, and the gateway
// and the JoinService tell it what changed (StatusApplied, SessionChanged,
// Bound) so that it steps the machine concerned at once.
type Controller struct {
	// Store holds machines, deployments, nodes and commands.
	Store Store
	// Notifier tells sessions about new commands and boot entries; nil
	// leaves them to the agents' next session.
	Notifier Notifier
	// Install is what a deploy.image writes into the installed OS besides
	// the token, node id and site, which each attempt fills in. nil refuses
	// deployments (UNSUPPORTED).
	Install *machines.Install
	// Timeouts of the steps; zero fields mean their defaults.
	Timeouts Timeouts
	// BootRetries is how many times a machine is power-cycled again into
	// the ramdisk after the first (a ramdisk that does not join, a ramdisk
	// lost mid-deploy, an OS that does not join); DeployRetries how many
	// times deploy.image is sent again after a FAILED one; BMCRetries how
	// many times a FAILED or unanswered BMC command is sent again. 0 means
	// the default, negative none.
	BootRetries, DeployRetries, BMCRetries int
	// Tick is how often every running deployment is looked at; 0 means
	// DefaultTick.
	Tick time.Duration
	// Workers is how many machines are stepped at once; 0 means
	// DefaultWorkers.
	Workers int
	// TokenTTL is the installed OS's join token's lifetime; 0 means
	// DefaultTokenTTL.
	TokenTTL time.Duration
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics, when set, hears of every deployment that ended and every
	// deploy.image that succeeded, once the store has the step.
	Metrics DeployObserver

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []string
	queued  map[string]bool
	running map[string]bool
	again   map[string]bool
	stopped bool
	// commands and nodes map what the gateway reports on to machines; a
	// node not in nodes is looked up in the store.
	commands map[string]string
	nodes    map[string]string
}

func (c *Controller) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

func (c *Controller) log() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func retries(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (c *Controller) bootRetries() int   { return retries(c.BootRetries, DefaultBootRetries) }
func (c *Controller) deployRetries() int { return retries(c.DeployRetries, DefaultDeployRetries) }
func (c *Controller) bmcRetries() int    { return retries(c.BMCRetries, DefaultBMCRetries) }
func (c *Controller) timeouts() Timeouts { return c.Timeouts.WithDefaults() }

func (c *Controller) init() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cond == nil {
		c.cond = sync.NewCond(&c.mu)
		c.queued = map[string]bool{}
		c.running = map[string]bool{}
		c.again = map[string]bool{}
		c.commands = map[string]string{}
		c.nodes = map[string]string{}
	}
}

// Run steps machines until ctx is done: at once every deployment that has
// not finished (a restart resumes each where the store says it was) and
// every provisioned machine (its node's session), then the running
// deployments every Tick, and any machine the gateway or the JoinService
// reports on as it happens.
func (c *Controller) Run(ctx context.Context) error {
	c.init()
	workers := c.Workers
	if workers <= 0 {
		workers = DefaultWorkers
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(ctx)
		}()
	}
	c.enqueueOpen(ctx)
	if ms, err := c.Store.ListMachinesInState(ctx, store.MachineProvisioned); err != nil {
		c.log().Error("lifecycle: listing provisioned machines failed", "err", err)
	} else {
		for _, m := range ms {
			c.enqueue(m.ID)
		}
	}
	// Bindings the JoinService recorded while no controller ran (a
	// restart between a join and its adoption).
	if ms, err := c.Store.ListMachinesWithPendingBindings(ctx); err != nil {
		c.log().Error("lifecycle: listing machines with bindings to adopt failed", "err", err)
	} else {
		for _, m := range ms {
			c.enqueue(m.ID)
		}
	}
	tick := c.Tick
	if tick <= 0 {
		tick = DefaultTick
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			c.stopped = true
			c.cond.Broadcast()
			c.mu.Unlock()
			wg.Wait()
			return nil
		case <-t.C:
			c.enqueueOpen(ctx)
		}
	}
}

func (c *Controller) enqueueOpen(ctx context.Context) {
	ds, err := c.Store.OpenDeployments(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log().Error("lifecycle: listing running deployments failed", "err", err)
		}
		return
	}
	for _, d := range ds {
		c.enqueue(d.MachineID)
	}
}

// Kick steps the machine soon.
func (c *Controller) Kick(machineID string) {
	c.init()
	c.enqueue(machineID)
}

// StatusApplied is the gateway's report that a command's status was stored.
func (c *Controller) StatusApplied(nodeID, commandID string) {
	c.init()
	c.mu.Lock()
	m := c.commands[commandID]
	c.mu.Unlock()
	if m != "" {
		c.enqueue(m)
	}
}

// SessionChanged is the gateway's report that the node's session opened or
// closed.
func (c *Controller) SessionChanged(nodeID string) {
	c.init()
	c.mu.Lock()
	m := c.nodes[nodeID]
	c.mu.Unlock()
	if m != "" {
		c.enqueue(m)
		return
	}
	// A node the controller has not met yet (a ramdisk that just joined,
	// the first session after a restart): the worker finds its machine.
	c.enqueue(nodePrefix + nodeID)
}

// Bound is the JoinService's report that a node joined for a machine.
func (c *Controller) Bound(machineID, nodeID string) {
	c.init()
	c.watchNode(nodeID, machineID)
	c.enqueue(machineID)
}

// nodePrefix marks a queue entry that is a node whose machine is to be
// found; machine ids never start with it.
const nodePrefix = "node:"

func (c *Controller) watchNode(nodeID, machineID string) {
	if nodeID == "" {
		return
	}
	c.mu.Lock()
	c.nodes[nodeID] = machineID
	c.mu.Unlock()
}

func (c *Controller) watchCommand(commandID, machineID string) {
	if commandID == "" {
		return
	}
	c.mu.Lock()
	c.commands[commandID] = machineID
	c.mu.Unlock()
}

func (c *Controller) forgetCommand(commandID string) {
	c.mu.Lock()
	delete(c.commands, commandID)
	c.mu.Unlock()
}

// enqueue adds id to the queue once; an id being stepped is stepped again
// when it is done, so no report is lost and no machine runs on two workers.
func (c *Controller) enqueue(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.stopped:
	case c.running[id]:
		c.again[id] = true
	case !c.queued[id]:
		c.queued[id] = true
		c.queue = append(c.queue, id)
		c.cond.Signal()
	}
}

func (c *Controller) next() (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.queue) == 0 && !c.stopped {
		c.cond.Wait()
	}
	if c.stopped {
		return "", false
	}
	id := c.queue[0]
	c.queue[0] = ""
	c.queue = c.queue[1:]
	delete(c.queued, id)
	c.running[id] = true
	return id, true
}

func (c *Controller) done(id string) {
	c.mu.Lock()
	delete(c.running, id)
	again := c.again[id]
	delete(c.again, id)
	c.mu.Unlock()
	if again {
		c.enqueue(id)
	}
}

func (c *Controller) work(ctx context.Context) {
	for {
		id, ok := c.next()
		if !ok {
			return
		}
		c.runStep(ctx, id)
		c.done(id)
	}
}

// runStep steps one machine, on its own deadline. An error is logged and the
// machine looked at again at the next tick: one machine's trouble is never
// another's.
func (c *Controller) runStep(ctx context.Context, id string) {
	sctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			c.log().Error("lifecycle: a step panicked", "machine", id, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	if nodeID, ok := strings.CutPrefix(id, nodePrefix); ok {
		m, err := c.Store.FindMachineByNode(sctx, nodeID)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) && ctx.Err() == nil {
				c.log().Error("lifecycle: finding a node's machine failed", "node", nodeID, "err", err)
			}
			return
		}
		c.watchNode(nodeID, m.ID)
		id = m.ID
	}
	err := c.step(sctx, id)
	switch {
	case err == nil:
	case errors.Is(err, store.ErrConflict):
		// Someone else wrote the deployment (a cancel, another control
		// plane process): decide again on what is stored now.
		c.enqueue(id)
	case ctx.Err() != nil:
	default:
		c.log().Error("lifecycle: step failed; trying again at the next tick", "machine", id, "err", err)
	}
}

// Deploy starts a deployment of m with spec, which the caller normalized and
// validated (machines.Service, at the api edge): a machine whose ramdisk is
// connected goes straight to ramdisk; any other is PXE-booted into the
// ramdisk. A machine whose deployment has not finished refuses
// (ALREADY_EXISTS): cancel it first. It returns the machine as the
// deployment started it, read before the workers take their first step.
func (c *Controller) Deploy(ctx context.Context, m store.Machine, spec store.DeploySpec) (store.Deployment, store.Machine, error) {
	c.init()
	if c.Install == nil {
		return store.Deployment{}, store.Machine{}, refusal.New(protocol.CodeUnsupported, "this control plane was started without what a deploy writes into the installed OS (gateway and PKI)")
	}
	now := c.now()
	t := c.timeouts()
	p := &plan{c: c, m: m, now: now}
	// A ramdisk the JoinService bound that the workers have not adopted yet
	// is the machine's all the same.
	p.adopt()
	m = p.m
	p.d = store.Deployment{ID: ids.New(ids.PrefixDeployment, now), MachineID: m.ID, Spec: spec}
	image := protocol.RedactURL(spec.Image.URL)
	ramdisk, err := c.liveRamdisk(ctx, m.RamdiskNode)
	switch {
	case err != nil:
		return store.Deployment{}, store.Machine{}, err
	case ramdisk:
		p.enterRamdisk(m.RamdiskNode, fmt.Sprintf("deploying %s with ramdisk node %s, which is connected: no PXE boot needed", image, m.RamdiskNode))
	case m.BMC == nil:
		p.d.LeftRamdisk = m.RamdiskNode
		mode := protocol.BootRamdisk
		p.ch.BootMode = &mode
		p.d.Step, p.d.BootAttempts, p.d.Deadline = StepWaitJoin, 1, now.Add(t.Ramdisk)
		p.state(store.MachinePXEBooting, fmt.Sprintf("deploying %s: boot entry ramdisk; the machine has no BMC, so power it on or reset it by hand; waiting up to %s for its ramdisk to join",
			image, t.Ramdisk))
	default:
		p.d.LeftRamdisk = m.RamdiskNode
		mode := protocol.BootRamdisk
		p.ch.BootMode = &mode
		p.d.Step = StepBootdev
		p.state(store.MachinePXEBooting, fmt.Sprintf("deploying %s: boot entry ramdisk, then bmc.bootdev pxe and bmc.power cycle", image))
	}
	p.ch.At = now
	got, err := c.Store.StartDeployment(ctx, p.d, p.ch)
	switch {
	case errors.Is(err, store.ErrDeploymentActive):
		cur, _ := c.Store.GetMachine(ctx, m.ID)
		return store.Deployment{}, store.Machine{}, refusal.New(protocol.CodeAlreadyExists,
			"machine %s is %s with deployment %s: wait for it, or stop it first (better-compute machines cancel %s)", m.ID, cur.State, cur.Deployment, m.ID)
	case errors.Is(err, store.ErrNotFound):
		return store.Deployment{}, store.Machine{}, refusal.New(protocol.CodeNotFound, "machine %s does not exist", m.ID)
	case errors.Is(err, store.ErrConflict):
		// A node joined for the machine while the deploy adopted the one
		// before it: what the deploy decided may be stale.
		return store.Deployment{}, store.Machine{}, refusal.Unavailable(fmt.Sprintf("a node joined for machine %s while the deployment started; try again", m.ID))
	case err != nil:
		return store.Deployment{}, store.Machine{}, err
	}
	c.log().Info("deployment started", "machine", m.ID, "deployment", got.ID, "state", p.ch.State, "image", image,
		"after", spec.After, "pool", spec.Pool)
	// The machine as the deployment left it, read before the first step: the
	// workers may take it further at once.
	started, err := c.Store.GetMachine(ctx, m.ID)
	if err != nil {
		return store.Deployment{}, store.Machine{}, err
	}
	c.applied(p)
	c.enqueue(m.ID)
	return got, started, nil
}

// Cancel stops the machine's running deployment: the machine is failed
// ("cancelled by operator") and its unused join token revoked. A command the
// agent already runs is not called back; whatever it reports is ignored.
func (c *Controller) Cancel(ctx context.Context, m store.Machine) (store.Deployment, error) {
	c.init()
	for range 5 {
		if m.Deployment == "" {
			return store.Deployment{}, refusal.New(protocol.CodeInvalidInput, "machine %s has no deployment to cancel (state %s)", m.ID, m.State)
		}
		d, err := c.Store.GetDeployment(ctx, m.Deployment)
		if err != nil {
			return d, err
		}
		if d.Finished() {
			return d, refusal.New(protocol.CodeInvalidInput, "machine %s's deployment %s already ended (%s; state %s)", m.ID, d.ID, d.Outcome, m.State)
		}
		p := &plan{c: c, m: m, d: d, now: c.now()}
		p.fail("cancelled by operator", OutcomeCancelled)
		p.ch.At = p.now
		got, err := c.Store.AdvanceDeployment(ctx, p.d, p.ch)
		if errors.Is(err, store.ErrConflict) {
			if m, err = c.Store.GetMachine(ctx, m.ID); err != nil {
				return d, err
			}
			continue
		}
		if err != nil {
			return d, err
		}
		c.log().Info("deployment cancelled", "machine", m.ID, "deployment", d.ID)
		c.applied(p)
		return got, nil
	}
	return store.Deployment{}, refusal.Unavailable("the deployment kept changing while it was cancelled; try again")
}

// applied tells the agents and the controller's own maps what a written plan
// changed.
func (c *Controller) applied(p *plan) {
	if c.Metrics != nil {
		if p.written != nil {
			c.Metrics.ImageWritten(p.written.ImageSize, time.Duration(p.written.DurationMS)*time.Millisecond)
		}
		if p.ch.Finish != "" && !p.d.CreatedAt.IsZero() {
			c.Metrics.DeploymentFinished(p.ch.Finish, p.now.Sub(p.d.CreatedAt))
		}
	}
	if p.ch.BootMode != nil && c.Notifier != nil {
		c.Notifier.SpecChanged(p.m.Site)
	}
	for _, cmd := range p.ch.Commands {
		c.watchCommand(cmd.ID, p.m.ID)
		if c.Notifier != nil {
			c.Notifier.Notify(cmd.NodeID)
		}
	}
	if p.oldCommand != "" && p.oldCommand != p.d.CommandID {
		c.forgetCommand(p.oldCommand)
	}
	c.watchNode(p.d.RamdiskNode, p.m.ID)
	c.watchNode(p.d.NodeID, p.m.ID)
	c.watchNode(p.m.RamdiskNode, p.m.ID)
}

// liveRamdisk reports whether nodeID is a ramdisk node, not retired, with a
// session.
func (c *Controller) liveRamdisk(ctx context.Context, nodeID string) (bool, error) {
	if nodeID == "" {
		return false, nil
	}
	n, err := c.Store.GetNode(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return !n.Deleted() && n.Role == protocol.RoleRamdisk && n.SessionID != 0, nil
}
