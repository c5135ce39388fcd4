package machines

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/refusal"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// MaxMACs bounds the MACs of one machine.
const MaxMACs = 16

// ServiceStore is what the Service reads and writes.
type ServiceStore interface {
	GetSite(ctx context.Context, name string) (store.Site, error)
	CreateMachine(ctx context.Context, m store.Machine) error
	GetMachine(ctx context.Context, id string) (store.Machine, error)
	UpdateMachine(ctx context.Context, id string, u store.MachineUpdate) (store.Machine, error)
	DeleteMachine(ctx context.Context, id string, ifIdle bool) error
	GetNode(ctx context.Context, id string) (store.Node, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	CreateCommand(ctx context.Context, c store.Command) error
}

// Lifecycle starts and stops deployments: the lifecycle controller.
type Lifecycle interface {
	// Deploy starts a deployment of m with a normalized, valid spec and
	// returns it with the machine as it started it.
	Deploy(ctx context.Context, m store.Machine, spec store.DeploySpec) (store.Deployment, store.Machine, error)
	// Cancel stops m's running deployment.
	Cancel(ctx context.Context, m store.Machine) (store.Deployment, error)
}

// Notifier reaches agents' sessions: the gateway.
type Notifier interface {
	// Notify: the node has a new command.
	Notify(nodeID string)
	// SpecChanged: what the site's agents are sent changed.
	SpecChanged(site string)
}

// Service is the only way the api changes a machine: it owns the machine's
// spec (name, MACs, BMC, firmware, approval, boot override), routes
// deployments through the Lifecycle, and refuses what would act under a
// running deployment — a spec change, a manual BMC command, a delete — with
// an error that names the deployment (approval stays allowed: a deploy in a
// site with manual approval waits for it). Every refusal is a
// *refusal.Refusal.
type Service struct {
	Store ServiceStore
	// Lifecycle runs deployments; nil refuses them (UNSUPPORTED).
	Lifecycle Lifecycle
	// Notifier tells sessions about new commands and spec changes; nil
	// leaves them to the agents' next session.
	Notifier Notifier
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Service) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (s *Service) specChanged(site string) {
	if s.Notifier != nil {
		s.Notifier.SpecChanged(site)
	}
}

// BMCInput is a machine's BMC as an operator gives it; a nil Password keeps
// the password the machine has.
type BMCInput struct {
	Address     string
	Port        int
	Username    string
	Password    *string
	CipherSuite int
}

// NewMachine is what an operator gives to add a machine.
type NewMachine struct {
	Site, Name string
	MACs       []string
	// BootMode is ramdisk, local, none or "" (none).
	BootMode string
	BMC      *BMCInput
	// Firmware is bios ("" means bios) or uefi.
	Firmware string
}

// Create validates and adds a machine.
func (s *Service) Create(ctx context.Context, in NewMachine) (store.Machine, error) {
	if err := ids.CheckName("site", in.Site); err != nil {
		return store.Machine{}, err
	}
	if in.Name != "" {
		if err := ids.CheckName("name", in.Name); err != nil {
			return store.Machine{}, err
		}
		if strings.HasPrefix(in.Name, ids.PrefixMachine) || LooksLikeMAC(in.Name) {
			return store.Machine{}, refusal.New(protocol.CodeInvalidInput, "name %q would read as a machine id or a MAC", human.Short(in.Name))
		}
	}
	if len(in.MACs) == 0 || len(in.MACs) > MaxMACs {
		return store.Machine{}, refusal.New(protocol.CodeInvalidInput, "macs: give 1 to %d MAC addresses", MaxMACs)
	}
	macs := make([]string, 0, len(in.MACs))
	for _, raw := range in.MACs {
		mac, err := protocol.NormalizeMAC(raw)
		if err != nil {
			return store.Machine{}, refusal.New(protocol.CodeInvalidInput, "macs: %v", err)
		}
		for _, m := range macs {
			if m == mac {
				return store.Machine{}, refusal.New(protocol.CodeInvalidInput, "macs: %s is given twice", mac)
			}
		}
		macs = append(macs, mac)
	}
	override, err := BootOverride(in.BootMode, true)
	if err != nil {
		return store.Machine{}, err
	}
	fw, err := Firmware(in.Firmware)
	if err != nil {
		return store.Machine{}, err
	}
	now := s.now()
	m := store.Machine{ID: ids.New(ids.PrefixMachine, now), Site: in.Site,
		MachineSpec:   store.MachineSpec{Name: in.Name, MACs: macs, BootOverride: override, Firmware: fw},
		MachineStatus: store.MachineStatus{State: store.MachineRegistered, StateChangedAt: now},
		CreatedAt:     now, UpdatedAt: now}
	if in.BMC != nil {
		if m.BMC, err = CheckBMC(m.ID, *in.BMC, nil); err != nil {
			return store.Machine{}, err
		}
	}
	if err := s.Store.CreateMachine(ctx, m); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return store.Machine{}, refusal.New(protocol.CodeNotFound, "site %s does not exist (better-compute sites create %s)", in.Site, in.Site)
		}
		var c *store.ConflictError
		if errors.As(err, &c) {
			return store.Machine{}, refusal.New(protocol.CodeAlreadyExists, "%s", c.Error())
		}
		return store.Machine{}, err
	}
	s.specChanged(m.Site)
	s.log().Info("machine added", "machine", m.ID, "name", m.Name, "site", m.Site, "macs", strings.Join(macs, ","),
		"boot_override", m.BootOverride, "bmc", m.BMC != nil)
	return s.Store.GetMachine(ctx, m.ID)
}

