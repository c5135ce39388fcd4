package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// maxMACs bounds the MACs of one machine.
const maxMACs = 16

func (s *Server) setProxy(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var in HTTPProxySet
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := checkHostPort("listen", in.Listen, true); err != nil {
		return err
	}
	seen := map[string]bool{}
	allow := []string{}
	for _, a := range in.Allow {
		if err := checkHostPort("allow", a, false); err != nil {
			return err
		}
		if !seen[a] {
			seen[a] = true
			allow = append(allow, a)
		}
	}
	if len(allow) > 64 {
		return httpjson.Errorf(protocol.CodeInvalidInput, "allow: %d destinations, at most 64", len(allow))
	}
	in.Allow = allow
	return s.writeProxy(w, r, name, &in)
}

func (s *Server) clearProxy(w http.ResponseWriter, r *http.Request) error {
	return s.writeProxy(w, r, r.PathValue("name"), nil)
}

func (s *Server) writeProxy(w http.ResponseWriter, r *http.Request, name string, p *protocol.HTTPProxySection) error {
	site, err := s.Store.SetSiteHTTPProxy(r.Context(), name, p, s.now())
	if errors.Is(err, store.ErrNotFound) {
		return httpjson.Errorf(protocol.CodeNotFound, "site %s does not exist", short(name))
	}
	if err != nil {
		return err
	}
	s.specChanged(site.Name)
	s.log().Info("site http proxy changed", "site", site.Name, "proxy", p != nil, "spec_revision", site.SpecRevision)
	httpjson.WriteJSON(w, http.StatusOK, site)
	return nil
}

// checkHostPort accepts host:port with an IP or DNS name and a port;
// listen must be an IP address (the site agent binds it).
func checkHostPort(what, v string, ipOnly bool) error {
	host, port, err := net.SplitHostPort(v)
	p, perr := strconv.Atoi(port)
	switch {
	case err != nil || perr != nil || p < 1 || p > 65535 || host == "":
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: want host:port (e.g. 10.20.0.2:3128)", what, short(v))
	case ipOnly && net.ParseIP(host) == nil:
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: want an IP address and port the site agent listens on", what, short(v))
	case net.ParseIP(host) == nil && !validDNSName(host):
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: %q is not an IP address or DNS name", what, short(v), short(host))
	}
	return nil
}

