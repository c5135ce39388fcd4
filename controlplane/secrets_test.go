package controlplane

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// secretImageURL is a presigned image URL with userinfo: everything after
// the path is a credential.
const (
	secretUserinfo  = "imguser:imgpass-7f3a"
	secretSignature = "5ec7e7516a7e0f00ba4c0ffee5ec7e75"
	secretImageURL  = "https://" + secretUserinfo + "@images.example.test/os.raw?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=" + secretSignature
	redactedURL     = "https://images.example.test/os.raw"
	secretBMC       = "bmc-pw-9d1c"
)

// deployedRamdisk runs the flow of TestMachineFlow up to a deploy.image
// delivered to the ramdisk: a machine with a BMC password, deployed from
// secretImageURL. It returns the command as the ramdisk got it.
func deployedRamdisk(t *testing.T, s *Server, op *client.Client) (apitype.MachineInfo, protocol.Command) {
	t.Helper()
	return deployedRamdiskWith(t, s, op, apitype.DeployCreate{Image: protocol.DeployImage{URL: secretImageURL, SHA256: strings.Repeat("0", 64), Size: 4096}})
}

// deployedRamdiskWith is deployedRamdisk with the deploy in.
func deployedRamdiskWith(t *testing.T, s *Server, op *client.Client, in apitype.DeployCreate) (apitype.MachineInfo, protocol.Command) {
	t.Helper()
	b := s.Bundle()
	roots := b.Public.ServingCAPool()
	gw := s.AdvertisedGatewayURL()
	hc := cptest.HTTPClient(roots, nil)
	if _, err := op.CreateSite(ctx, "fsn1"); err != nil {
		t.Fatal(err)
	}
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
	pw := secretBMC
	m, err := op.CreateMachine(ctx, apitype.MachineCreate{Site: "fsn1", Name: "r1u1", MACs: []string{cptest.MAC}, BootMode: protocol.BootRamdisk,
		BMC: &apitype.MachineBMCInput{Address: "10.0.0.5", Username: "root", Password: &pw}})
	if err != nil {
		t.Fatal(err)
	}
	// The site agent still gets the password in its spec.
	var spec protocol.Spec
	site.Expect(protocol.FrameSpec, &spec)
	if !strings.Contains(string(spec.Sections[protocol.SectionBMCHosts]), secretBMC) {
		t.Fatalf("the site's bmc_hosts lack the password: %s", spec.Sections[protocol.SectionBMCHosts])
	}
	now := time.Now()
	nonce := "bm9uY2Utbm9uY2Utbm9uY2U"
	minted, _ := json.Marshal(protocol.BootNonce{MAC: cptest.MAC, Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)})
	site.Send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventBootNonce, Time: now, Data: minted})
	site.Expect(protocol.FrameAck, nil)
	rd := cptest.NewAgent(t)
	req := rd.DiscoveryRequest(nonce, cptest.MAC)
	req.Site = "fsn1"
	req.Witness = cptest.SignWitness(sa.Key, siteRes.NodeID, nonce, pki.CSRSHA256(rd.CSRDER), cptest.MAC, nil)
	jr, er = cptest.PostJoin(t, hc, gw, req)
	if er != nil {
		t.Fatalf("ramdisk join: %+v", er)
	}
	rdRes := rd.Verify(t, b, jr)
	ramdisk := rd.Dial(t, gw, roots, rdRes)
	waitMachine(t, op, m.ID, func(m apitype.MachineInfo) bool { return m.RamdiskNode == rdRes.NodeID && m.RamdiskConnected })

	if _, err := op.Deploy(ctx, m.ID, in); err != nil {
		t.Fatal(err)
	}
	var c protocol.Command
	ramdisk.Expect(protocol.FrameCommand, &c)
	ramdisk.Send(protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: c.ID, State: protocol.StateSucceeded,
		Result: json.RawMessage(`{"hostname":"ramdisk"}`), Time: time.Now()})
	ramdisk.Expect(protocol.FrameAck, nil)
	ramdisk.Expect(protocol.FrameCommand, &c)
	if c.Kind != protocol.KindDeployImage {
		t.Fatalf("ramdisk got %s, want %s", c.Kind, protocol.KindDeployImage)
	}
	got, err := op.GetMachine(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got, c
}

