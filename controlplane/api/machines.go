package api

import (
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/rollouts"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/protocol"
)

// maxMACs bounds the MACs of one machine.
const maxMACs = 16

func (s *Server) setProxy(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var in apitype.HTTPProxySet
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
		return httpjson.Errorf(protocol.CodeNotFound, "site %s does not exist", human.ShortN(name, 80))
	}
	if err != nil {
		return err
	}
	s.specChanged(site.Name)
	s.log().Info("site http proxy changed", "site", site.Name, "proxy", p != nil, "spec_revision", site.SpecRevision)
	httpjson.WriteJSON(w, http.StatusOK, toSite(site))
	return nil
}

// checkHostPort accepts host:port with an IP or DNS name and a port;
// listen must be an IP address (the site agent binds it).
func checkHostPort(what, v string, ipOnly bool) error {
	host, port, err := net.SplitHostPort(v)
	p, perr := strconv.Atoi(port)
	switch {
	case err != nil || perr != nil || p < 1 || p > 65535 || host == "":
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: want host:port (e.g. 10.20.0.2:3128)", what, human.ShortN(v, 80))
	case ipOnly && net.ParseIP(host) == nil:
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: want an IP address and port the site agent listens on", what, human.ShortN(v, 80))
	case net.ParseIP(host) == nil && !validDNSName(host):
		return httpjson.Errorf(protocol.CodeInvalidInput, "%s %q: %q is not an IP address or DNS name", what, human.ShortN(v, 80), human.ShortN(host, 80))
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

// machineInfo is m as the api shows it, with its site's policy and whether
// its nodes are connected.
func (s *Server) machineInfo(r *http.Request, m store.Machine, site *store.Site) apitype.MachineInfo {
	if site == nil {
		if st, err := s.Store.GetSite(r.Context(), m.Site); err == nil {
			site = &st
		}
	}
	approval := ""
	if site != nil {
		approval = site.Approval
	}
	connected := func(id string) bool {
		if id == "" {
			return false
		}
		n, err := s.Store.GetNode(r.Context(), id)
		return err == nil && !n.Deleted() && n.SessionID != 0
	}
	return toMachine(m, approval, connected(m.RamdiskNode), connected(m.Node))
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
			return m, httpjson.Errorf(protocol.CodeInvalidInput, "machine name %s is used in several sites (%s); give the machine id", human.ShortN(ref, 80), strings.Join(sites, ", "))
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return m, httpjson.Errorf(protocol.CodeNotFound, "machine %s does not exist (give its id, name or a MAC)", human.ShortN(ref, 80))
	}
	return m, err
}

func (s *Server) createMachine(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	nm := machines.NewMachine{Site: in.Site, Name: in.Name, MACs: in.MACs, BootMode: in.BootMode, Firmware: in.Firmware}
	if in.BMC != nil {
		nm.BMC = bmcInput(*in.BMC)
	}
	got, err := s.machines().Create(r.Context(), nm)
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, s.machineInfo(r, got, nil))
	return nil
}

func bmcInput(in apitype.MachineBMCInput) *machines.BMCInput {
	return &machines.BMCInput{Address: in.Address, Port: in.Port, Username: in.Username, Password: in.Password, CipherSuite: in.CipherSuite}
}

func (s *Server) listMachines(w http.ResponseWriter, r *http.Request) error {
	site := r.URL.Query().Get("site")
	if site != "" {
		if err := ids.CheckName("site", site); err != nil {
			return err
		}
	}
	ms, err := s.Store.ListMachines(r.Context(), site)
	if err != nil {
		return err
	}
	sites := map[string]*store.Site{}
	out := apitype.MachineList{Machines: make([]apitype.MachineInfo, 0, len(ms))}
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
			cur := toDeployment(d)
			info.CurrentDeployment = &cur
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
	if err := s.machines().Delete(r.Context(), m); err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, info)
	return nil
}

// changed answers a machine the Service changed.
func (s *Server) changed(w http.ResponseWriter, r *http.Request, m store.Machine, err error) error {
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, s.machineInfo(r, m, nil))
	return nil
}

func (s *Server) setBoot(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineBoot
	if err := decode(r, &in); err != nil {
		return err
	}
	if _, err := machines.BootOverride(in.Mode, false); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().SetBootOverride(r.Context(), m, in.Mode)
	return s.changed(w, r, got, err)
}

func (s *Server) setBMC(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineBMCInput
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().SetBMC(r.Context(), m, *bmcInput(in))
	return s.changed(w, r, got, err)
}

