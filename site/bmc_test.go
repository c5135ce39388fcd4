package site_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

// fakeDriver is a BMC that is always reachable and remembers what it was asked.
type fakeDriver struct {
	mu    sync.Mutex
	calls []string
	power bmc.PowerState
}

func (d *fakeDriver) record(h bmc.Host, what string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, h.Name+" "+what+" "+string(h.Password))
}

func (d *fakeDriver) PowerStatus(ctx context.Context, h bmc.Host) (bmc.PowerState, error) {
	d.record(h, "status")
	return d.power, nil
}
func (d *fakeDriver) PowerOn(ctx context.Context, h bmc.Host) error  { d.record(h, "on"); return nil }
func (d *fakeDriver) PowerOff(ctx context.Context, h bmc.Host) error { d.record(h, "off"); return nil }
func (d *fakeDriver) PowerCycle(ctx context.Context, h bmc.Host) error {
	d.record(h, "cycle")
	return nil
}
func (d *fakeDriver) PowerReset(ctx context.Context, h bmc.Host) error {
	d.record(h, "reset")
	return nil
}
func (d *fakeDriver) SetBootDevice(ctx context.Context, h bmc.Host, dev bmc.BootDevice) error {
	d.record(h, "bootdev "+dev.Device)
	return nil
}
func (d *fakeDriver) Inventory(ctx context.Context, h bmc.Host) (bmc.Inventory, error) {
	d.record(h, "inventory")
	return bmc.Inventory{Power: d.power, BoardVendor: "ACME"}, nil
}

func bmcSpec(t *testing.T) protocol.Spec {
	return protocol.Spec{Revision: 1, Sections: map[string]json.RawMessage{
		protocol.SectionBMCHosts: section(t, protocol.BMCHostsSection{Hosts: []protocol.BMCHost{
			{Machine: "m_a", Address: "127.0.0.1", Port: 6230, Username: "admin", Password: "pw-m-a"},
		}}),
	}}
}

func command(t *testing.T, id, kind string, params any) protocol.Command {
	return protocol.Command{ID: id, Kind: kind, Params: section(t, params)}
}