// joinToken is the join token in a deploy.image's params, and the file's
// content as the params' JSON holds it (base64).
func joinToken(t *testing.T, c protocol.Command) (token, stored string) {
	t.Helper()
	var p protocol.DeployImageParams
	if err := json.Unmarshal(c.Params, &p); err != nil {
		t.Fatal(err)
	}
	for _, f := range p.Files {
		if f.Path == "/etc/bcd/join-token" {
			return strings.TrimSpace(string(f.Content)), base64.StdEncoding.EncodeToString(f.Content)
		}
	}
	t.Fatalf("deploy.image has no join token: %s", c.Params)
	return "", ""
}

// TestSecretsAtRest: after a machine with a BMC password is deployed from a
// presigned URL with userinfo, the database file and its WAL hold neither
// the password, nor the deploy's join token, nor the URL's credentials,
// while the ramdisk was delivered all of them.
func TestSecretsAtRest(t *testing.T) {
	pkiDir, data := newPKI(t), filepath.Join(t.TempDir(), "data")
	s, out := startServer(t, pkiDir, data, nil)
	op := operator(t, s, out)
	_, c := deployedRamdisk(t, s, op)

	// The agent gets the real token and URL.
	token, token64 := joinToken(t, c)
	var p protocol.DeployImageParams
	json.Unmarshal(c.Params, &p)
	if !strings.HasPrefix(token, "bcjt_") || p.Image.URL != secretImageURL {
		t.Fatalf("the ramdisk got token %q and url %q, want the unsealed ones", token, p.Image.URL)
	}
	secrets := map[string]string{"bmc password": secretBMC, "join token": token, "join token (base64)": token64, "image userinfo": secretUserinfo,
		"image signature": secretSignature}

	check := func(when string) {
		t.Helper()
		ents, err := os.ReadDir(data)
		if err != nil {
			t.Fatal(err)
		}
		read := 0
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join(data, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			read += len(b)
			for what, v := range secrets {
				if bytes.Contains(b, []byte(v)) {
					t.Errorf("%s: %s holds the %s in the clear", when, e.Name(), what)
				}
			}
		}
		if read == 0 {
			t.Fatalf("%s: read nothing in %s", when, data)
		}
	}
	check("while serve runs")
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	check("after shutdown")
}

// TestCatalogImageAtRest: an image catalog entry from a presigned URL with
// userinfo is sealed in the database file and its WAL, shown without its
// credentials by the api, and a deploy by its name delivers the whole URL
// to the ramdisk, as a deploy that gave it does.
func TestCatalogImageAtRest(t *testing.T) {
	pkiDir, data := newPKI(t), filepath.Join(t.TempDir(), "data")
	s, out := startServer(t, pkiDir, data, nil)
	op := operator(t, s, out)
	im, err := op.AddImage(ctx, apitype.ImageCreate{Name: "os", DeployImage: protocol.DeployImage{URL: secretImageURL,
		SHA256: strings.Repeat("0", 64), Size: 4096, Format: protocol.FormatRaw}})
	if err != nil || im.URL != redactedURL {
		t.Fatalf("images add: %+v %v", im, err)
	}
	list, err := op.ListImages(ctx)
	if err != nil || len(list) != 1 || list[0].URL != redactedURL {
		t.Fatalf("images list: %+v %v", list, err)
	}
	if got, err := op.GetImage(ctx, "os"); err != nil || got.URL != redactedURL {
		t.Fatalf("images show: %+v %v", got, err)
	}
	_, c := deployedRamdiskWith(t, s, op, apitype.DeployCreate{ImageName: "os"})
	var p protocol.DeployImageParams
	json.Unmarshal(c.Params, &p)
	if p.Image.URL != secretImageURL || p.Image.Format != protocol.FormatRaw || p.Image.Size != 4096 {
		t.Fatalf("the ramdisk got image %+v, want the catalog entry's, unsealed", p.Image)
	}
	ents, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(data, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		read += len(b)
		for what, v := range map[string]string{"image userinfo": secretUserinfo, "image signature": secretSignature} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds the catalog %s in the clear", e.Name(), what)
			}
		}
	}
	if read == 0 {
		t.Fatalf("read nothing in %s", data)
	}
}

