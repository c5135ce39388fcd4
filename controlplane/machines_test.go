package controlplane

import (
	"crypto/sha256"
	"encoding/json"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// TestMachineFlow runs the control plane's half of the main flow over its
// real listeners: a site agent's session gets the machine's boot entry and
// BMC, reports the boot and its nonce; the ramdisk joins with the nonce;
// BMC and deploy commands reach the agents; the installed OS joins and
// becomes the machine's node.
func TestMachineFlow(t *testing.T) {
	s, out := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	op := operator(t, s, out)
	b := s.Bundle()
	roots := b.Public.ServingCAPool()
	gw := s.AdvertisedGatewayURL()
	hc := cptest.HTTPClient(roots, nil)
	if _, err := op.CreateSite(ctx, "fsn1"); err != nil {
		t.Fatal(err)
	}

	// The site agent joins and opens its session: an empty boot table.
	tok, err := op.CreateToken(ctx, apitype.TokenCreate{Pool: "sites", Site: "fsn1", Role: protocol.RoleSite})
	if err != nil {
		t.Fatal(err)
	}
	sa := cptest.NewAgent(t)
	jr, er := cptest.PostJoin(t, hc, gw, sa.Request(t, b, protocol.RoleSite, tok.Token, nil))
	if er != nil {
		t.Fatalf("site join: %+v", er)
	}
	siteRes := sa.Verify(t, b, jr)
	site := sa.Dial(t, gw, roots, siteRes)
	if raw := site.Welcome.Spec.Sections[protocol.SectionBoot]; string(raw) != `{"entries":[]}` {
		t.Errorf("welcome boot section %s", raw)
	}
	rev := site.Welcome.Spec.Revision

	// Adding the machine pushes its boot entry and BMC.
	pw := "calvin"
	m, err := op.CreateMachine(ctx, apitype.MachineCreate{Site: "fsn1", Name: "r1u1", MACs: []string{cptest.MAC}, BootMode: protocol.BootRamdisk,
		BMC: &apitype.MachineBMCInput{Address: "10.0.0.5", Username: "root", Password: &pw}})
	if err != nil {
		t.Fatal(err)
	}
	var spec protocol.Spec
	site.Expect(protocol.FrameSpec, &spec)
	var boot protocol.BootSection
	var bmcs protocol.BMCHostsSection
	json.Unmarshal(spec.Sections[protocol.SectionBoot], &boot)
	json.Unmarshal(spec.Sections[protocol.SectionBMCHosts], &bmcs)
	if spec.Revision <= rev || len(boot.Entries) != 1 || boot.Entries[0].MAC != cptest.MAC || len(bmcs.Hosts) != 1 || bmcs.Hosts[0].Password != pw {
		t.Fatalf("pushed spec %d: boot %+v bmc %+v", spec.Revision, boot, bmcs)
	}
	if _, err := op.SetSiteHTTPProxy(ctx, "fsn1", &protocol.HTTPProxySection{Listen: "10.20.0.2:3128"}); err != nil {
		t.Fatal(err)
	}
	site.Expect(protocol.FrameSpec, &spec)
	var proxy protocol.HTTPProxySection
	json.Unmarshal(spec.Sections[protocol.SectionHTTPProxy], &proxy)
	u, _ := url.Parse(gw)
	if proxy.Listen != "10.20.0.2:3128" || len(proxy.Allow) != 1 || proxy.Allow[0] != u.Host {
		t.Errorf("http_proxy %+v, want the gateway %s allowed", proxy, u.Host)
	}

	// The site serves the machine its script and mints a nonce.
	now := time.Now()
	booted, _ := json.Marshal(protocol.MachineBooted{MAC: cptest.MAC, Stage: protocol.StageScript, Time: now})
	site.Send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventMachineBooted, Time: now, Data: booted})
	site.Expect(protocol.FrameAck, nil)
	nonce := "bm9uY2Utbm9uY2Utbm9uY2U"
	minted, _ := json.Marshal(protocol.BootNonce{MAC: cptest.MAC, Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)})
	site.Send(protocol.FrameEvent, protocol.Event{Seq: 2, Kind: protocol.EventBootNonce, Time: now, Data: minted})
	site.Expect(protocol.FrameAck, nil)

	// The ramdisk joins with it, once.
	rd := cptest.NewAgent(t)
	req := rd.DiscoveryRequest(nonce, cptest.MAC)
	req.Site = "fsn1"
	req.Witness = cptest.SignWitness(sa.Key, siteRes.NodeID, nonce, pki.CSRSHA256(rd.CSRDER), cptest.MAC, nil)
	jr, er = cptest.PostJoin(t, hc, gw, req)
	if er != nil {
		t.Fatalf("ramdisk join: %+v", er)
	}
	rdRes := rd.Verify(t, b, jr)
	if _, er := cptest.PostJoin(t, hc, gw, cptest.NewAgent(t).DiscoveryRequest(nonce, cptest.MAC)); er == nil || er.Code != protocol.CodeNonceUsed {
		t.Errorf("replayed nonce: %+v", er)
	}
	ramdisk := rd.Dial(t, gw, roots, rdRes)
	// The lifecycle adopts the join's binding into the machine's status.
	waitMachine(t, op, "r1u1", func(m apitype.MachineInfo) bool { return m.RamdiskNode == rdRes.NodeID })
	got, err := op.GetMachine(ctx, "r1u1")
	if err != nil || got.RamdiskNode != rdRes.NodeID || got.LastBootStage != protocol.StageScript || len(got.Inventory) == 0 {
		t.Fatalf("machine after the ramdisk's join: %+v %v", got, err)
	}
	for deadline := time.Now().Add(5 * time.Second); !got.RamdiskConnected && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		got, _ = op.GetMachine(ctx, m.ID)
	}
	if !got.RamdiskConnected {
		t.Error("the ramdisk's session is not seen")
	}

	// bmc.power reaches the site agent, whose answer the operator reads.
	cmd, err := op.Power(ctx, m.ID, protocol.PowerStatus)
	if err != nil {
		t.Fatal(err)
	}
	var c protocol.Command
	site.Expect(protocol.FrameCommand, &c)
	var pp protocol.BMCPowerParams
	json.Unmarshal(c.Params, &pp)
	if c.ID != cmd.ID || c.Kind != protocol.KindBMCPower || pp.Machine != m.ID || pp.Action != protocol.PowerStatus {
		t.Errorf("site got %+v", c)
	}
	result, _ := json.Marshal(protocol.BMCPowerResult{Machine: m.ID, Action: protocol.PowerStatus, Power: protocol.PowerStateOn})
	site.Send(protocol.FrameStatus, protocol.Status{Seq: 3, CommandID: c.ID, State: protocol.StateSucceeded, Result: result, Time: time.Now()})
	done, err := op.WaitCommand(ctx, cmd.ID, 20*time.Millisecond)
	if err != nil || done.State != protocol.StateSucceeded || !strings.Contains(string(done.Result), `"power":"on"`) {
		t.Errorf("power status: %+v %v", done, err)
	}

	// A deploy with the ramdisk connected starts at ramdisk: the inventory,
	// then deploy.image with the installed OS's files.
	dep, err := op.Deploy(ctx, m.ID, apitype.DeployCreate{Image: protocol.DeployImage{URL: "https://images.example.test/os.raw", SHA256: strings.Repeat("0", 64), Size: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if dep.Machine.State != store.MachineRamdisk || dep.Deployment.Step != "inventory" {
		t.Fatalf("deploy started %s %+v", dep.Machine.State, dep.Deployment)
	}
	ramdisk.Expect(protocol.FrameCommand, &c)
	if c.Kind != protocol.KindInventory {
		t.Fatalf("ramdisk got %+v first, want inventory", c)
	}
	ramdisk.Send(protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: c.ID, State: protocol.StateSucceeded,
		Result: json.RawMessage(`{"hostname":"ramdisk","cpus":8}`), Time: time.Now()})
	ramdisk.Expect(protocol.FrameAck, nil)
	ramdisk.Expect(protocol.FrameCommand, &c)
	var p protocol.DeployImageParams
	if err := json.Unmarshal(c.Params, &p); err != nil || c.Kind != protocol.KindDeployImage {
		t.Fatalf("ramdisk got %+v %v", c, err)
	}
	files := map[string]string{}
	for _, f := range p.Files {
		files[f.Path] = string(f.Content)
	}
	secret := strings.TrimSpace(files["/etc/bcd/join-token"])
	nodeID := strings.TrimSpace(files["/etc/bcd/node-id"])
	if got, _ := op.GetMachine(ctx, m.ID); got.CurrentDeployment == nil || nodeID != got.CurrentDeployment.NodeID || !strings.HasPrefix(secret, "bcjt_") || !strings.Contains(files["/etc/bcd/config.toml"], `site = "fsn1"`) ||
		!strings.Contains(files["/etc/bcd/config.toml"], `gateway_url = "`+gw+`"`) {
		t.Fatalf("files %v", files)
	}
	ramdisk.Send(protocol.FrameStatus, protocol.Status{Seq: 2, CommandID: c.ID, State: protocol.StateRunning,
		Progress: &protocol.Progress{Done: 2048, Total: 4096, Unit: "bytes"}, Time: time.Now()})
	ramdisk.Expect(protocol.FrameAck, nil)
	ramdisk.Send(protocol.FrameStatus, protocol.Status{Seq: 3, CommandID: c.ID, State: protocol.StateSucceeded,
		Result: json.RawMessage(`{"disk":"/dev/vda","bytes_written":4096,"bytes_received":4096,"sha256":"00","duration_ms":1,"after":"kexec"}`), Time: time.Now()})
	ramdisk.Expect(protocol.FrameAck, nil)
	ramdisk.Close()
	waitMachine(t, op, m.ID, func(m apitype.MachineInfo) bool { return m.State == store.MachineInstalling })

	// The installed OS joins with what the deploy wrote and becomes the
	// machine's node; the ramdisk node is retired.
	osAgent := cptest.NewAgent(t)
	jr, er = cptest.PostJoin(t, hc, gw, osAgent.Request(t, b, protocol.RoleNode, secret, func(r *protocol.JoinRequest) {
		r.Attestor = protocol.AttestorProvisioned
		r.NodeID = nodeID
		r.Site = "fsn1"
	}))
	if er != nil {
		t.Fatalf("installed OS's join: %+v", er)
	}
	if res := osAgent.Verify(t, b, jr); res.NodeID != nodeID || res.Pool != apitype.DefaultPool {
		t.Errorf("installed OS joined as %+v", res)
	}
	// The join records the binding; the lifecycle adopts it into the
	// machine's status a moment later.
	waitMachine(t, op, m.ID, func(m apitype.MachineInfo) bool { return m.Node == nodeID && m.RamdiskNode == "" })
	ms, err := op.ListMachines(ctx, "")
	if err != nil || len(ms) != 1 || ms[0].Node != nodeID || ms[0].RamdiskNode != "" {
		t.Fatalf("machines %+v %v", ms, err)
	}
	if n, _ := op.GetNode(ctx, rdRes.NodeID); n.DeletedAt.IsZero() {
		t.Error("the ramdisk node was not retired")
	}

	evs, err := op.MachineEvents(ctx, m.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs.Events {
		kinds = append(kinds, e.Kind)
		if strings.Contains(e.Message+string(e.Data), nonce) || strings.Contains(e.Message+string(e.Data), secret) {
			t.Errorf("the timeline shows a secret: %+v", e)
		}
	}
	want := "machine.added,machine.booted,boot.nonce,join,join.refused,command,command.status," +
		"state,command,command.status,state,command,command.status,command.status,state,deploy.done,join"
	if strings.Join(kinds, ",") != want {
		t.Errorf("timeline\n%s\nwant\n%s", strings.Join(kinds, ","), want)
	}
}

// TestManualApprovalOverHTTP: in a site that approves manually, the
// ramdisk's join waits (retry_after_s) until machines approve, then the
// same CSR gets in.
func TestManualApprovalOverHTTP(t *testing.T) {
	s, out := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	op := operator(t, s, out)
	if _, err := op.CreateSiteWith(ctx, apitype.SiteCreate{Name: "fsn1", Approval: "manual"}); err != nil {
		t.Fatal(err)
	}
	m, err := op.CreateMachine(ctx, apitype.MachineCreate{Site: "fsn1", MACs: []string{cptest.MAC}, BootMode: protocol.BootRamdisk})
	if err != nil {
		t.Fatal(err)
	}
	nonce := "YXBwcm92ZS1hcHByb3ZlLWFw"
	now := time.Now()
	rec := nonceRecord(nonce, "fsn1", now)
	rec.SiteNode = cptest.EnsureSiteNode(t, s.Store(), "fsn1")
	if _, err := s.Store().AddBootNonce(ctx, rec); err != nil {
		t.Fatal(err)
	}
	hc := cptest.HTTPClient(s.Bundle().Public.ServingCAPool(), nil)
	rd := cptest.NewAgent(t)
	rdReq := rd.DiscoveryRequest(nonce, cptest.MAC)
	rdReq.Witness = cptest.SignWitness(cptest.SiteKey(), rec.SiteNode, nonce, pki.CSRSHA256(rd.CSRDER), cptest.MAC, nil)
	jr, er := cptest.PostJoin(t, hc, s.AdvertisedGatewayURL(), rdReq)
	if er != nil || jr.Signed != "" || jr.RetryAfterS != 5 {
		t.Fatalf("before approval: %+v %+v", jr, er)
	}
	if _, err := op.ApproveMachine(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	jr, er = cptest.PostJoin(t, hc, s.AdvertisedGatewayURL(), rdReq)
	if er != nil || jr.Signed == "" {
		t.Fatalf("after approval: %+v %+v", jr, er)
	}
	if res := rd.Verify(t, s.Bundle(), jr); res.Role != protocol.RoleRamdisk || res.Site != "fsn1" {
		t.Errorf("result %+v", res)
	}
}

// waitMachine polls the machine until ok says so, failing the test after 20 s.
func waitMachine(t testing.TB, op *client.Client, id string, ok func(apitype.MachineInfo) bool) apitype.MachineInfo {
	t.Helper()
	var m apitype.MachineInfo
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, err = op.GetMachine(ctx, id); err == nil && ok(m) {
			return m
		}
	}
	t.Fatalf("machine %s: %s (%s), %v", id, m.State, m.StateReason, err)
	return m
}

func nonceRecord(nonce, site string, now time.Time) store.BootNonce {
	return store.BootNonce{Hash: sha256.Sum256([]byte(nonce)), MAC: cptest.MAC, Site: site, SiteNode: "n_site",
		CreatedAt: now, ExpiresAt: now.Add(protocol.BootNonceLifetime)}
}
