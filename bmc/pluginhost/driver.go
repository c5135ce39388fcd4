package pluginhost

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/bcd/bmc"
)

// pluginDriver is a bmc.Driver whose calls go to a supervised plugin, each with a
// deadline, and which turns a plugin's death or silence into an error that says
// what happened.
type pluginDriver struct{ s *supervisor }

var _ bmc.Driver = (*pluginDriver)(nil)

// brokenChannelGrace is how long a call whose channel broke waits for the plugin's
// exit to be seen, to report how it ended.
const brokenChannelGrace = 2 * time.Second

func (d *pluginDriver) call(ctx context.Context, op string, h bmc.Host, fn func(context.Context, bmc.Driver) error) error {
	parent := ctx
	timeout := orDefault(d.s.h.CallTimeout, DefaultCallTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	inst, err := d.s.acquire(ctx)
	if err != nil {
		return err
	}
	err = fn(ctx, inst.driver)
	if err == nil || bmc.KindOf(err) != bmc.KindPlugin {
		return err
	}
	name := d.s.name
	switch {
	case parent.Err() != nil:
		// The caller gave up; the plugin may be fine.
		return &bmc.Error{Kind: bmc.KindPlugin, Msg: fmt.Sprintf("%s of %s abandoned by its caller (%v)", op, h, parent.Err()), Err: parent.Err()}
	case ctx.Err() != nil:
		inst.kill(fmt.Sprintf("it did not answer %s of %s within %s", op, h.Name, timeout))
		return &bmc.Error{Kind: bmc.KindPlugin, Err: err, Msg: fmt.Sprintf(
			"plugin %s did not answer %s of %s within %s: it was killed and restarts; whether the BMC carried out %s is unknown",
			name, op, h, timeout, op)}
	}
	// The channel broke: the plugin died, or is dying.
	t := time.NewTimer(brokenChannelGrace)
	defer t.Stop()
	select {
	case <-inst.runner.done:
	case <-t.C:
		inst.kill("its channel broke: " + err.Error())
		<-inst.runner.done
	}
	return &bmc.Error{Kind: bmc.KindPlugin, Err: err, Msg: fmt.Sprintf(
		"plugin %s died during %s of %s (%s); whether the BMC carried out %s is unknown",
		name, op, h, inst.endReason(), op)}
}

func (d *pluginDriver) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	var p bmc.PowerState
	err := d.call(ctx, "power status", h, func(ctx context.Context, drv bmc.Driver) error {
		var err error
		p, err = drv.PowerStatus(ctx, h)
		return err
	})
	return p, err
}

func (d *pluginDriver) PowerOn(ctx context.Context, h bmc.Host) error {
	return d.call(ctx, "power on", h, func(ctx context.Context, drv bmc.Driver) error { return drv.PowerOn(ctx, h) })
}

func (d *pluginDriver) PowerOff(ctx context.Context, h bmc.Host) error {
	return d.call(ctx, "power off", h, func(ctx context.Context, drv bmc.Driver) error { return drv.PowerOff(ctx, h) })
}

func (d *pluginDriver) PowerCycle(ctx context.Context, h bmc.Host) error {
	return d.call(ctx, "power cycle", h, func(ctx context.Context, drv bmc.Driver) error { return drv.PowerCycle(ctx, h) })
}

func (d *pluginDriver) PowerReset(ctx context.Context, h bmc.Host) error {
	return d.call(ctx, "power reset", h, func(ctx context.Context, drv bmc.Driver) error { return drv.PowerReset(ctx, h) })
}

func (d *pluginDriver) SetBootDevice(ctx context.Context, h bmc.Host, dev bmc.BootDevice) error {
	return d.call(ctx, "set boot device "+dev.Device, h, func(ctx context.Context, drv bmc.Driver) error {
		return drv.SetBootDevice(ctx, h, dev)
	})
}

func (d *pluginDriver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	var inv bmc.Inventory
	err := d.call(ctx, "inventory", h, func(ctx context.Context, drv bmc.Driver) error {
		var err error
		inv, err = drv.Inventory(ctx, h)
		return err
	})
	return inv, err
}