// TestCommandsGetRedactsLikeMachinesShow: commands get shows the deploy's
// image URL as machines show does, without userinfo or the presigned query,
// and no file content.
func TestCommandsGetRedactsLikeMachinesShow(t *testing.T) {
	s, out := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	op := operator(t, s, out)
	m, c := deployedRamdisk(t, s, op)
	token, token64 := joinToken(t, c)
	if m.CurrentDeployment == nil || m.CurrentDeployment.Spec.Image.URL != redactedURL {
		t.Fatalf("machines show: %+v", m.CurrentDeployment)
	}
	got, err := op.GetCommand(ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	var p protocol.DeployImageParams
	if err := json.Unmarshal(got.Params, &p); err != nil {
		t.Fatal(err)
	}
	if p.Image.URL != m.CurrentDeployment.Spec.Image.URL {
		t.Errorf("commands get shows image url %q, machines show %q", p.Image.URL, m.CurrentDeployment.Spec.Image.URL)
	}
	for _, v := range []string{secretUserinfo, secretSignature, "X-Amz", token, token64} {
		if strings.Contains(string(got.Params), v) {
			t.Errorf("commands get shows %q: %s", v, got.Params)
		}
	}
}

// TestServeSealsAnOlderDatabase: plaintext left in the database by a build
// before sealing is sealed at the next start, and still reads back.
func TestServeSealsAnOlderDatabase(t *testing.T) {
	pkiDir, data := newPKI(t), filepath.Join(t.TempDir(), "data")
	s, out := startServer(t, pkiDir, data, nil)
	op := operator(t, s, out)
	m, c := deployedRamdisk(t, s, op)
	_, token64 := joinToken(t, c)
	if _, err := op.AddImage(ctx, apitype.ImageCreate{Name: "os", DeployImage: protocol.DeployImage{URL: secretImageURL,
		SHA256: strings.Repeat("0", 64), Size: 4096, Format: protocol.FormatRaw}}); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	// Put the plaintext back, as an older serve stored it.
	k, err := pki.OpenKeyring(filepath.Join(pkiDir, pki.SecretsKeyFile), false)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	unseal := func(f store.SecretField, v string) (string, error) {
		switch f {
		case store.SecretCommandParams:
			var sv string
			if json.Unmarshal([]byte(v), &sv) != nil {
				return v, nil
			}
			return k.Open(string(f), sv)
		case store.SecretDeploySpec:
			var spec store.DeploySpec
			json.Unmarshal([]byte(v), &spec)
			if _, ok := pki.Sealed(spec.Image.URL); ok {
				u, err := k.Open("image url", spec.Image.URL)
				if err != nil {
					return "", err
				}
				spec.Image.URL = u
			}
			b, err := json.Marshal(spec)
			return string(b), err
		case store.SecretImageURL:
			if _, ok := pki.Sealed(v); !ok {
				return v, nil
			}
			return k.Open("image url", v)
		}
		return k.Open(string(f), v)
	}
	n, err := st.(store.SecretRewriter).RewriteSecrets(ctx, unseal)
	st.Close()
	if err != nil || n != 4 {
		t.Fatalf("unsealed %d values (%v), want 4: a password, a deploy.image, its deployment and a catalog image", n, err)
	}
	if b, _ := os.ReadFile(filepath.Join(data, sqlite.DBFile)); !bytes.Contains(b, []byte(secretBMC)) {
		wal, _ := os.ReadFile(filepath.Join(data, sqlite.DBFile+"-wal"))
		if !bytes.Contains(wal, []byte(secretBMC)) {
			t.Fatal("the test's plaintext database has no password")
		}
	}

	s, _ = startServer(t, pkiDir, data, nil)
	got, err := s.Store().GetMachine(ctx, m.ID)
	if err != nil || got.BMC == nil || got.BMC.Password != secretBMC {
		t.Fatalf("machine after the reseal: %+v %v", got.BMC, err)
	}
	cmd, err := s.Store().GetCommand(ctx, c.ID)
	if err != nil || !strings.Contains(string(cmd.Params), token64) {
		t.Fatalf("command after the reseal: %v", err)
	}
	if im, err := s.Store().GetImage(ctx, "os"); err != nil || im.Image.URL != secretImageURL {
		t.Fatalf("catalog image after the reseal: %+v %v", im, err)
	}
	if err := s.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{sqlite.DBFile, sqlite.DBFile + "-wal"} {
		b, _ := os.ReadFile(filepath.Join(data, name))
		for _, v := range []string{secretBMC, token64, secretSignature, secretUserinfo} {
			if bytes.Contains(b, []byte(v)) {
				t.Errorf("%s holds %q after the restart", name, v)
			}
		}
	}
}
