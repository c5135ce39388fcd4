package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/protocol"
)

// bmcSection is the bmc_hosts section the executor tests apply.
var bmcSection = protocol.BMCHostsSection{Hosts: []protocol.BMCHost{
	{Machine: "m-2", Address: "10.0.0.12", Username: "ADMIN", Password: "Sup3r-s3cret!", CipherSuite: 17},
	{Machine: "m-1", Address: "bmc-1.example.net", Port: 6230, Username: "admin", Password: "Sup3r-s3cret!", Driver: "ipmi", CipherSuite: 3},
}}

// recorder is a Driver that records its calls and fails with err.
type recorder struct {
	calls []string
	power bmc.PowerState
	err   error
}

func (r *recorder) rec(op string, h bmc.Host) error {
	r.calls = append(r.calls, op+" "+h.Name)
	return r.err
}
func (r *recorder) PowerStatus(_ context.Context, h bmc.Host) (bmc.PowerState, error) {
	return r.power, r.rec("status", h)
}
func (r *recorder) PowerOn(_ context.Context, h bmc.Host) error    { return r.rec("on", h) }
func (r *recorder) PowerOff(_ context.Context, h bmc.Host) error   { return r.rec("off", h) }
func (r *recorder) PowerCycle(_ context.Context, h bmc.Host) error { return r.rec("cycle", h) }
func (r *recorder) PowerReset(_ context.Context, h bmc.Host) error { return r.rec("reset", h) }
func (r *recorder) SetBootDevice(_ context.Context, h bmc.Host, d bmc.BootDevice) error {
	return r.rec(fmt.Sprintf("bootdev %s efi=%v persistent=%v", d.Device, d.EFI, d.Persistent), h)
}
func (r *recorder) Inventory(_ context.Context, h bmc.Host) (bmc.Inventory, error) {
	return bmc.Inventory{Power: bmc.PowerOn, ManufacturerID: 4753, SystemGUID: "g"}, r.rec("inventory", h)
}

func executor(t *testing.T, d bmc.Driver) *bmcExecutor {
	s, err := bmc.OpenStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(bmcSection); err != nil {
		t.Fatal(err)
	}
	return &bmcExecutor{Hosts: s, Drivers: map[string]bmc.Driver{protocol.BMCDriverIPMI: d}}
}

func TestExecutorRunsKinds(t *testing.T) {
	r := &recorder{power: bmc.PowerOff}
	e := executor(t, r)
	ctx := context.Background()
	for _, c := range []struct {
		kind, params string
		want         any
	}{
		{protocol.KindBMCPower, `{"machine":"m-1","action":"status"}`, protocol.BMCPowerResult{Machine: "m-1", Action: "status", Power: "off"}},
		{protocol.KindBMCPower, `{"machine":"m-1","action":"cycle"}`, protocol.BMCPowerResult{Machine: "m-1", Action: "cycle", Power: "on"}},
		{protocol.KindBMCPower, `{"machine":"m-2","action":"off"}`, protocol.BMCPowerResult{Machine: "m-2", Action: "off", Power: "off"}},
		{protocol.KindBMCBootdev, `{"machine":"m-1","device":"pxe","efi":true}`, protocol.BMCBootdevResult{Machine: "m-1", Device: "pxe", EFI: true}},
		{protocol.KindBMCInventory, `{"machine":"m-2"}`, protocol.BMCInventoryResult{Machine: "m-2", Power: "on", ManufacturerID: 4753, SystemGUID: "g"}},
	} {
		got, err := e.Run(ctx, c.kind, json.RawMessage(c.params))
		if err != nil {
			t.Errorf("%s %s: %v", c.kind, c.params, err)
			continue
		}
		if diff := cmp.Diff(c.want, got); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s", c.kind, c.params, diff)
		}
	}
	want := []string{"status m-1", "cycle m-1", "off m-2", "bootdev pxe efi=true persistent=false m-1", "inventory m-2"}
	if diff := cmp.Diff(want, r.calls); diff != "" {
		t.Errorf("driver calls (-want +got):\n%s", diff)
	}
}

func TestExecutorFailures(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name, kind, params string
		driverErr          error
		reason, msg        string
	}{
		{"unknown machine", protocol.KindBMCPower, `{"machine":"m-9","action":"on"}`, nil, protocol.ReasonBMCUnknownMachine, "no entry in bmc_hosts"},
		{"bad action", protocol.KindBMCPower, `{"machine":"m-1","action":"explode"}`, nil, protocol.ReasonInvalidParams, `action "explode"`},
		{"bad device", protocol.KindBMCBootdev, `{"machine":"m-1","device":"floppy"}`, nil, protocol.ReasonInvalidParams, `device "floppy"`},
		{"params not an object", protocol.KindBMCPower, `[1]`, nil, protocol.ReasonInvalidParams, "bmc.power params"},
		{"no params", protocol.KindBMCInventory, ``, nil, protocol.ReasonInvalidParams, "machine"},
		{"unreachable", protocol.KindBMCPower, `{"machine":"m-1","action":"on"}`, bmc.Errorf(bmc.KindUnreachable, "no answer"), protocol.ReasonBMCUnreachable, "no answer"},
		{"auth", protocol.KindBMCPower, `{"machine":"m-1","action":"on"}`, bmc.Errorf(bmc.KindAuth, "refused"), protocol.ReasonBMCAuth, "refused"},
		{"plugin", protocol.KindBMCBootdev, `{"machine":"m-1","device":"disk"}`, bmc.Errorf(bmc.KindPlugin, "plugin died"), protocol.ReasonPluginFailed, "plugin died"},
		{"bmc", protocol.KindBMCInventory, `{"machine":"m-1"}`, bmc.Errorf(bmc.KindBMC, "completion code"), protocol.ReasonBMCError, "completion code"},
	} {
		e := executor(t, &recorder{err: c.driverErr})
		_, err := e.Run(ctx, c.kind, json.RawMessage(c.params))
		var f *bmcFailure
		if !errors.As(err, &f) || f.Reason != c.reason || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want reason %s and %q", c.name, err, c.reason, c.msg)
		}
	}
	e := executor(t, &recorder{})
	if _, err := e.Run(ctx, protocol.KindDeployImage, nil); !errors.Is(err, errNotBMCKind) {
		t.Errorf("a ramdisk kind: %v", err)
	}
	e.Drivers = nil
	if _, err := e.Run(ctx, protocol.KindBMCPower, json.RawMessage(`{"machine":"m-1","action":"on"}`)); err == nil || !strings.Contains(err.Error(), `no driver "ipmi"`) {
		t.Errorf("no driver: %v", err)
	}
}