// BootOverride checks an operator's boot mode: ramdisk, local or none
// (store.BootOverrideNone); "" means none when creating.
func BootOverride(v string, create bool) (string, error) {
	switch v {
	case protocol.BootRamdisk, protocol.BootLocal, store.BootOverrideNone:
		return v, nil
	case "":
		if create {
			return "", nil
		}
	}
	return "", refusal.New(protocol.CodeInvalidInput, "boot mode %q: want ramdisk, local or none", human.Short(v))
}

// Firmware checks a machine's firmware: bios ("" means bios) or uefi.
func Firmware(v string) (string, error) {
	switch v {
	case "", store.FirmwareBIOS:
		return store.FirmwareBIOS, nil
	case store.FirmwareUEFI:
		return v, nil
	}
	return "", refusal.New(protocol.CodeInvalidInput, "firmware %q: want bios or uefi", human.Short(v))
}

// CheckBMC validates a BMC as the site agent will (its errors never quote
// the password); a nil Password keeps old's.
func CheckBMC(machineID string, in BMCInput, old *store.MachineBMC) (*store.MachineBMC, error) {
	b := &store.MachineBMC{Address: in.Address, Port: in.Port, Username: in.Username, CipherSuite: in.CipherSuite}
	switch {
	case in.Password != nil:
		b.Password = *in.Password
	case old != nil:
		b.Password = old.Password
	}
	h := protocol.BMCHost{Machine: machineID, Address: b.Address, Port: b.Port, Username: b.Username, Password: b.Password, CipherSuite: b.CipherSuite}
	if err := h.Validate(); err != nil {
		return nil, refusal.New(protocol.CodeInvalidInput, "bmc: %v", err)
	}
	return b, nil
}

// update applies a spec change to m, refused while a deployment runs
// (checked in the store's transaction, so a deploy that starts meanwhile
// cannot slip under it).
func (s *Service) update(ctx context.Context, m store.Machine, u store.MachineUpdate, spec bool) (store.Machine, error) {
	u.At = s.now()
	got, err := s.Store.UpdateMachine(ctx, m.ID, u)
	if err := refuseBusy(err, m.ID); err != nil {
		return store.Machine{}, err
	}
	if spec {
		s.specChanged(got.Site)
	}
	s.log().Info("machine changed", "machine", got.ID, "change", u.Event.Kind, "detail", u.Event.Message)
	return got, nil
}

// refuseBusy turns the store's answers to a refused change into refusals.
func refuseBusy(err error, id string) error {
	var busy *store.BusyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &busy):
		return refusal.New(protocol.CodeMachineBusy, "%s", busy.Error())
	case errors.Is(err, store.ErrNotFound):
		return refusal.New(protocol.CodeNotFound, "machine %s does not exist", id)
	}
	return err
}

// SetBootOverride sets the operator's boot mode (ramdisk, local, none).
func (s *Service) SetBootOverride(ctx context.Context, m store.Machine, mode string) (store.Machine, error) {
	override, err := BootOverride(mode, false)
	if err != nil {
		return store.Machine{}, err
	}
	return s.update(ctx, m, store.MachineUpdate{BootOverride: &override, IfIdle: true, Event: store.MachineEvent{Kind: protocol.MachineEventBootMode,
		Message: fmt.Sprintf("boot mode %s (was %s)", orNone(effective(override, m)), orNone(m.EffectiveBootMode()))}}, true)
}

