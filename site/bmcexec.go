package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/protocol"
)

// This file is the wire edge of the BMC commands: it decodes the params of
// bmc.power, bmc.bootdev and bmc.inventory (protocol.BMC*Params), runs them on a
// bmc.Driver and encodes the result. The bmc package stays free of the command
// vocabulary: it knows drivers, hosts and the store, not command kinds.

// bmcLookup finds a machine's BMC and the driver its entry names; bmc.Store is one.
type bmcLookup interface {
	Lookup(machine string) (bmc.Host, string, bool)
}

// bmcExecutor runs the site command kinds bmc.power, bmc.bootdev and bmc.inventory.
type bmcExecutor struct {
	// Hosts finds each machine's BMC.
	Hosts bmcLookup
	// Drivers maps a bmc_hosts driver name (protocol.BMCDriverIPMI) to its Driver,
	// typically a plugin host's bcx-ipmi.
	Drivers map[string]bmc.Driver
}

// errNotBMCKind is returned for a command kind that is not a bmc.* kind; the
// caller answers UNSUPPORTED.
var errNotBMCKind = errors.New("not a bmc command kind")

// bmcFailure is why a command FAILED: a protocol.Reason* and the message for its
// Status. Its message never holds a credential.
type bmcFailure struct {
	Reason string
	Err    error
}

func (f *bmcFailure) Error() string { return f.Reason + ": " + f.Err.Error() }
func (f *bmcFailure) Unwrap() error { return f.Err }

// Run executes one command and returns its result (a protocol.BMC*Result), a
// *bmcFailure, or errNotBMCKind.
func (e *bmcExecutor) Run(ctx context.Context, kind string, params json.RawMessage) (any, error) {
	switch kind {
	case protocol.KindBMCPower:
		var p protocol.BMCPowerParams
		if err := decodeBMCParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &bmcFailure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		state, err := bmcPower(ctx, d, h, p.Action)
		if err != nil {
			return nil, bmcFailureOf(err)
		}
		return protocol.BMCPowerResult{Machine: p.Machine, Action: p.Action, Power: string(state)}, nil
	case protocol.KindBMCBootdev:
		var p protocol.BMCBootdevParams
		if err := decodeBMCParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &bmcFailure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		if err := d.SetBootDevice(ctx, h, bmc.BootDevice{Device: p.Device, EFI: p.EFI, Persistent: p.Persistent}); err != nil {
			return nil, bmcFailureOf(err)
		}
		return protocol.BMCBootdevResult(p), nil
	case protocol.KindBMCInventory:
		var p protocol.BMCInventoryParams
		if err := decodeBMCParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &bmcFailure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		inv, err := d.Inventory(ctx, h)
		if err != nil {
			return nil, bmcFailureOf(err)
		}
		return protocol.BMCInventoryResult{Machine: p.Machine, Power: string(inv.Power),
			ManufacturerID: inv.ManufacturerID, ProductID: inv.ProductID, FirmwareRevision: inv.FirmwareRevision,
			IPMIVersion: inv.IPMIVersion, SystemGUID: inv.SystemGUID, BoardVendor: inv.BoardVendor,
			BoardProduct: inv.BoardProduct, BoardSerial: inv.BoardSerial, ProductVendor: inv.ProductVendor,
			ProductName: inv.ProductName, ProductSerial: inv.ProductSerial, ChassisSerial: inv.ChassisSerial}, nil
	}
	return nil, fmt.Errorf("%q: %w", kind, errNotBMCKind)
}

func decodeBMCParams(kind string, raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return &bmcFailure{Reason: protocol.ReasonInvalidParams, Err: fmt.Errorf("%s params: %w", kind, bmc.JSONError(err))}
	}
	return nil
}

func (e *bmcExecutor) resolve(machine string) (bmc.Host, bmc.Driver, error) {
	if e.Hosts == nil {
		return bmc.Host{}, nil, &bmcFailure{Reason: protocol.ReasonBMCUnknownMachine, Err: fmt.Errorf("machine %s: this site has no BMC hosts", machine)}
	}
	h, name, ok := e.Hosts.Lookup(machine)
	if !ok {
		return bmc.Host{}, nil, &bmcFailure{Reason: protocol.ReasonBMCUnknownMachine, Err: fmt.Errorf("machine %s has no entry in bmc_hosts", machine)}
	}
	d, ok := e.Drivers[name]
	if !ok || d == nil {
		return bmc.Host{}, nil, &bmcFailure{Reason: protocol.ReasonPluginFailed, Err: fmt.Errorf("machine %s: no driver %q on this site agent ([plugins] with bcx-ipmi)", machine, name)}
	}
	return h, d, nil
}

// bmcPower runs action and reports the power state afterwards, which is what an
// operator wants to see (a cycle of a machine that was off leaves it on).
func bmcPower(ctx context.Context, d bmc.Driver, h bmc.Host, action string) (bmc.PowerState, error) {
	var err error
	switch action {
	case protocol.PowerStatus:
		return d.PowerStatus(ctx, h)
	case protocol.PowerOn:
		err = d.PowerOn(ctx, h)
	case protocol.PowerOff:
		err = d.PowerOff(ctx, h)
	case protocol.PowerCycle:
		err = d.PowerCycle(ctx, h)
	case protocol.PowerReset:
		err = d.PowerReset(ctx, h)
	default:
		return "", bmc.Errorf(bmc.KindInvalid, "power action %q is not on, off, cycle, reset or status", action)
	}
	if err != nil {
		return "", err
	}
	switch action {
	case protocol.PowerOn, protocol.PowerCycle, protocol.PowerReset:
		// A BMC reports the new state only once the chassis has switched, which on
		// real hardware can lag the command; the command itself succeeded.
		return bmc.PowerOn, nil
	}
	return bmc.PowerOff, nil
}

func bmcFailureOf(err error) error {
	var reason string
	switch bmc.KindOf(err) {
	case bmc.KindUnreachable:
		reason = protocol.ReasonBMCUnreachable
	case bmc.KindAuth:
		reason = protocol.ReasonBMCAuth
	case bmc.KindPlugin:
		reason = protocol.ReasonPluginFailed
	case bmc.KindInvalid:
		reason = protocol.ReasonInvalidParams
	default:
		reason = protocol.ReasonBMCError
	}
	return &bmcFailure{Reason: reason, Err: err}
}
