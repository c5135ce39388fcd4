package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/api"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

func ptr[T any](v T) *T { return &v }

func (n *notes) notifiedNodes() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.notified...)
}

func (n *notes) specChanges() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.specs...)
}

func TestMachinesCRUD(t *testing.T) {
	e := start(t, "")
	m, err := e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, Name: "rack1-u1", MACs: []string{"52-54-00-AA-00-01", "52:54:00:aa:00:02"},
		BootMode: "ramdisk", BMC: &apitype.MachineBMCInput{Address: "10.0.0.5", Username: "admin", Password: ptr("hunter2"), CipherSuite: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "m_") || strings.Join(m.MACs, ",") != "52:54:00:aa:00:01,52:54:00:aa:00:02" || m.State != "registered" ||
		m.BMC == nil || !m.BMC.HasPassword || m.BMC.CipherSuite != 3 || m.SiteApproval != "auto" || m.BootMode != "ramdisk" {
		t.Errorf("created %+v bmc %+v", m, m.BMC)
	}
	if got := e.notes.specChanges(); len(got) != 1 || got[0] != cptest.Site {
		t.Errorf("spec changes %v", got)
	}
	// Every read: never the password.
	for _, path := range []string{"/api/v1/machines", "/api/v1/machines/" + m.ID, "/api/v1/machines/rack1-u1", "/api/v1/machines/52:54:00:aa:00:02",
		"/api/v1/machines/" + m.ID + "/events"} {
		req, _ := http.NewRequest("GET", e.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+e.op)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(body), "hunter2") || strings.Contains(string(body), `"password"`) {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, body)
		}
	}
	for _, ref := range []string{m.ID, "rack1-u1", "52:54:00:AA:00:01", "52-54-00-aa-00-02"} {
		if got, err := e.c.GetMachine(ctx, ref); err != nil || got.ID != m.ID {
			t.Errorf("by %s: %+v %v", ref, got.ID, err)
		}
	}
	if _, err := e.c.GetMachine(ctx, "nope"); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("missing: %v", err)
	}

	for name, in := range map[string]apitype.MachineCreate{
		"no macs":         {Site: cptest.Site},
		"bad mac":         {Site: cptest.Site, MACs: []string{"zz"}},
		"same mac twice":  {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:01", "52-54-00-BB-00-01"}},
		"bad boot":        {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:02"}, BootMode: "netboot"},
		"name like id":    {Site: cptest.Site, Name: "m_x", MACs: []string{"52:54:00:bb:00:03"}},
		"name like mac":   {Site: cptest.Site, Name: "52-54-00-bb-00-09", MACs: []string{"52:54:00:bb:00:04"}},
		"bmc no user":     {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:05"}, BMC: &apitype.MachineBMCInput{Address: "10.0.0.6"}},
		"bmc bad address": {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:06"}, BMC: &apitype.MachineBMCInput{Address: "10.0.0.6:623", Username: "u"}},
		"bmc long pw":     {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:07"}, BMC: &apitype.MachineBMCInput{Address: "10.0.0.6", Username: "u", Password: ptr(strings.Repeat("p", 21))}},
		"bad cipher":      {Site: cptest.Site, MACs: []string{"52:54:00:bb:00:08"}, BMC: &apitype.MachineBMCInput{Address: "10.0.0.6", Username: "u", CipherSuite: 2}},
	} {
		_, err := e.c.CreateMachine(ctx, in)
		if client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
		if err != nil && strings.Contains(err.Error(), strings.Repeat("p", 21)) {
			t.Errorf("%s: the refusal quotes the password", name)
		}
	}
	_, err = e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{"52:54:00:aa:00:02"}})
	if client.Code(err) != protocol.CodeAlreadyExists || !strings.Contains(err.Error(), m.ID) {
		t.Errorf("MAC taken: %v", err)
	}
	if _, err = e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, Name: "rack1-u1", MACs: []string{"52:54:00:cc:00:01"}}); client.Code(err) != protocol.CodeAlreadyExists {
		t.Errorf("name taken: %v", err)
	}
	if _, err = e.c.CreateMachine(ctx, apitype.MachineCreate{Site: "nowhere", MACs: []string{"52:54:00:cc:00:02"}}); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("missing site: %v", err)
	}
	// One name in two sites needs the id.
	e.c.CreateSite(ctx, "ams1")
	if _, err := e.c.CreateMachine(ctx, apitype.MachineCreate{Site: "ams1", Name: "rack1-u1", MACs: []string{"52:54:00:cc:00:03"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.GetMachine(ctx, "rack1-u1"); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("ambiguous name: %v", err)
	}
	if list, _ := e.c.ListMachines(ctx, "ams1"); len(list) != 1 {
		t.Errorf("ams1 lists %d", len(list))
	}

	got, err := e.c.SetBootMode(ctx, m.ID, "none")
	if err != nil || got.BootMode != "" {
		t.Errorf("boot none: %+v %v", got, err)
	}
	if _, err := e.c.SetBootMode(ctx, m.ID, "pxe"); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("bad mode: %v", err)
	}
	// A BMC change without a password keeps the password.
	got, err = e.c.SetBMC(ctx, m.ID, apitype.MachineBMCInput{Address: "bmc-1.example.test", Port: 6230, Username: "root"})
	if err != nil || got.BMC.Address != "bmc-1.example.test" || !got.BMC.HasPassword {
		t.Errorf("set bmc: %+v %v", got.BMC, err)
	}
	if got, _ = e.c.ClearBMC(ctx, m.ID); got.BMC != nil {
		t.Errorf("clear bmc: %+v", got.BMC)
	}
	if got, _ = e.c.ApproveMachine(ctx, m.ID); !got.Approved {
		t.Error("approve")
	}
	evs, err := e.c.MachineEvents(ctx, m.ID, 0)
	if err != nil || evs.Machine != m.ID || len(evs.Events) != 5 {
		t.Errorf("events %+v %v", evs, err)
	}
	if got := e.notes.specChanges(); len(got) != 5 { // add ×2, boot, bmc ×2
		t.Errorf("spec changes %v", got)
	}
	if _, err := e.c.DeleteMachine(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.GetMachine(ctx, m.ID); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("after delete: %v", err)
	}
}