// effective is the boot mode the override puts in effect for m.
func effective(override string, m store.Machine) string {
	m.BootOverride = override
	return m.EffectiveBootMode()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// SetBMC sets the machine's BMC; a nil Password keeps the one it has.
func (s *Service) SetBMC(ctx context.Context, m store.Machine, in BMCInput) (store.Machine, error) {
	b, err := CheckBMC(m.ID, in, m.BMC)
	if err != nil {
		return store.Machine{}, err
	}
	port := b.Port
	if port == 0 {
		port = protocol.DefaultIPMIPort
	}
	return s.update(ctx, m, store.MachineUpdate{SetBMC: true, BMC: b, IfIdle: true, Event: store.MachineEvent{Kind: protocol.MachineEventBMC,
		Message: fmt.Sprintf("BMC %s user %s", net.JoinHostPort(b.Address, strconv.Itoa(port)), b.Username)}}, true)
}

// ClearBMC removes the machine's BMC.
func (s *Service) ClearBMC(ctx context.Context, m store.Machine) (store.Machine, error) {
	return s.update(ctx, m, store.MachineUpdate{SetBMC: true, IfIdle: true, Event: store.MachineEvent{Kind: protocol.MachineEventBMC, Message: "BMC removed"}}, true)
}

// SetFirmware sets how the BMC is told to PXE-boot the machine.
func (s *Service) SetFirmware(ctx context.Context, m store.Machine, firmware string) (store.Machine, error) {
	fw, err := Firmware(firmware)
	if err != nil {
		return store.Machine{}, err
	}
	return s.update(ctx, m, store.MachineUpdate{Firmware: &fw, IfIdle: true, Event: store.MachineEvent{Kind: protocol.MachineEventFirmware,
		Message: fmt.Sprintf("firmware %s (was %s)", fw, m.Firmware)}}, false)
}

// Approve lets the machine's ramdisk join in a site with manual approval,
// and its TPM's join (tpm attestor) whose EK is not enrolled yet, which
// then enrolls it; allowed during a deployment, which may be waiting for it.
func (s *Service) Approve(ctx context.Context, m store.Machine) (store.Machine, error) {
	return s.update(ctx, m, store.MachineUpdate{Approve: true, Event: store.MachineEvent{Kind: protocol.MachineEventApproved,
		Message: "approved: its ramdisk may join"}}, false)
}

// CheckEKSHA256 checks a TPM endorsement key's hash: 64 lower-case hex
// digits, the SHA-256 of its PKIX DER.
func CheckEKSHA256(v string) error {
	if len(v) != 64 || strings.Trim(v, "0123456789abcdef") != "" {
		return refusal.New(protocol.CodeInvalidInput, "ek_sha256 %q: want the 64 lower-case hex digits of the SHA-256 of the EK's PKIX DER", human.Short(v))
	}
	return nil
}

// EnrollTPM makes ek the endorsement key of the machine's TPM: its tpm join
// enters the machine's site and pool ("": the default pool), bound to it.
// Allowed during a deployment, whose installed OS may join with it; an EK
// another machine holds is ALREADY_EXISTS.
func (s *Service) EnrollTPM(ctx context.Context, m store.Machine, ek, pool string) (store.Machine, error) {
	if err := CheckEKSHA256(ek); err != nil {
		return store.Machine{}, err
	}
	if pool != "" {
		if err := ids.CheckName("pool", pool); err != nil {
			return store.Machine{}, err
		}
	}
	got, err := s.update(ctx, m, store.MachineUpdate{SetTPM: true, TPM: &store.TPMEnrollment{EKSHA256: ek, Site: m.Site, Pool: pool, MachineID: m.ID}}, false)
	var c *store.EKConflictError
	if errors.As(err, &c) {
		return store.Machine{}, refusal.New(protocol.CodeAlreadyExists, "%s", c.Error())
	}
	return got, err
}

// ClearTPM removes the machine's TPM enrollment.
func (s *Service) ClearTPM(ctx context.Context, m store.Machine) (store.Machine, error) {
	return s.update(ctx, m, store.MachineUpdate{SetTPM: true}, false)
}

// Delete removes the machine, refused while a deployment runs.
func (s *Service) Delete(ctx context.Context, m store.Machine) error {
	if err := refuseBusy(s.Store.DeleteMachine(ctx, m.ID, true), m.ID); err != nil {
		return err
	}
	s.specChanged(m.Site)
	s.log().Info("machine deleted", "machine", m.ID, "site", m.Site)
	return nil
}

// Power sends bmc.power to a site agent of the machine's site; refused
// while a deployment runs (it drives the BMC itself).
func (s *Service) Power(ctx context.Context, m store.Machine, action string) (store.Command, error) {
	p := protocol.BMCPowerParams{Machine: m.ID, Action: action}
	if err := p.Validate(); err != nil {
		return store.Command{}, refusal.New(protocol.CodeInvalidInput, "%v", err)
	}
	return s.bmcCommand(ctx, m, protocol.KindBMCPower, p)
}

// Bootdev sends bmc.bootdev; refused while a deployment runs.
func (s *Service) Bootdev(ctx context.Context, m store.Machine, device string, efi, persistent bool) (store.Command, error) {
	p := protocol.BMCBootdevParams{Machine: m.ID, Device: device, EFI: efi, Persistent: persistent}
	if err := p.Validate(); err != nil {
		return store.Command{}, refusal.New(protocol.CodeInvalidInput, "%v", err)
	}
	return s.bmcCommand(ctx, m, protocol.KindBMCBootdev, p)
}

func (s *Service) bmcCommand(ctx context.Context, m store.Machine, kind string, params any) (store.Command, error) {
	if m.Busy() {
		return store.Command{}, refusal.New(protocol.CodeMachineBusy, "%s", (&store.BusyError{Machine: m.ID, State: m.State, Deployment: m.Deployment}).Error())
	}
	if m.BMC == nil {
		return store.Command{}, refusal.New(protocol.CodeInvalidInput, "machine %s has no BMC (better-compute machines set-bmc %s …)", m.ID, m.ID)
	}
	nodes, err := s.Store.ListNodes(ctx)
	if err != nil {
		return store.Command{}, err
	}
	agent, known := PickSiteAgent(nodes, m.Site)
	switch {
	case agent.ID != "":
	case known == 0:
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "site %s has no site agent to run BMC commands (join one: better-compute tokens create --role site --site %s)", m.Site, m.Site)
	default:
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "no site agent of site %s is connected (%d known, all offline)", m.Site, known)
	}
	return s.enqueue(ctx, m, agent.ID, kind, params)
}