func validDNSName(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// machineInfo is m as the api shows it.
func (s *Server) machineInfo(r *http.Request, m store.Machine, site *store.Site) MachineInfo {
	info := MachineInfo{Machine: m}
	info.Machine.BMC = nil
	if m.BMC != nil {
		info.BMC = &MachineBMCInfo{Address: m.BMC.Address, Port: m.BMC.Port, Username: m.BMC.Username,
			HasPassword: m.BMC.Password != "", CipherSuite: m.BMC.CipherSuite}
	}
	if site == nil {
		if st, err := s.Store.GetSite(r.Context(), m.Site); err == nil {
			site = &st
		}
	}
	if site != nil {
		info.SiteApproval = site.Approval
	}
	connected := func(id string) bool {
		if id == "" {
			return false
		}
		n, err := s.Store.GetNode(r.Context(), id)
		return err == nil && !n.Deleted() && n.SessionID != 0
	}
	info.RamdiskConnected = connected(m.RamdiskNode)
	info.NodeConnected = connected(m.Node)
	return info
}

// machine resolves the route's machine reference: its id (m_…), a MAC, or
// its name (which must then name one machine across sites).
func (s *Server) machine(r *http.Request) (store.Machine, error) {
	ref := r.PathValue("ref")
	ctx := r.Context()
	var m store.Machine
	var err error
	switch {
	case ids.Valid(ids.PrefixMachine, ref):
		m, err = s.Store.GetMachine(ctx, ref)
	case machines.LooksLikeMAC(ref):
		mac, _ := protocol.NormalizeMAC(ref)
		m, err = s.Store.FindMachineByMAC(ctx, mac)
	default:
		var ms []store.Machine
		if ms, err = s.Store.FindMachinesByName(ctx, ref); err != nil {
			return m, err
		}
		switch len(ms) {
		case 0:
			err = store.ErrNotFound
		case 1:
			m = ms[0]
		default:
			sites := make([]string, len(ms))
			for i, x := range ms {
				sites[i] = x.Site + ": " + x.ID
			}
			return m, httpjson.Errorf(protocol.CodeInvalidInput, "machine name %s is used in several sites (%s); give the machine id", short(ref), strings.Join(sites, ", "))
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return m, httpjson.Errorf(protocol.CodeNotFound, "machine %s does not exist (give its id, name or a MAC)", short(ref))
	}
	return m, err
}

func (s *Server) createMachine(w http.ResponseWriter, r *http.Request) error {
	var in MachineCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	if err := checkName("site", in.Site); err != nil {
		return err
	}
	if in.Name != "" {
		if err := checkName("name", in.Name); err != nil {
			return err
		}
		if strings.HasPrefix(in.Name, ids.PrefixMachine) || machines.LooksLikeMAC(in.Name) {
			return httpjson.Errorf(protocol.CodeInvalidInput, "name %q would read as a machine id or a MAC", short(in.Name))
		}
	}
	if len(in.MACs) == 0 || len(in.MACs) > maxMACs {
		return httpjson.Errorf(protocol.CodeInvalidInput, "macs: give 1 to %d MAC addresses", maxMACs)
	}
	macs := make([]string, 0, len(in.MACs))
	for _, raw := range in.MACs {
		mac, err := protocol.NormalizeMAC(raw)
		if err != nil {
			return httpjson.Errorf(protocol.CodeInvalidInput, "macs: %v", err)
		}
		for _, m := range macs {
			if m == mac {
				return httpjson.Errorf(protocol.CodeInvalidInput, "macs: %s is given twice", mac)
			}
		}
		macs = append(macs, mac)
	}
	mode, err := bootMode(in.BootMode, true)
	if err != nil {
		return err
	}
	fw, err := firmware(in.Firmware)
	if err != nil {
		return err
	}
	now := s.now()
	m := store.Machine{ID: ids.New(ids.PrefixMachine, now), Name: in.Name, Site: in.Site, MACs: macs, BootMode: mode,
		Firmware: fw, State: store.MachineRegistered, StateChangedAt: now, CreatedAt: now, UpdatedAt: now}
	if in.BMC != nil {
		if m.BMC, err = checkBMC(m.ID, *in.BMC, nil); err != nil {
			return err
		}
	}
	if err := s.Store.CreateMachine(r.Context(), m); err != nil {
		switch {
		case errors.Is(err, store.ErrNotFound):
			return httpjson.Errorf(protocol.CodeNotFound, "site %s does not exist (better-compute sites create %s)", in.Site, in.Site)
		}
		var c *store.ConflictError
		if errors.As(err, &c) {
			return httpjson.Errorf(protocol.CodeAlreadyExists, "%s", c.Error())
		}
		return err
	}
	s.specChanged(m.Site)
	s.log().Info("machine added", "machine", m.ID, "name", m.Name, "site", m.Site, "macs", strings.Join(macs, ","),
		"boot_mode", m.BootMode, "bmc", m.BMC != nil)
	got, err := s.Store.GetMachine(r.Context(), m.ID)
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, s.machineInfo(r, got, nil))
	return nil
}

func bootMode(v string, create bool) (string, error) {
	switch v {
	case protocol.BootRamdisk, protocol.BootLocal:
		return v, nil
	case "none":
		return "", nil
	case "":
		if create {
			return "", nil
		}
	}
	return "", httpjson.Errorf(protocol.CodeInvalidInput, "boot mode %q: want ramdisk, local or none", short(v))
}

// checkBMC validates a BMC as the site agent will (its errors never quote
// the password); a nil Password keeps old's.
func checkBMC(machineID string, in MachineBMCInput, old *store.MachineBMC) (*store.MachineBMC, error) {
	b := &store.MachineBMC{Address: in.Address, Port: in.Port, Username: in.Username, CipherSuite: in.CipherSuite}
	switch {
	case in.Password != nil:
		b.Password = *in.Password
	case old != nil:
		b.Password = old.Password
	}
	h := protocol.BMCHost{Machine: machineID, Address: b.Address, Port: b.Port, Username: b.Username, Password: b.Password, CipherSuite: b.CipherSuite}
	if err := h.Validate(); err != nil {
		return nil, httpjson.Errorf(protocol.CodeInvalidInput, "bmc: %v", err)
	}
	return b, nil
}

func (s *Server) listMachines(w http.ResponseWriter, r *http.Request) error {
	site := r.URL.Query().Get("site")
	if site != "" {
		if err := checkName("site", site); err != nil {
			return err
		}
	}
	ms, err := s.Store.ListMachines(r.Context(), site)
	if err != nil {
		return err
	}
	sites := map[string]*store.Site{}
	out := MachineList{Machines: make([]MachineInfo, 0, len(ms))}
	for _, m := range ms {
		st, ok := sites[m.Site]
		if !ok {
			if got, err := s.Store.GetSite(r.Context(), m.Site); err == nil {
				st = &got
			}
			sites[m.Site] = st
		}
		m.Inventory = nil
		out.Machines = append(out.Machines, s.machineInfo(r, m, st))
	}
	httpjson.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getMachine(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	info := s.machineInfo(r, m, nil)
	if m.Deployment != "" {
		d, err := s.Store.GetDeployment(r.Context(), m.Deployment)
		switch {
		case err == nil:
			d = RedactDeployment(d)
			info.CurrentDeployment = &d
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
	}
	httpjson.WriteJSON(w, http.StatusOK, info)
	return nil
}

func (s *Server) deleteMachine(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	info := s.machineInfo(r, m, nil)
	if err := s.Store.DeleteMachine(r.Context(), m.ID); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return httpjson.Errorf(protocol.CodeNotFound, "machine %s does not exist", m.ID)
		}
		return err
	}
	s.specChanged(m.Site)
	s.log().Info("machine deleted", "machine", m.ID, "site", m.Site)
	httpjson.WriteJSON(w, http.StatusOK, info)
	return nil
}

// update applies u to the route's machine and answers the machine.
func (s *Server) update(w http.ResponseWriter, r *http.Request, m store.Machine, u store.MachineUpdate, spec bool) error {
	u.At = s.now()
	got, err := s.Store.UpdateMachine(r.Context(), m.ID, u)
	if errors.Is(err, store.ErrNotFound) {
		return httpjson.Errorf(protocol.CodeNotFound, "machine %s does not exist", m.ID)
	}
	if err != nil {
		return err
	}
	if spec {
		s.specChanged(got.Site)
	}
	s.log().Info("machine changed", "machine", got.ID, "change", u.Event.Kind, "detail", u.Event.Message)
	httpjson.WriteJSON(w, http.StatusOK, s.machineInfo(r, got, nil))
	return nil
}

func (s *Server) setBoot(w http.ResponseWriter, r *http.Request) error {
	var in MachineBoot
	if err := decode(r, &in); err != nil {
		return err
	}
	mode, err := bootMode(in.Mode, false)
	if err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	return s.update(w, r, m, store.MachineUpdate{BootMode: &mode, Event: store.MachineEvent{Kind: "machine.boot_mode",
		Message: fmt.Sprintf("boot mode %s (was %s)", orNone(mode), orNone(m.BootMode))}}, true)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func (s *Server) setBMC(w http.ResponseWriter, r *http.Request) error {
	var in MachineBMCInput
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	b, err := checkBMC(m.ID, in, m.BMC)
	if err != nil {
		return err
	}
	return s.update(w, r, m, store.MachineUpdate{SetBMC: true, BMC: b, Event: store.MachineEvent{Kind: "machine.bmc",
		Message: fmt.Sprintf("BMC %s user %s", net.JoinHostPort(b.Address, strconv.Itoa(bmcPort(b.Port))), b.Username)}}, true)
}

func bmcPort(p int) int {
	if p == 0 {
		return protocol.DefaultIPMIPort
	}
	return p
}

func (s *Server) clearBMC(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	return s.update(w, r, m, store.MachineUpdate{SetBMC: true, Event: store.MachineEvent{Kind: "machine.bmc", Message: "BMC removed"}}, true)
}

func (s *Server) approveMachine(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	return s.update(w, r, m, store.MachineUpdate{Approve: true, Event: store.MachineEvent{Kind: "machine.approved",
		Message: "approved: its ramdisk may join"}}, false)
}

func (s *Server) machineEvents(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	limit := 1000
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return httpjson.Errorf(protocol.CodeInvalidInput, "limit %q: want 1 to 10000", short(v))
		}
		limit = n
	}
	evs, err := s.Store.MachineEvents(r.Context(), m.ID, limit)
	if err != nil {
		return err
	}
	if evs == nil {
		evs = []store.MachineEvent{}
	}
	httpjson.WriteJSON(w, http.StatusOK, MachineEventList{Machine: m.ID, Events: evs})
	return nil
}