func TestSitePolicyAndProxy(t *testing.T) {
	e := start(t, "")
	s, err := e.c.CreateSiteWith(ctx, apitype.SiteCreate{Name: "man1", Approval: "manual"})
	if err != nil || s.Approval != "manual" || s.SpecRevision != 1 {
		t.Errorf("manual site %+v %v", s, err)
	}
	if _, err := e.c.CreateSiteWith(ctx, apitype.SiteCreate{Name: "x1", Approval: "sometimes"}); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("bad approval: %v", err)
	}
	s, err = e.c.SetSiteHTTPProxy(ctx, "man1", &protocol.HTTPProxySection{Listen: "10.20.0.2:3128", Allow: []string{"images.example.test:443", "10.9.9.9:80", "images.example.test:443"}})
	if err != nil || s.HTTPProxy == nil || len(s.HTTPProxy.Allow) != 2 || s.SpecRevision != 2 {
		t.Errorf("set proxy %+v %v", s, err)
	}
	for name, p := range map[string]protocol.HTTPProxySection{
		"listen by name": {Listen: "proxy.example.test:3128"},
		"no port":        {Listen: "10.20.0.2"},
		"bad allow":      {Listen: "10.20.0.2:3128", Allow: []string{"http://x:1"}},
	} {
		if _, err := e.c.SetSiteHTTPProxy(ctx, "man1", &p); client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := e.c.SetSiteHTTPProxy(ctx, "nope", &protocol.HTTPProxySection{Listen: "10.20.0.2:3128"}); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("missing site: %v", err)
	}
	if s, _ = e.c.SetSiteHTTPProxy(ctx, "man1", nil); s.HTTPProxy != nil {
		t.Error("clear proxy")
	}
	if got := e.notes.specChanges(); len(got) != 2 || got[0] != "man1" {
		t.Errorf("spec changes %v", got)
	}
}