// TestBMCCommandsWithoutPlugins: without a [plugins] section the bmc.* kinds
// answer UNSUPPORTED saying why; a kind of another role is UNSUPPORTED too.
func TestBMCCommandsWithoutPlugins(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, false)
	f.setSpec(bmcSpec(t))
	f.start(t, nil)
	waitFor(t, "the session", func() bool { return f.g.Sessions() > 0 })
	waitFor(t, "the recorder", func() bool { f.rec.mu.Lock(); defer f.rec.mu.Unlock(); return f.rec.conn != nil })
	f.rec.send(t, protocol.FrameCommand, command(t, "c1", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_a", Action: "on"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "c2", protocol.KindNodeReboot, struct{}{}))
	waitFor(t, "UNSUPPORTED for c1", func() bool { return f.rec.status("c1", protocol.StateUnsupported) != nil })
	if st := f.rec.status("c1", protocol.StateUnsupported); !strings.Contains(st.Message, "no [plugins] section") {
		t.Errorf("c1: %+v", st)
	}
	waitFor(t, "UNSUPPORTED for c2", func() bool { return f.rec.status("c2", protocol.StateUnsupported) != nil })
}

// TestBMCCommandsThroughDrivers: with a driver, bmc.power, bmc.bootdev and
// bmc.inventory run against the BMC of bmc_hosts and report their results; an
// unknown machine FAILS with UnknownMachine; no password reaches a status.
func TestBMCCommandsThroughDrivers(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, false)
	f.setSpec(bmcSpec(t))
	drv := &fakeDriver{power: bmc.PowerOn}
	_, log, _ := f.start(t, func(s *site.Site) { s.BMCDrivers = map[string]bmc.Driver{protocol.BMCDriverIPMI: drv} })
	waitFor(t, "the recorder", func() bool { f.rec.mu.Lock(); defer f.rec.mu.Unlock(); return f.rec.conn != nil })
	f.rec.send(t, protocol.FrameCommand, command(t, "p", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_a", Action: "cycle"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "b", protocol.KindBMCBootdev, protocol.BMCBootdevParams{Machine: "m_a", Device: "pxe", EFI: true}))
	f.rec.send(t, protocol.FrameCommand, command(t, "i", protocol.KindBMCInventory, protocol.BMCInventoryParams{Machine: "m_a"}))
	f.rec.send(t, protocol.FrameCommand, command(t, "u", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_zz", Action: "on"}))
	for _, id := range []string{"p", "b", "i"} {
		waitFor(t, "SUCCEEDED for "+id, func() bool { return f.rec.status(id, protocol.StateSucceeded) != nil })
		if f.rec.status(id, protocol.StateRunning) == nil {
			t.Errorf("%s: no RUNNING first", id)
		}
	}
	var pr protocol.BMCPowerResult
	json.Unmarshal(f.rec.status("p", protocol.StateSucceeded).Result, &pr)
	if pr != (protocol.BMCPowerResult{Machine: "m_a", Action: "cycle", Power: "on"}) {
		t.Errorf("power result %+v", pr)
	}
	var inv protocol.BMCInventoryResult
	json.Unmarshal(f.rec.status("i", protocol.StateSucceeded).Result, &inv)
	if inv.BoardVendor != "ACME" || inv.Machine != "m_a" {
		t.Errorf("inventory result %+v", inv)
	}
	waitFor(t, "FAILED for u", func() bool { return f.rec.status("u", protocol.StateFailed) != nil })
	if st := f.rec.status("u", protocol.StateFailed); st.Reason != protocol.ReasonBMCUnknownMachine {
		t.Errorf("unknown machine: %+v", st)
	}
	drv.mu.Lock()
	calls := slices.Sorted(slices.Values(drv.calls)) // commands run concurrently
	drv.mu.Unlock()
	if strings.Join(calls, ",") != "m_a bootdev pxe pw-m-a,m_a cycle pw-m-a,m_a inventory pw-m-a" {
		t.Errorf("driver calls %q", calls)
	}
	f.rec.mu.Lock()
	for _, fr := range f.rec.frames {
		if strings.Contains(string(fr.Data), "pw-m-a") {
			t.Errorf("a frame to the gateway holds the BMC password: %s", fr.Data)
		}
	}
	f.rec.mu.Unlock()
	if strings.Contains(log.String(), "pw-m-a") {
		t.Error("the BMC password is in the log")
	}
}

// TestNoBootSection: without [boot] the site warns, serves nothing, and keeps its
// session.
func TestNoBootSection(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, false)
	s, log, stop := f.start(t, nil)
	waitFor(t, "the session", func() bool { return f.g.Sessions() > 0 })
	if a := s.Addrs(); a != (site.Addrs{}) {
		t.Errorf("servers listening without [boot]: %+v", a)
	}
	if !strings.Contains(log.String(), "no [boot] section: serving no PXE machine") {
		t.Errorf("no warning:\n%s", log.String())
	}
	if err := stop(); err != nil {
		t.Errorf("Run = %v", err)
	}
}

// TestRefusesAnotherRole: a data directory holding a node's identity is refused,
// naming the role and the node.
func TestRefusesAnotherRole(t *testing.T) {
	f := newFixture(t, protocol.RoleNode, false)
	err := (&site.Site{Config: f.cfg, BootID: func() (string, error) { return "b", nil }}).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "holds the identity of node site_a") || !strings.Contains(err.Error(), "bcd node runs this one") {
		t.Errorf("Run = %v", err)
	}
}

// TestBMCCommandsThroughThePluginHost: with [plugins], bmc.* commands go to the
// bcx-ipmi plugin of [plugins] dir, started on the first command; a directory
// without it (or a host that cannot prepare its sandbox) FAILS the command with
// PluginFailed and the reason, and the site agent carries on.
func TestBMCCommandsThroughThePluginHost(t *testing.T) {
	f := newFixture(t, protocol.RoleSite, false)
	appendFile(t, f.cfgPath, fmt.Sprintf("[plugins]\ndir = %q\n", t.TempDir()))
	f.cfg = loadConfig(t, f.cfgPath)
	f.setSpec(bmcSpec(t))
	f.start(t, func(s *site.Site) { s.PluginRuntimeDir = filepath.Join(t.TempDir(), "plugins") })
	waitFor(t, "the recorder", func() bool { f.rec.mu.Lock(); defer f.rec.mu.Unlock(); return f.rec.conn != nil })
	f.rec.send(t, protocol.FrameCommand, command(t, "p", protocol.KindBMCPower, protocol.BMCPowerParams{Machine: "m_a", Action: "status"}))
	waitFor(t, "FAILED for p", func() bool { return f.rec.status("p", protocol.StateFailed) != nil })
	if st := f.rec.status("p", protocol.StateFailed); st.Reason != protocol.ReasonPluginFailed || !strings.Contains(st.Message, "bcx-ipmi") {
		t.Errorf("status %+v", st)
	}
}