// siteAgent picks the site agent a machine's BMC commands go to: a
// connected site node of the site, the one seen last.
func (s *Server) siteAgent(r *http.Request, site string) (store.Node, error) {
	nodes, err := s.Store.ListNodes(r.Context())
	if err != nil {
		return store.Node{}, err
	}
	var best store.Node
	known := 0
	for _, n := range nodes {
		if n.Role != protocol.RoleSite || n.Site != site {
			continue
		}
		known++
		if n.SessionID != 0 && (best.ID == "" || n.LastSeenAt.After(best.LastSeenAt)) {
			best = n
		}
	}
	switch {
	case best.ID != "":
		return best, nil
	case known == 0:
		return best, httpjson.Errorf(protocol.CodeUnavailable, "site %s has no site agent to run BMC commands (join one: better-compute tokens create --role site --site %s)", site, site)
	}
	return best, httpjson.Errorf(protocol.CodeUnavailable, "no site agent of site %s is connected (%d known, all offline)", site, known)
}

// enqueue stores a command about machine m for node and tells its session.
func (s *Server) enqueue(r *http.Request, m store.Machine, node, kind string, params any) (store.Command, error) {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return store.Command{}, err
		}
		raw = b
	}
	now := s.now()
	c := store.Command{ID: ids.New(ids.PrefixCommand, now), NodeID: node, MachineID: m.ID, Kind: kind, Params: raw,
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}
	if err := s.Store.CreateCommand(r.Context(), c); err != nil {
		return c, err
	}
	if s.Notifier != nil {
		s.Notifier.Notify(node)
	}
	s.log().Info("command enqueued", "command", c.ID, "node", node, "machine", m.ID, "kind", kind)
	return c, nil
}