// connect admits a node and opens a session for it, as the gateway would.
func connect(t *testing.T, st store.Store, n store.Node) {
	t.Helper()
	now := time.Now()
	n.SPIFFEID, n.CertSerial, n.CertNotAfter, n.State = "spiffe://x/"+n.Role+"/"+n.ID, "1", now.Add(time.Hour), "ready"
	if err := st.Admit(ctx, store.Admission{Node: n, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.OpenSession(ctx, store.Session{NodeID: n.ID, Role: n.Role, ConnectedAt: now}); err != nil {
		t.Fatal(err)
	}
}

func TestMachineBMCCommands(t *testing.T) {
	e := start(t, "")
	m, _ := e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{cptest.MAC},
		BMC: &apitype.MachineBMCInput{Address: "10.0.0.5", Username: "admin"}})
	bare, _ := e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{"52:54:00:00:00:09"}})

	if _, err := e.c.Power(ctx, m.ID, "cycle"); client.Code(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "no site agent") {
		t.Errorf("no site agent: %v", err)
	}
	// A site agent that is offline does not do.
	if err := e.st.Admit(ctx, store.Admission{Node: store.Node{ID: "n_offline", Role: "site", Site: cptest.Site, SPIFFEID: "x", CertSerial: "1",
		CertNotAfter: time.Now().Add(time.Hour), State: "ready"}, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Power(ctx, m.ID, "cycle"); client.Code(err) != protocol.CodeUnavailable || !strings.Contains(err.Error(), "connected") {
		t.Errorf("offline site agent: %v", err)
	}
	connect(t, e.st, store.Node{ID: "n_site", Role: "site", Site: cptest.Site})
	connect(t, e.st, store.Node{ID: "n_other_site", Role: "site", Site: "ams1"})

	c, err := e.c.Power(ctx, m.ID, "cycle")
	if err != nil {
		t.Fatal(err)
	}
	var p protocol.BMCPowerParams
	json.Unmarshal(c.Params, &p)
	if c.NodeID != "n_site" || c.Kind != protocol.KindBMCPower || c.MachineID != m.ID || p != (protocol.BMCPowerParams{Machine: m.ID, Action: "cycle"}) {
		t.Errorf("power command %+v", c)
	}
	c, err = e.c.Bootdev(ctx, "52:54:00:12:34:56", apitype.MachineBootdev{Device: "pxe", EFI: true})
	var b protocol.BMCBootdevParams
	json.Unmarshal(c.Params, &b)
	if err != nil || c.NodeID != "n_site" || b != (protocol.BMCBootdevParams{Machine: m.ID, Device: "pxe", EFI: true}) {
		t.Errorf("bootdev %+v %v", c, err)
	}
	for name, call := range map[string]func() error{
		"bad action": func() error { _, err := e.c.Power(ctx, m.ID, "explode"); return err },
		"bad device": func() error { _, err := e.c.Bootdev(ctx, m.ID, apitype.MachineBootdev{Device: "usb"}); return err },
		"no bmc":     func() error { _, err := e.c.Power(ctx, bare.ID, "on"); return err },
	} {
		if err := call(); client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v", name, err)
		}
	}
	e.notes.mu.Lock()
	if len(e.notes.notified) != 2 || e.notes.notified[0] != "n_site" {
		t.Errorf("notified %v", e.notes.notified)
	}
	e.notes.mu.Unlock()
	evs, _ := e.c.MachineEvents(ctx, m.ID, 0)
	if n := len(evs.Events); n != 3 || evs.Events[1].Kind != protocol.MachineEventCommand || evs.Events[1].CommandID == "" {
		t.Errorf("timeline %+v", evs.Events)
	}
	// Inventory goes to the ramdisk, which the machine has not got.
	if _, err := e.c.Inventory(ctx, m.ID); client.Code(err) != protocol.CodeUnavailable {
		t.Errorf("inventory without a ramdisk: %v", err)
	}
}

