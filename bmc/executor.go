package bmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/better-compute/bcd/protocol"
)

// Lookup finds a machine's BMC and the driver its entry names; Store is one.
type Lookup interface {
	Lookup(machine string) (Host, string, bool)
}

// Executor runs the site command kinds bmc.power, bmc.bootdev and bmc.inventory.
type Executor struct {
	// Hosts finds each machine's BMC.
	Hosts Lookup
	// Drivers maps a bmc_hosts driver name (protocol.BMCDriverIPMI) to its Driver,
	// typically a plugin host's bcx-ipmi.
	Drivers map[string]Driver
}

// ErrUnknownKind is returned for a command kind that is not a bmc.* kind; the
// caller answers UNSUPPORTED.
var ErrUnknownKind = errors.New("not a bmc command kind")

// Failure is why a command FAILED: a protocol.Reason* and the message for its
// Status. Its message never holds a credential.
type Failure struct {
	Reason string
	Err    error
}

func (f *Failure) Error() string { return f.Reason + ": " + f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

// Run executes one command and returns its result (a protocol.BMC*Result), a
// *Failure, or ErrUnknownKind.
func (e *Executor) Run(ctx context.Context, kind string, params json.RawMessage) (any, error) {
	switch kind {
	case protocol.KindBMCPower:
		var p protocol.BMCPowerParams
		if err := decodeParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &Failure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		state, err := power(ctx, d, h, p.Action)
		if err != nil {
			return nil, failure(err)
		}
		return protocol.BMCPowerResult{Machine: p.Machine, Action: p.Action, Power: string(state)}, nil
	case protocol.KindBMCBootdev:
		var p protocol.BMCBootdevParams
		if err := decodeParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &Failure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		if err := d.SetBootDevice(ctx, h, BootDevice{Device: p.Device, EFI: p.EFI, Persistent: p.Persistent}); err != nil {
			return nil, failure(err)
		}
		return protocol.BMCBootdevResult(p), nil
	case protocol.KindBMCInventory:
		var p protocol.BMCInventoryParams
		if err := decodeParams(kind, params, &p); err != nil {
			return nil, err
		}
		if err := p.Validate(); err != nil {
			return nil, &Failure{Reason: protocol.ReasonInvalidParams, Err: err}
		}
		h, d, err := e.resolve(p.Machine)
		if err != nil {
			return nil, err
		}
		inv, err := d.Inventory(ctx, h)
		if err != nil {
			return nil, failure(err)
		}
		return protocol.BMCInventoryResult{Machine: p.Machine, Power: string(inv.Power),
			ManufacturerID: inv.ManufacturerID, ProductID: inv.ProductID, FirmwareRevision: inv.FirmwareRevision,
			IPMIVersion: inv.IPMIVersion, SystemGUID: inv.SystemGUID, BoardVendor: inv.BoardVendor,
			BoardProduct: inv.BoardProduct, BoardSerial: inv.BoardSerial, ProductVendor: inv.ProductVendor,
			ProductName: inv.ProductName, ProductSerial: inv.ProductSerial, ChassisSerial: inv.ChassisSerial}, nil
	}
	return nil, fmt.Errorf("%q: %w", kind, ErrUnknownKind)
}

func decodeParams(kind string, raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return &Failure{Reason: protocol.ReasonInvalidParams, Err: fmt.Errorf("%s params: %w", kind, jsonError(err))}
	}
	return nil
}

func (e *Executor) resolve(machine string) (Host, Driver, error) {
	if e.Hosts == nil {
		return Host{}, nil, &Failure{Reason: protocol.ReasonBMCUnknownMachine, Err: fmt.Errorf("machine %s: this site has no BMC hosts", machine)}
	}
	h, name, ok := e.Hosts.Lookup(machine)
	if !ok {
		return Host{}, nil, &Failure{Reason: protocol.ReasonBMCUnknownMachine, Err: fmt.Errorf("machine %s has no entry in bmc_hosts", machine)}
	}
	d, ok := e.Drivers[name]
	if !ok || d == nil {
		return Host{}, nil, &Failure{Reason: protocol.ReasonPluginFailed, Err: fmt.Errorf("machine %s: no driver %q on this site agent ([plugins] with bcx-ipmi)", machine, name)}
	}
	return h, d, nil
}

// power runs action and reports the power state afterwards, which is what an
// operator wants to see (a cycle of a machine that was off leaves it on).
func power(ctx context.Context, d Driver, h Host, action string) (PowerState, error) {
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
		return "", Errorf(KindInvalid, "power action %q is not on, off, cycle, reset or status", action)
	}
	if err != nil {
		return "", err
	}
	switch action {
	case protocol.PowerOn, protocol.PowerCycle, protocol.PowerReset:
		// A BMC reports the new state only once the chassis has switched, which on
		// real hardware can lag the command; the command itself succeeded.
		return PowerOn, nil
	}
	return PowerOff, nil
}

func failure(err error) error {
	var reason string
	switch KindOf(err) {
	case KindUnreachable:
		reason = protocol.ReasonBMCUnreachable
	case KindAuth:
		reason = protocol.ReasonBMCAuth
	case KindPlugin:
		reason = protocol.ReasonPluginFailed
	case KindInvalid:
		reason = protocol.ReasonInvalidParams
	default:
		reason = protocol.ReasonBMCError
	}
	return &Failure{Reason: reason, Err: err}
}