func (s *Server) power(w http.ResponseWriter, r *http.Request) error {
	var in MachinePower
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	p := protocol.BMCPowerParams{Machine: m.ID, Action: in.Action}
	if err := p.Validate(); err != nil {
		return httpjson.Errorf(protocol.CodeInvalidInput, "%v", err)
	}
	return s.bmcCommand(w, r, m, protocol.KindBMCPower, p)
}

func (s *Server) bootdev(w http.ResponseWriter, r *http.Request) error {
	var in MachineBootdev
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	p := protocol.BMCBootdevParams{Machine: m.ID, Device: in.Device, EFI: in.EFI, Persistent: in.Persistent}
	if err := p.Validate(); err != nil {
		return httpjson.Errorf(protocol.CodeInvalidInput, "%v", err)
	}
	return s.bmcCommand(w, r, m, protocol.KindBMCBootdev, p)
}

func (s *Server) bmcCommand(w http.ResponseWriter, r *http.Request, m store.Machine, kind string, params any) error {
	if m.BMC == nil {
		return httpjson.Errorf(protocol.CodeInvalidInput, "machine %s has no BMC (better-compute machines set-bmc %s …)", m.ID, m.ID)
	}
	agent, err := s.siteAgent(r, m.Site)
	if err != nil {
		return err
	}
	c, err := s.enqueue(r, m, agent.ID, kind, params)
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, RedactCommand(c))
	return nil
}