func (s *Server) clearBMC(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().ClearBMC(r.Context(), m)
	return s.changed(w, r, got, err)
}

func (s *Server) approveMachine(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().Approve(r.Context(), m)
	return s.changed(w, r, got, err)
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
			return httpjson.Errorf(protocol.CodeInvalidInput, "limit %q: want 1 to 10000", human.ShortN(v, 80))
		}
		limit = n
	}
	evs, err := s.Store.MachineEvents(r.Context(), m.ID, limit)
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, apitype.MachineEventList{Machine: m.ID, Events: toEvents(evs)})
	return nil
}

// commandCreated answers a command the Service enqueued.
func commandCreated(w http.ResponseWriter, c store.Command, err error) error {
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, toCommand(c))
	return nil
}

func (s *Server) power(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachinePower
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	c, err := s.machines().Power(r.Context(), m, in.Action)
	return commandCreated(w, c, err)
}

func (s *Server) bootdev(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineBootdev
	if err := decode(r, &in); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	c, err := s.machines().Bootdev(r.Context(), m, in.Device, in.EFI, in.Persistent)
	return commandCreated(w, c, err)
}

func (s *Server) inventory(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	c, err := s.machines().Inventory(r.Context(), m)
	return commandCreated(w, c, err)
}

func (s *Server) deploy(w http.ResponseWriter, r *http.Request) error {
	if err := s.machines().CanDeploy(); err != nil {
		return err
	}
	var in apitype.DeployCreate
	if err := decode(r, &in); err != nil {
		return err
	}
	// The one place a deploy's defaults and checks are applied.
	in.Normalize()
	if err := in.Validate(); err != nil {
		return httpjson.Errorf(protocol.CodeInvalidInput, "%v", err)
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	// A deploy by catalog name is the deploy of the entry's image, copied
	// into the deployment: checked as one that gave it.
	if in.ImageName != "" {
		if in, err = s.resolveImage(r, in); err != nil {
			return err
		}
		if err := in.Validate(); err != nil {
			return httpjson.Errorf(protocol.CodeInvalidInput, "%v", err)
		}
	}
	version, agents, err := s.nodeAgent(r, in.BCDVersion)
	if err != nil {
		return err
	}
	d, got, err := s.machines().Deploy(r.Context(), m, store.DeploySpec{Image: in.Image, Target: in.Target, After: in.After,
		Cmdline: in.Cmdline, Pool: in.Pool, BCDVersion: version, NodeAgent: agents, Seed: in.Seed})
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusCreated, apitype.DeployCreated{Machine: s.machineInfo(r, got, nil), Deployment: toDeployment(d)})
	return nil
}

// nodeAgent resolves a deploy's bcd_version (or, when it gave none, the
// control plane's default, serve --deploy-bcd-version) to the release's
// binaries, which the deployment keeps; "" and none when neither names one.
func (s *Server) nodeAgent(r *http.Request, version string) (string, []store.NodeAgentBinary, error) {
	if version == "" {
		version = s.DeployBCDVersion
	}
	if version == "" {
		return "", nil, nil
	}
	if s.Rollouts == nil {
		return "", nil, httpjson.Errorf(protocol.CodeUnsupported, "bcd_version %s: this control plane keeps no releases", human.Short(version))
	}
	rel, err := s.Rollouts.Release(r.Context(), version)
	if err != nil {
		return "", nil, err // a refusal that names the version
	}
	var agents []store.NodeAgentBinary
	for _, arch := range rollouts.Arches {
		if b, ok := rel.Binary(arch); ok {
			agents = append(agents, store.NodeAgentBinary{Arch: arch, URL: rel.BinaryURL(arch), SHA256: b.SHA256, Size: b.Size})
		}
	}
	if len(agents) == 0 {
		return "", nil, httpjson.Errorf(protocol.CodeInvalidInput, "bcd_version %s: the release lists no linux binary", rel.Version)
	}
	return rel.Version, agents, nil
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) error {
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	if _, err := s.machines().Cancel(r.Context(), m); err != nil {
		return err
	}
	return s.getMachine(w, r)
}

func (s *Server) setFirmware(w http.ResponseWriter, r *http.Request) error {
	var in apitype.MachineFirmware
	if err := decode(r, &in); err != nil {
		return err
	}
	if _, err := machines.Firmware(in.Firmware); err != nil {
		return err
	}
	m, err := s.machine(r)
	if err != nil {
		return err
	}
	got, err := s.machines().SetFirmware(r.Context(), m, in.Firmware)
	return s.changed(w, r, got, err)
}
