package api_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/better-compute/bcd/controlplane/api"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// TestImageCatalog: POST /images adds an entry (checked as a deploy's
// image is; a name taken is ALREADY_EXISTS), GET lists and shows it with
// its URL redacted, DELETE removes it; a deploy by image_name is the same
// deployment as a deploy that gave the image, and a deploy that gives both
// is refused naming the conflict.
func TestImageCatalog(t *testing.T) {
	b := cptest.NewBundle(t)
	e := startWith(t, "", func(s *api.Server) {
		s.Lifecycle = &lifecycle.Controller{Store: s.Store.(store.Store), Notifier: s.Notifier, Install: &machines.Install{GatewayURL: "https://gw.example.test:8444",
			GatewayServerName: "gw.internal.test", Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK}}
	})
	img := protocol.DeployImage{URL: "https://user:secret@images.example.test/ubuntu.raw.zst?sig=abc", SHA256: strings.Repeat("AB", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}
	for name, bad := range map[string]func(*apitype.ImageCreate){
		"bad name":      func(in *apitype.ImageCreate) { in.Name = "Ubuntu 24" },
		"ftp url":       func(in *apitype.ImageCreate) { in.URL = "ftp://images.example.test/x" },
		"short sha256":  func(in *apitype.ImageCreate) { in.SHA256 = "abcd" },
		"no size":       func(in *apitype.ImageCreate) { in.Size = 0 },
		"no format":     func(in *apitype.ImageCreate) { in.Format = "" },
		"bad format":    func(in *apitype.ImageCreate) { in.Format = "vmdk" },
		"no image size": func(in *apitype.ImageCreate) { in.ImageSize = 0 },
	} {
		in := apitype.ImageCreate{Name: "ubuntu-24.04", DeployImage: img}
		bad(&in)
		if _, err := e.c.AddImage(ctx, in); client.Code(err) != protocol.CodeInvalidInput {
			t.Errorf("%s: %v, want INVALID_INPUT", name, err)
		}
	}
	if ims, err := e.c.ListImages(ctx); err != nil || len(ims) != 0 {
		t.Fatalf("refused adds stored %+v (%v)", ims, err)
	}
	got, err := e.c.AddImage(ctx, apitype.ImageCreate{Name: "ubuntu-24.04", DeployImage: img})
	if err != nil || got.Name != "ubuntu-24.04" || got.URL != "https://images.example.test/ubuntu.raw.zst" ||
		got.SHA256 != strings.Repeat("ab", 32) || got.Size != 1<<30 || got.Format != protocol.FormatZstd || got.ImageSize != 4<<30 || got.CreatedAt.IsZero() {
		t.Fatalf("add: %+v %v", got, err)
	}
	if _, err := e.c.AddImage(ctx, apitype.ImageCreate{Name: "ubuntu-24.04", DeployImage: img}); client.Code(err) != protocol.CodeAlreadyExists ||
		!strings.Contains(err.Error(), "ubuntu-24.04") {
		t.Errorf("add a name taken: %v, want ALREADY_EXISTS naming it", err)
	}
	if _, err := e.c.AddImage(ctx, apitype.ImageCreate{Name: "alma-9", DeployImage: protocol.DeployImage{URL: "https://images.example.test/alma.raw",
		SHA256: strings.Repeat("cd", 32), Size: 4096, Format: protocol.FormatRaw}}); err != nil {
		t.Fatal(err)
	}
	list, err := e.c.ListImages(ctx)
	if err != nil || len(list) != 2 || list[0].Name != "alma-9" || list[1].Name != "ubuntu-24.04" {
		t.Fatalf("list: %+v %v", list, err)
	}
	show, err := e.c.GetImage(ctx, "ubuntu-24.04")
	if err != nil || show != got {
		t.Errorf("show: %+v %v, want %+v", show, err, got)
	}
	raw, _ := json.Marshal([]any{got, list, show})
	if strings.Contains(string(raw), "secret") || strings.Contains(string(raw), "sig=abc") {
		t.Errorf("the catalog shows the URL's credentials: %s", raw)
	}
	// The store holds the URL whole: it is what the ramdisk fetches.
	if st, err := e.st.GetImage(ctx, "ubuntu-24.04"); err != nil || st.Image.URL != img.URL {
		t.Errorf("stored %+v %v", st, err)
	}
	if _, err := e.c.GetImage(ctx, "nope"); client.Code(err) != protocol.CodeNotFound || !strings.Contains(err.Error(), "images list") {
		t.Errorf("show an unknown name: %v", err)
	}

	// By URL and by name: the same deployment.
	byURL := cptest.NewMachine(t, e.st, func(m *store.Machine) { m.BootOverride = "" })
	byName := cptest.NewMachine(t, e.st, func(m *store.Machine) {
		m.BootOverride, m.Name, m.MACs = "", "byname", []string{"52:54:00:00:00:99"}
	})
	rest := apitype.DeployCreate{Target: protocol.DeployTarget{Serial: "S123"}, Cmdline: "console=ttyS0", Pool: "gpu"}
	withURL := rest
	withURL.Image = img
	withName := rest
	withName.ImageName = "ubuntu-24.04"
	both := withURL
	both.ImageName = "ubuntu-24.04"
	if _, err := e.c.Deploy(ctx, byName.ID, both); client.Code(err) != protocol.CodeInvalidInput ||
		!strings.Contains(err.Error(), "give image_name or image, not both") {
		t.Errorf("a deploy with image_name and image: %v", err)
	}
	missing := withName
	missing.ImageName = "debian-13"
	if _, err := e.c.Deploy(ctx, byName.ID, missing); client.Code(err) != protocol.CodeNotFound || !strings.Contains(err.Error(), "debian-13") {
		t.Errorf("a deploy of an image not in the catalog: %v", err)
	}
	if m, _ := e.c.GetMachine(ctx, byName.ID); m.Deployment != "" {
		t.Fatalf("refused deploys started %s", m.Deployment)
	}
	a, err := e.c.Deploy(ctx, byURL.ID, withURL)
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.c.Deploy(ctx, byName.ID, withName)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Deployment.Spec, n.Deployment.Spec) || n.Deployment.Spec.Image.URL != "https://images.example.test/ubuntu.raw.zst" ||
		a.Deployment.Step != n.Deployment.Step || a.Machine.State != n.Machine.State {
		t.Errorf("by URL %+v\nby name %+v", a.Deployment, n.Deployment)
	}
	da, err := e.st.GetDeployment(ctx, a.Deployment.ID)
	if err != nil {
		t.Fatal(err)
	}
	dn, err := e.st.GetDeployment(ctx, n.Deployment.ID)
	if err != nil || !reflect.DeepEqual(dn.Spec, da.Spec) || dn.Spec.Image.URL != img.URL {
		t.Errorf("stored specs: by URL %+v, by name %+v (%v)", da.Spec, dn.Spec, err)
	}

	// A delete is always safe: the running deployment has its copy.
	if del, err := e.c.DeleteImage(ctx, "ubuntu-24.04"); err != nil || del.Name != "ubuntu-24.04" || strings.Contains(del.URL, "secret") {
		t.Fatalf("delete: %+v %v", del, err)
	}
	if _, err := e.c.DeleteImage(ctx, "ubuntu-24.04"); client.Code(err) != protocol.CodeNotFound {
		t.Errorf("delete again: %v", err)
	}
	if d, err := e.st.GetDeployment(ctx, n.Deployment.ID); err != nil || !reflect.DeepEqual(d.Spec, dn.Spec) {
		t.Errorf("the deployment after the delete: %+v %v", d.Spec, err)
	}
	if list, _ := e.c.ListImages(ctx); len(list) != 1 || list[0].Name != "alma-9" {
		t.Errorf("list after the delete: %+v", list)
	}
}