// TestDeploy: POST /deploy starts a deployment the lifecycle runs (here
// only started: no controller loop), refuses a second one while it runs,
// and POST /cancel ends it.
func TestDeploy(t *testing.T) {
	b := cptest.NewBundle(t)
	e := startWith(t, "", func(s *api.Server) {
		s.Lifecycle = &lifecycle.Controller{Store: s.Store.(store.Store), Notifier: s.Notifier, Install: &machines.Install{GatewayURL: "https://gw.example.test:8444",
			GatewayServerName: "gw.internal.test", Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK}}
	})
	m := cptest.NewMachine(t, e.st, func(m *store.Machine) { m.BootOverride = "" })
	in := apitype.DeployCreate{Image: protocol.DeployImage{URL: "https://user:secret@images.example.test/ubuntu.raw.zst?sig=abc", SHA256: strings.Repeat("ab", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}, Target: protocol.DeployTarget{Serial: "S123"}, Cmdline: "console=ttyS0"}

	for name, bad := range map[string]func(*apitype.DeployCreate){
		"bad sha256":     func(d *apitype.DeployCreate) { d.Image.SHA256 = "nothex" },
		"after poweroff": func(d *apitype.DeployCreate) { d.After = protocol.AfterPowerOff },
		"bad pool":       func(d *apitype.DeployCreate) { d.Pool = "Pool A" },
		"no image size":  func(d *apitype.DeployCreate) { d.Image.ImageSize = 0 },
	} {
		x := in
		bad(&x)
		if _, err := e.c.Deploy(ctx, m.ID, x); client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
	}
	if got, _ := e.c.GetMachine(ctx, m.ID); got.State != store.MachineRegistered || got.Deployment != "" {
		t.Errorf("refused deploys changed the machine: %+v", got)
	}

	// No ramdisk and no BMC: PXE-boot by hand, boot entry ramdisk.
	out, err := e.c.Deploy(ctx, m.ID, in)
	if err != nil {
		t.Fatal(err)
	}
	if out.Machine.State != store.MachinePXEBooting || out.Machine.BootMode != protocol.BootRamdisk || out.Machine.Deployment != out.Deployment.ID ||
		!strings.HasPrefix(out.Deployment.ID, "dep_") || out.Deployment.Step != lifecycle.StepWaitJoin || out.Deployment.Spec.Pool != "default" ||
		out.Deployment.Spec.After != protocol.AfterKexec || !strings.Contains(out.Machine.StateReason, "no BMC") {
		t.Errorf("deploy %+v\n%+v", out.Machine, out.Deployment)
	}
	if got := e.notes.specChanges(); len(got) == 0 || got[len(got)-1] != cptest.Site {
		t.Errorf("the boot entry change was not pushed: %v", got)
	}
	raw, _ := json.Marshal(out)
	got, _ := e.c.GetMachine(ctx, m.ID)
	raw2, _ := json.Marshal(got)
	evs, _ := e.c.MachineEvents(ctx, m.ID, 0)
	raw3, _ := json.Marshal(evs)
	for _, r := range []string{string(raw), string(raw2), string(raw3)} {
		if strings.Contains(r, "secret") || strings.Contains(r, "sig=abc") {
			t.Errorf("the image URL's credentials show: %s", r)
		}
	}
	if got.CurrentDeployment == nil || got.CurrentDeployment.ID != out.Deployment.ID || got.CurrentDeployment.Spec.Image.URL != "https://images.example.test/ubuntu.raw.zst" {
		t.Errorf("machine's deployment %+v", got.CurrentDeployment)
	}
	if _, err := e.c.Deploy(ctx, m.ID, in); client.Code(err) != protocol.CodeAlreadyExists || !strings.Contains(err.Error(), "machines cancel") {
		t.Errorf("a second deploy: %v", err)
	}
	c, err := e.c.CancelDeploy(ctx, m.ID)
	if err != nil || c.State != store.MachineFailed || c.StateReason != "cancelled by operator" || c.CurrentDeployment.Outcome != lifecycle.OutcomeCancelled {
		t.Fatalf("cancel: %+v %v", c, err)
	}
	if _, err := e.c.CancelDeploy(ctx, m.ID); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("cancel again: %v", err)
	}

	// A connected ramdisk: straight to ramdisk, which is asked for its
	// inventory.
	e.st.Admit(ctx, store.Admission{Node: store.Node{ID: "n_rd3", Role: "ramdisk", Site: cptest.Site, SPIFFEID: "x", CertSerial: "3",
		CertNotAfter: time.Now().Add(time.Hour), State: "ready"}, Machine: m.ID, Now: time.Now()})
	e.st.OpenSession(ctx, store.Session{NodeID: "n_rd3", Role: "ramdisk", ConnectedAt: time.Now()})
	out, err = e.c.Deploy(ctx, m.ID, in)
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := e.st.GetCommand(ctx, out.Deployment.CommandID)
	if out.Machine.State != store.MachineRamdisk || err != nil || cmd.Kind != protocol.KindInventory || cmd.NodeID != "n_rd3" {
		t.Errorf("deploy with a ramdisk: %+v %+v %v", out.Machine, cmd, err)
	}
	if n := e.notes.notifiedNodes(); len(n) == 0 || n[len(n)-1] != "n_rd3" {
		t.Errorf("the ramdisk's session was not told: %v", n)
	}
}

func TestDeployNeedsTheLifecycle(t *testing.T) {
	e := start(t, "")
	m := cptest.NewMachine(t, e.st, nil)
	if _, err := e.c.Deploy(ctx, m.ID, apitype.DeployCreate{}); client.Code(err) != protocol.CodeUnsupported {
		t.Errorf("deploy without a lifecycle: %v", err)
	}
	if _, err := e.c.CancelDeploy(ctx, m.ID); client.Code(err) != protocol.CodeUnsupported {
		t.Errorf("cancel without a lifecycle: %v", err)
	}
}

func TestFirmware(t *testing.T) {
	e := start(t, "")
	m, err := e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{"52:54:00:aa:00:09"}, Firmware: "uefi"})
	if err != nil || m.Firmware != store.FirmwareUEFI {
		t.Fatalf("create uefi: %+v %v", m, err)
	}
	if m, err = e.c.SetFirmware(ctx, m.ID, "bios"); err != nil || m.Firmware != store.FirmwareBIOS {
		t.Errorf("set bios: %+v %v", m, err)
	}
	if _, err = e.c.SetFirmware(ctx, m.ID, "coreboot"); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("coreboot: %v", err)
	}
	if _, err = e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{"52:54:00:aa:00:0a"}, Firmware: "efi"}); client.Code(err) != protocol.CodeInvalidInput {
		t.Errorf("create efi: %v", err)
	}
	if m, err = e.c.CreateMachine(ctx, apitype.MachineCreate{Site: cptest.Site, MACs: []string{"52:54:00:aa:00:0b"}}); err != nil || m.Firmware != store.FirmwareBIOS {
		t.Errorf("default firmware: %+v %v", m, err)
	}
}
