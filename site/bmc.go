package site

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/bmc/pluginhost"
	"github.com/better-compute/bcd/protocol"
)

// pluginFor names the plugin that drives each bmc_hosts driver.
var pluginFor = map[string]string{protocol.BMCDriverIPMI: "bcx-ipmi"}

// noPluginsReason is the UNSUPPORTED message of bmc.* commands on a site agent
// without a [plugins] section.
const noPluginsReason = "this site agent has no [plugins] section: BMC commands run through the bcx-ipmi plugin in [plugins] dir"

// setupBMC picks what runs bmc.* commands: Site.BMCDrivers, else the plugins of
// [plugins], else nothing (UNSUPPORTED). It returns what stops the plugins.
func (s *Site) setupBMC() (closeFn func()) {
	switch {
	case s.BMCDrivers != nil:
		s.bmcExec = &bmcExecutor{Hosts: s.bmcHosts, Drivers: s.BMCDrivers}
		return func() {}
	case s.Config.Plugins == nil:
		return func() {}
	}
	host := pluginhost.New(s.Config.Plugins, s.log)
	host.RuntimeDir = s.PluginRuntimeDir
	// A host that cannot start (no cgroup, no directory) has logged why; each
	// command then fails with that reason through the drivers below.
	startErr := host.Start()
	drivers := map[string]bmc.Driver{}
	for driver, plugin := range pluginFor {
		drivers[driver] = &lazyDriver{host: host, plugin: plugin, startErr: startErr}
	}
	s.bmcExec = &bmcExecutor{Hosts: s.bmcHosts, Drivers: drivers}
	return func() {
		if err := host.Close(); err != nil {
			s.log.Warn("stopping the BMC plugins", "error", err.Error())
		}
	}
}

// runBMC runs bmc.power, bmc.bootdev and bmc.inventory.
func (s *Site) runBMC(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error {
	if s.bmcExec == nil {
		return report(protocol.Status{State: protocol.StateUnsupported, Reason: agent.ReasonUnsupported, Message: noPluginsReason})
	}
	if err := report(protocol.Status{State: protocol.StateRunning}); err != nil {
		return err
	}
	start := time.Now()
	res, err := s.bmcExec.Run(ctx, cmd.Kind, cmd.Params)
	s.observeBMC(cmd, time.Since(start), err)
	var f *bmcFailure
	switch {
	case errors.Is(err, errNotBMCKind):
		return report(protocol.Status{State: protocol.StateUnsupported, Reason: agent.ReasonUnsupported, Message: err.Error()})
	case errors.As(err, &f):
		return report(protocol.Status{State: protocol.StateFailed, Reason: f.Reason, Message: f.Err.Error()})
	case err != nil:
		return report(protocol.Status{State: protocol.StateFailed, Reason: agent.ReasonError, Message: err.Error()})
	}
	data, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return report(protocol.Status{State: protocol.StateSucceeded, Result: data})
}

// The operations BMCObserver names, one per driver call a command makes.
const (
	BMCOpPowerOn     = "power-on"
	BMCOpPowerOff    = "power-off"
	BMCOpPowerCycle  = "power-cycle"
	BMCOpPowerReset  = "power-reset"
	BMCOpPowerStatus = "power-status"
	BMCOpBootdev     = "bootdev"
	BMCOpInventory   = "inventory"
	// BMCOpInvalid is a bmc.power whose action is none of the above: it
	// fails before any BMC is asked.
	BMCOpInvalid = "invalid"
)

// BMCOps are every operation BMCObserver may name.
var BMCOps = []string{BMCOpPowerOn, BMCOpPowerOff, BMCOpPowerCycle, BMCOpPowerReset, BMCOpPowerStatus, BMCOpBootdev, BMCOpInventory, BMCOpInvalid}

// bmcOp names the operation of a bmc.* command, from a fixed set so that
// a metric's labels stay bounded whatever the params hold.
func bmcOp(cmd protocol.Command) string {
	switch cmd.Kind {
	case protocol.KindBMCBootdev:
		return BMCOpBootdev
	case protocol.KindBMCInventory:
		return BMCOpInventory
	}
	var p struct {
		Action string `json:"action"`
	}
	_ = json.Unmarshal(cmd.Params, &p) // bad params are the executor's to report
	switch p.Action {
	case protocol.PowerOn, protocol.PowerOff, protocol.PowerCycle, protocol.PowerReset, protocol.PowerStatus:
		return "power-" + p.Action
	}
	return BMCOpInvalid
}

// observeBMC tells BMCObserver how a command went.
func (s *Site) observeBMC(cmd protocol.Command, took time.Duration, err error) {
	if s.BMCObserver == nil || errors.Is(err, errNotBMCKind) {
		return
	}
	reason := ""
	var f *bmcFailure
	switch {
	case errors.As(err, &f):
		reason = f.Reason
	case err != nil:
		reason = agent.ReasonError
	}
	s.BMCObserver(bmcOp(cmd), reason, took)
}

// lazyDriver starts its plugin on the first call, so a site whose BMCs are never
// driven runs no plugin process.
type lazyDriver struct {
	host     *pluginhost.Host
	plugin   string
	startErr error

	once sync.Once
	drv  bmc.Driver
	err  error
}

var _ bmc.Driver = (*lazyDriver)(nil)

func (d *lazyDriver) get() (bmc.Driver, error) {
	d.once.Do(func() {
		if d.startErr != nil {
			d.err = d.startErr
			return
		}
		d.drv, d.err = d.host.Driver(d.plugin)
	})
	if d.err != nil {
		return nil, &bmc.Error{Kind: bmc.KindPlugin, Msg: "plugin " + d.plugin + ": " + d.err.Error(), Err: d.err}
	}
	return d.drv, nil
}

func (d *lazyDriver) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	drv, err := d.get()
	if err != nil {
		return "", err
	}
	return drv.PowerStatus(ctx, h)
}

func (d *lazyDriver) do(fn func(bmc.Driver) error) error {
	drv, err := d.get()
	if err != nil {
		return err
	}
	return fn(drv)
}

func (d *lazyDriver) PowerOn(ctx context.Context, h bmc.Host) error {
	return d.do(func(drv bmc.Driver) error { return drv.PowerOn(ctx, h) })
}

func (d *lazyDriver) PowerOff(ctx context.Context, h bmc.Host) error {
	return d.do(func(drv bmc.Driver) error { return drv.PowerOff(ctx, h) })
}

func (d *lazyDriver) PowerCycle(ctx context.Context, h bmc.Host) error {
	return d.do(func(drv bmc.Driver) error { return drv.PowerCycle(ctx, h) })
}

func (d *lazyDriver) PowerReset(ctx context.Context, h bmc.Host) error {
	return d.do(func(drv bmc.Driver) error { return drv.PowerReset(ctx, h) })
}

func (d *lazyDriver) SetBootDevice(ctx context.Context, h bmc.Host, dev bmc.BootDevice) error {
	return d.do(func(drv bmc.Driver) error { return drv.SetBootDevice(ctx, h, dev) })
}

func (d *lazyDriver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	drv, err := d.get()
	if err != nil {
		return bmc.Inventory{}, err
	}
	return drv.Inventory(ctx, h)
}
