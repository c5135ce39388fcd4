package sim

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/bougou/go-ipmi/pkg/bmc"
	"github.com/bougou/go-ipmi/pkg/hal"
	"github.com/bougou/go-ipmi/pkg/hal/mock"
	"github.com/bougou/go-ipmi/pkg/server"
	"github.com/bougou/go-ipmi/pkg/transport/udp"
	"github.com/bougou/go-ipmi/pkg/types"
)

// SIMULATED BMC. A real BMC per machine (OpenIPMI's ipmi_sim driving QEMU, as the
// testbed has) is too heavy for a thousand machines on two cores, so each machine's
// BMC is go-ipmi's IPMI-over-LAN server (RMCP+, cipher suite 3, a real user and
// password) in this process, with a chassis of ours: the site's real bcx-ipmi
// plugin talks real IPMI to it, and what the chassis is told (boot device, power on,
// cycle, reset, off) starts, restarts or stops the simulated machine.

// BMCUser is the user every simulated BMC has; the password is per machine.
const BMCUser = "admin"

// power is what a chassis control asks of the machine.
type power int

const (
	powerOff   power = iota
	powerOn          // on from off; a no-op when already on
	powerReset       // cycle, cold or warm reset: the machine restarts
)

// chassis is a simulated machine's chassis: its power and its boot flags.
type chassis struct {
	mu    sync.Mutex
	on    bool
	flags *types.BootOptionParam_BootFlags
	// act is called, without mu, for each power change.
	act func(power)
}

var _ hal.ChassisHAL = (*chassis)(nil)

func (c *chassis) PowerState(context.Context) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.on, nil
}

func (c *chassis) SetPower(_ context.Context, on bool) error {
	c.mu.Lock()
	was := c.on
	c.on = on
	c.mu.Unlock()
	switch {
	case on && !was:
		c.act(powerOn)
	case !on && was:
		c.act(powerOff)
	}
	return nil
}

func (c *chassis) restart() error {
	c.mu.Lock()
	c.on = true
	c.mu.Unlock()
	c.act(powerReset)
	return nil
}

func (c *chassis) PowerCycle(context.Context) error             { return c.restart() }
func (c *chassis) ColdReset(context.Context) error              { return c.restart() }
func (c *chassis) WarmReset(context.Context) error              { return c.restart() }
func (c *chassis) Identify(context.Context, uint8) error        { return nil }
func (c *chassis) IntrusionState(context.Context) (bool, error) { return false, nil }
func (c *chassis) SetBootInfoAcknowledge(context.Context, *types.BootOptionParam_BootInfoAcknowledge) error {
	return nil
}

func (c *chassis) GetBootInfoAcknowledge(context.Context) (*types.BootOptionParam_BootInfoAcknowledge, error) {
	return &types.BootOptionParam_BootInfoAcknowledge{}, nil
}

func (c *chassis) SetBootFlags(_ context.Context, f *types.BootOptionParam_BootFlags) error {
	if f == nil {
		return hal.ErrNotSupported
	}
	cp := *f
	c.mu.Lock()
	c.flags = &cp
	c.mu.Unlock()
	return nil
}

func (c *chassis) GetBootFlags(context.Context) (*types.BootOptionParam_BootFlags, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flags == nil {
		return nil, hal.ErrNotSupported
	}
	cp := *c.flags
	return &cp, nil
}

// bootPXE says whether the next boot is from the network: the boot flags force PXE,
// or force nothing and the machine has no installed OS (firmware falls through to
// the network, as a machine with an empty disk does). A one-time override is
// consumed, as real BMCs do.
func (c *chassis) bootPXE(installed bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flags == nil || !c.flags.BootFlagsValid {
		return !installed
	}
	dev := c.flags.BootDeviceSelector
	if !c.flags.Persist {
		c.flags.BootFlagsValid = false
	}
	switch dev {
	case types.BootDeviceSelectorForcePXE:
		return true
	case types.BootDeviceSelectorForceHardDrive, types.BootDeviceSelectorForceHardDriveSafe:
		return false
	}
	return !installed
}

// chassisHAL is go-ipmi's mock HAL (sensors, FRU, SDR, network) with our chassis.
type chassisHAL struct {
	*mock.HAL
	c *chassis
}

func (h chassisHAL) Chassis() hal.ChassisHAL { return h.c }

// simBMC is one machine's BMC, listening on its own UDP port.
type simBMC struct {
	addr netip.AddrPort
	srv  *server.Server
	conn *udp.Conn
}

func startBMC(ctx context.Context, addr netip.AddrPort, password string, guid [16]byte, c *chassis) (*simBMC, error) {
	info := bmc.DeviceInfo{DeviceID: 32, DeviceRevision: 1, FirmwareMajor: 1, IPMIVersion: 0x20,
		ManufacturerID: 0x000157, ProductID: 1, AdditionalDeviceSupport: 0x39}
	b := bmc.New(info, guid, chassisHAL{HAL: mock.New(), c: c})
	b.SetCipherSuites([]types.CipherSuiteID{types.CipherSuiteID3, types.CipherSuiteID17})
	u, err := b.Users.Add(2, BMCUser)
	if err != nil {
		return nil, fmt.Errorf("sim: bmc user: %w", err)
	}
	u.SetPassword([]byte(password))
	u.Enabled = true
	u.ChannelAccess[1] = bmc.UserChannelAccess{MaxPrivilege: bmc.PrivilegeLevelAdministrator, Enabled: true}
	uc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("sim: bmc %s: %w", addr, err)
	}
	conn := udp.Wrap(uc)
	s := &simBMC{addr: netip.MustParseAddrPort(uc.LocalAddr().String()), srv: server.NewServer(b, conn), conn: conn}
	go s.srv.Serve(ctx)
	return s, nil
}

func (s *simBMC) close() { s.srv.Close() }