// Inventory asks the machine's connected ramdisk for its inventory.
func (s *Service) Inventory(ctx context.Context, m store.Machine) (store.Command, error) {
	if m.RamdiskNode == "" {
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "machine %s has no ramdisk node: PXE-boot it into the ramdisk first (machines boot %s ramdisk, machines power %s cycle)", m.ID, m.ID, m.ID)
	}
	n, err := s.Store.GetNode(ctx, m.RamdiskNode)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "machine %s's ramdisk node %s is gone", m.ID, m.RamdiskNode)
	case err != nil:
		return store.Command{}, err
	case n.Deleted() || n.Role != protocol.RoleRamdisk:
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "machine %s's ramdisk node %s was retired", m.ID, n.ID)
	case n.SessionID == 0:
		return store.Command{}, refusal.New(protocol.CodeUnavailable, "machine %s's ramdisk node %s is not connected", m.ID, n.ID)
	}
	return s.enqueue(ctx, m, n.ID, protocol.KindInventory, nil)
}

// enqueue stores a command about m for node and tells its session.
func (s *Service) enqueue(ctx context.Context, m store.Machine, node, kind string, params any) (store.Command, error) {
	c, err := NewCommand(s.now(), node, m.ID, kind, params)
	if err != nil {
		return c, err
	}
	if err := s.Store.CreateCommand(ctx, c); err != nil {
		return c, err
	}
	if s.Notifier != nil {
		s.Notifier.Notify(node)
	}
	s.log().Info("command enqueued", "command", c.ID, "node", node, "machine", m.ID, "kind", kind)
	return c, nil
}

// Deploy starts a deployment of m through the Lifecycle. spec was
// normalized and validated at the api edge (apitype.DeployCreate).
func (s *Service) Deploy(ctx context.Context, m store.Machine, spec store.DeploySpec) (store.Deployment, store.Machine, error) {
	if err := s.CanDeploy(); err != nil {
		return store.Deployment{}, store.Machine{}, err
	}
	return s.Lifecycle.Deploy(ctx, m, spec)
}

// CanDeploy refuses (UNSUPPORTED) when the Service has no Lifecycle to run
// deployments.
func (s *Service) CanDeploy() error {
	if s.Lifecycle == nil {
		return refusal.New(protocol.CodeUnsupported, "this api runs without the machine lifecycle (better-compute serve runs it)")
	}
	return nil
}

// Cancel stops the machine's running deployment.
func (s *Service) Cancel(ctx context.Context, m store.Machine) (store.Deployment, error) {
	if err := s.CanDeploy(); err != nil {
		return store.Deployment{}, err
	}
	return s.Lifecycle.Cancel(ctx, m)
}

// PickSiteAgent is the site agent a machine's BMC commands go to: the
// connected site node of site seen last (ID "" for none), and how many site
// nodes the site has. The api and the lifecycle both pick with it.
func PickSiteAgent(nodes []store.Node, site string) (best store.Node, known int) {
	for _, n := range nodes {
		if n.Role != protocol.RoleSite || n.Site != site || n.Deleted() {
			continue
		}
		known++
		if n.SessionID != 0 && (best.ID == "" || n.LastSeenAt.After(best.LastSeenAt)) {
			best = n
		}
	}
	return best, known
}

// NewCommand is a command about machineID for node, pending: the one
// constructor the api and the lifecycle share.
func NewCommand(now time.Time, node, machineID, kind string, params any) (store.Command, error) {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return store.Command{}, fmt.Errorf("%s params: %w", kind, err)
		}
		raw = b
	}
	return store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: node, MachineID: machineID, Kind: kind, Params: raw,
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}, nil
}
