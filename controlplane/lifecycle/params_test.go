package lifecycle

import (
	"strings"
	"testing"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// TestDeployParams: an attempt's deploy.image carries the spec and the four
// files the installed OS joins with, 0600 root, the configuration one bcd
// loads.
func TestDeployParams(t *testing.T) {
	b := cptest.NewBundle(t)
	c := &Controller{Install: &machines.Install{GatewayURL: "https://gw.example.test:8444", GatewayServerName: "gw.internal.test",
		Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK}}
	spec := store.DeploySpec{Image: protocol.DeployImage{URL: "https://images.example.test/ubuntu.raw.zst", SHA256: strings.Repeat("ab", 32),
		Size: 1 << 30, Format: protocol.FormatZstd, ImageSize: 4 << 30}, Target: protocol.DeployTarget{Serial: "S123"},
		After: protocol.AfterKexec, Cmdline: "console=ttyS0", Pool: "default"}
	p, err := c.deployParams(store.Machine{ID: "m_1", Site: cptest.Site}, spec, "bcjt_secret", "n_installed", "")
	if err != nil {
		t.Fatal(err)
	}
	if p.After.Action != protocol.AfterKexec || p.After.Cmdline != "console=ttyS0" || p.Target.Serial != "S123" || p.Image != spec.Image {
		t.Errorf("params %+v", p)
	}
	files := map[string]protocol.DeployFile{}
	for _, f := range p.Files {
		if f.Mode != 0o600 || f.UID != 0 || f.GID != 0 || f.FS != protocol.FSRoot {
			t.Errorf("%s: fs %s mode %o uid %d gid %d", f.Path, f.FS, f.Mode, f.UID, f.GID)
		}
		files[f.Path] = f
	}
	if len(files) != 4 {
		t.Fatalf("files %v", files)
	}
	cfg, err := config.Parse(files[machines.InstallConfigPath].Content, config.ParseOptions{})
	if err != nil || cfg.GatewayURL != "https://gw.example.test:8444" || cfg.GatewayServerName != "gw.internal.test" || cfg.Site != cptest.Site ||
		cfg.ServingCASPKIPin != b.Public.ServingCASPKIPin || cfg.JoinSigningKeyPin != b.Public.JoinSigningKeyPin ||
		cfg.JoinEncryptionKeyPin != b.Public.JoinEncryptionKeyPin {
		t.Errorf("config.toml %+v %v", cfg, err)
	}
	if string(files[machines.InstallTokenPath].Content) != "bcjt_secret\n" || string(files[machines.InstallNodeIDPath].Content) != "n_installed\n" {
		t.Errorf("token %q node id %q", files[machines.InstallTokenPath].Content, files[machines.InstallNodeIDPath].Content)
	}
	if strings.TrimSpace(string(files[machines.InstallJWKPath].Content)) != string(b.Public.JoinEncryptionJWK) {
		t.Errorf("jwk %q", files[machines.InstallJWKPath].Content)
	}
}

func TestDeploySummary(t *testing.T) {
	msg, data := deploySummary(protocol.DeployImageResult{Target: protocol.DeployTarget{Path: "/dev/vda"}, ImageSize: 2 << 30, Size: 1 << 30, DurationMS: 40000, After: "kexec"})
	if msg != "wrote 2.0 GiB to /dev/vda in 40.0 s (53.7 MB/s); after: kexec" || data["mb_per_s"] != 53.7 {
		t.Errorf("%q %v", msg, data)
	}
}