// ramdisk is the machine's ramdisk node when it has a session.
func (s *Server) ramdisk(r *http.Request, m store.Machine) (store.Node, error) {
	if m.RamdiskNode == "" {
		return store.Node{}, httpjson.Errorf(protocol.CodeUnavailable, "machine %s has no ramdisk node: PXE-boot it into the ramdisk first (machines boot %s ramdisk, machines power %s cycle)", m.ID, m.ID, m.ID)
	}
	n, err := s.Store.GetNode(r.Context(), m.RamdiskNode)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return n, httpjson.Errorf(protocol.CodeUnavailable, "machine %s's ramdisk node %s is gone", m.ID, m.RamdiskNode)
	case err != nil:
		return n, err
	case n.Deleted() || n.Role != protocol.RoleRamdisk:
		return n, httpjson.Errorf(protocol.CodeUnavailable, "machine %s's ramdisk node %s was retired", m.ID, n.ID)
	case n.SessionID == 0:
		return n, httpjson.Errorf(protocol.CodeUnavailable, "machine %s's ramdisk node %s is not connected", m.ID, n.ID)
	}
	return n, nil
}

func (s *Server) inventory(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	n, err := s.ramdisk(r, m)
	if err != nil {
		return err
	}
	c, err := s.enqueue(r, m, n.ID, protocol.KindInventory, nil)
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, RedactCommand(c))
	return nil
}

func (s *Server) deploy(w http.ResponseWriter, r *http.Request) error {
	if s.Lifecycle == nil {
		return httpjson.Errorf(protocol.CodeUnsupported, "this api runs without the machine lifecycle (better-compute serve runs it)")
	}
	var in DeployCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	if in.Pool == "" {
		in.Pool = DefaultPool
	}
	if err := checkName("pool", in.Pool); err != nil {
		return err
	}
	switch in.After {
	case "":
		in.After = protocol.AfterKexec
	case protocol.AfterKexec, protocol.AfterReboot:
	default:
		return httpjson.Errorf(protocol.CodeInvalidInput, "after %q: a deployment ends with the installed OS running: want kexec or reboot", short(in.After))
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	d, got, err := s.Lifecycle.Deploy(r.Context(), m, store.DeploySpec{Image: in.Image, Target: in.Target, After: in.After,
		Cmdline: in.Cmdline, Pool: in.Pool})
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, DeployCreated{Machine: s.machineInfo(r, got, nil), Deployment: RedactDeployment(d)})
	return nil
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) error {
	if s.Lifecycle == nil {
		return httpjson.Errorf(protocol.CodeUnsupported, "this api runs without the machine lifecycle (better-compute serve runs it)")
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	if _, err := s.Lifecycle.Cancel(r.Context(), m); err != nil {
		return err
	}
	return s.getMachine(w, r)
}

func (s *Server) setFirmware(w http.ResponseWriter, r *http.Request) error {
	var in MachineFirmware
	if err := decode(r, &in); err != nil {
		return err
	}
	fw, err := firmware(in.Firmware)
	if err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	return s.update(w, r, m, store.MachineUpdate{Firmware: &fw, Event: store.MachineEvent{Kind: "machine.firmware",
		Message: fmt.Sprintf("firmware %s (was %s)", fw, m.Firmware)}}, false)
}

func firmware(v string) (string, error) {
	switch v {
	case "", store.FirmwareBIOS:
		return store.FirmwareBIOS, nil
	case store.FirmwareUEFI:
		return v, nil
	}
	return "", httpjson.Errorf(protocol.CodeInvalidInput, "firmware %q: want bios or uefi", short(v))
}

// RedactDeployment returns d as the api shows it: the image URL without
// userinfo, query or fragment, which may hold a credential.
func RedactDeployment(d store.Deployment) store.Deployment {
	d.Spec.Image.URL = protocol.RedactURL(d.Spec.Image.URL)
	return d
}
