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

// TestDeployParamsNodeAgentAndSeed: a deployment with a release carries the
// binary for the ramdisk's architecture as node_agent, and its seed as the
// NoCloud files; a release without that architecture is refused by name.
func TestDeployParamsNodeAgentAndSeed(t *testing.T) {
	b := cptest.NewBundle(t)
	c := &Controller{Install: &machines.Install{GatewayURL: "https://gw.example.test:8444", GatewayServerName: "gw.internal.test",
		Pins: b.Public.Pins(), EncryptionJWK: b.Public.JoinEncryptionJWK}}
	key := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGJ0ZXN0a2V5MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1u op@example"
	spec := store.DeploySpec{Image: protocol.DeployImage{URL: "https://images.example.test/debian.qcow2", SHA256: strings.Repeat("ab", 32),
		Size: 1 << 30, Format: protocol.FormatQCOW2}, After: protocol.AfterKexec, Pool: "default", BCDVersion: "1.2.3",
		NodeAgent: []store.NodeAgentBinary{
			{Arch: "amd64", URL: "https://cp.example.test/downloads/bcd/1.2.3/linux-amd64", SHA256: strings.Repeat("11", 32), Size: 10},
			{Arch: "arm64", URL: "https://cp.example.test/downloads/bcd/1.2.3/linux-arm64", SHA256: strings.Repeat("22", 32), Size: 11}},
		Seed: protocol.DeploySeed{Hostname: "node-1", SSHAuthorizedKeys: []string{key}}}
	p, err := c.deployParams(store.Machine{ID: "m_1", Site: cptest.Site}, spec, "bcjt_secret", "n_installed", "arm64")
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeAgent == nil || *p.NodeAgent != (protocol.DeployNodeAgent{Version: "1.2.3", URL: "https://cp.example.test/downloads/bcd/1.2.3/linux-arm64",
		SHA256: strings.Repeat("22", 32), Size: 11}) {
		t.Errorf("node_agent %+v", p.NodeAgent)
	}
	files := map[string]string{}
	for _, f := range p.Files {
		files[f.Path] = string(f.Content)
	}
	wantMD := "instance-id: \"n_installed\"\nlocal-hostname: \"node-1\"\npublic-keys:\n  - \"" + key + "\"\n"
	if files[protocol.NoCloudSeedDir+"/meta-data"] != wantMD || files[protocol.NoCloudSeedDir+"/user-data"] != "#cloud-config\n" {
		t.Errorf("seed files %q", files)
	}
	if _, ok := files[protocol.NoCloudSeedDir+"/network-config"]; ok {
		t.Error("network-config written though none was given")
	}
	spec.NodeAgent = spec.NodeAgent[:1]
	if _, err := c.deployParams(store.Machine{ID: "m_1", Site: cptest.Site}, spec, "bcjt_secret", "n_installed", "arm64"); err == nil ||
		!strings.Contains(err.Error(), "release 1.2.3 has no bcd for linux/arm64") {
		t.Errorf("release without the ramdisk's arch: %v", err)
	}
	// Without a release: no node agent, as today.
	spec.BCDVersion, spec.NodeAgent, spec.Seed = "", nil, protocol.DeploySeed{}
	if p, err := c.deployParams(store.Machine{ID: "m_1", Site: cptest.Site}, spec, "bcjt_secret", "n_installed", "amd64"); err != nil || p.NodeAgent != nil || len(p.Files) != 4 {
		t.Errorf("no release: %+v %v", p.NodeAgent, err)
	}
}

// TestDeploySummaryWarnings: a deploy's warnings are in the deploy.done
// event's message and data, where machines show finds them.
func TestDeploySummaryWarnings(t *testing.T) {
	w := "cloud-init was not found in the image: no /usr/bin/cloud-init"
	msg, data := deploySummary(protocol.DeployImageResult{Target: protocol.DeployTarget{Path: "/dev/vda"}, ImageSize: 1 << 20, After: "kexec", Warnings: []string{w}})
	if !strings.HasSuffix(msg, "; note: "+w) || len(data["warnings"].([]string)) != 1 {
		t.Errorf("%q %v", msg, data)
	}
}
