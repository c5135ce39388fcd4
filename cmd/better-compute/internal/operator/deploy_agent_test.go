package operator

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/protocol"
)

// sshKeyLine is an ssh-ed25519 public key line in OpenSSH's format.
func sshKeyLine(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	var blob []byte
	for _, part := range [][]byte{[]byte("ssh-ed25519"), pub} {
		blob = binary.BigEndian.AppendUint32(blob, uint32(len(part)))
		blob = append(blob, part...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(blob) + " op@example"
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDeployNodeAgentAndSeed: machines deploy --bcd-version names an added
// release, whose binaries the deployment keeps; an unknown version, a bad
// host name or key file is refused with a message that names it; the seed's
// flags reach the deployment.
func TestDeployNodeAgentAndSeed(t *testing.T) {
	k, pin := releaseKey(t)
	s, _ := controlPlaneWith(t, func(s *controlplane.Server) { s.ReleasePins = []string{pin} })
	if code, _, errOut := runCLI(t, "", "releases", "add", manifestFile(t, k, "1.2.3", 2, time.Now().Add(time.Hour))); code != 0 {
		t.Fatalf("releases add: %d %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "", "sites", "create", "fsn1"); code != 0 {
		t.Fatalf("sites create: %d %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, "", "machines", "add", "--site", "fsn1", "--name", "m1", "--mac", "52:54:00:00:02:01"); code != 0 {
		t.Fatalf("machines add: %d %s", code, errOut)
	}
	key := sshKeyLine(t)
	keys := writeFile(t, "keys", "# operator keys\n"+key+"\n\n")
	userData := writeFile(t, "user-data", "#cloud-config\npackages: [htop]\n")
	netCfg := writeFile(t, "network-config", "version: 2\nethernets: {}\n")
	img := []string{"machines", "deploy", "m1", "--url", "https://images.example.test/debian.qcow2", "--sha256", strings.Repeat("cd", 32),
		"--size", "4096", "--format", "qcow2"}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown version", []string{"--bcd-version", "9.9.9"}, 1, "release 9.9.9 is not added"},
		{"bad version", []string{"--bcd-version", "../x"}, 2, "bcd_version \"../x\""},
		{"bad hostname", []string{"--hostname", "node_1"}, 2, "--hostname"},
		{"hostname label too long", []string{"--hostname", strings.Repeat("a", 64)}, 2, "RFC 1123"},
		{"bad key", []string{"--ssh-authorized-keys", writeFile(t, "bad", "ssh-ed25519 AAAAnotakey\n")}, 2, "--ssh-authorized-keys"},
		{"no key", []string{"--ssh-authorized-keys", writeFile(t, "empty", "# none\n")}, 2, "no SSH public key"},
		{"key of another type", []string{"--ssh-authorized-keys", writeFile(t, "wrong", strings.Replace(key, "ssh-ed25519", "ssh-rsa", 1)+"\n")}, 2, "does not name type ssh-rsa"},
		{"big user-data", []string{"--user-data", writeFile(t, "big", strings.Repeat("x", 70<<10))}, 2, "--user-data"},
		{"missing user-data", []string{"--user-data", "/nonexistent/ud"}, 2, "--user-data /nonexistent/ud"},
	} {
		if code, _, errOut := runCLI(t, "", append(img, c.args...)...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %d %s, want %d %q", c.name, code, errOut, c.code, c.want)
		}
	}
	code, out, errOut := runCLI(t, "", append(img, "--bcd-version", "1.2.3", "--hostname", "node-1.fsn1", "--ssh-authorized-keys", keys,
		"--user-data", userData, "--network-config", netCfg)...)
	if code != 0 {
		t.Fatalf("machines deploy: %d %s", code, errOut)
	}
	d, err := s.Store().GetDeployment(context.Background(), strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	sp := d.Spec
	if sp.BCDVersion != "1.2.3" || len(sp.NodeAgent) != 1 || sp.NodeAgent[0].Arch != "amd64" || sp.NodeAgent[0].SHA256 != strings.Repeat("ab", 32) ||
		sp.NodeAgent[0].URL != s.APIURL()+"/downloads/bcd/1.2.3/linux-amd64" {
		t.Errorf("node agent in the deployment: %q %+v", sp.BCDVersion, sp.NodeAgent)
	}
	if sp.Seed.Hostname != "node-1.fsn1" || len(sp.Seed.SSHAuthorizedKeys) != 1 || sp.Seed.SSHAuthorizedKeys[0] != key ||
		sp.Seed.UserData != "#cloud-config\npackages: [htop]\n" || sp.Seed.NetworkConfig != "version: 2\nethernets: {}\n" {
		t.Errorf("seed in the deployment: %+v", sp.Seed)
	}

	// The note a deploy into an image without cloud-init reports is what
	// machines show says.
	note := "cloud-init was not found in the image: no /usr/bin/cloud-init"
	data, _ := json.Marshal(map[string]any{"warnings": []string{note}})
	if _, err := s.Store().AdvanceDeployment(context.Background(), d, store.DeploymentChange{At: time.Now(),
		Events: []store.MachineEvent{{MachineID: d.MachineID, Time: time.Now(), Kind: protocol.MachineEventDeployDone, Message: "deploy.image wrote", Data: data}}}); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := runCLI(t, "", "machines", "show", "m1"); code != 0 || !regexp.MustCompile(`(?m)^NOTE:\s+`+regexp.QuoteMeta(note)+`$`).MatchString(out) {
		t.Errorf("machines show: %d\n%s", code, out)
	}
}

// TestDeployDefaultBCDVersion: serve --deploy-bcd-version is the release a
// deploy without --bcd-version installs.
func TestDeployDefaultBCDVersion(t *testing.T) {
	k, pin := releaseKey(t)
	s, _ := controlPlaneWith(t, func(s *controlplane.Server) { s.ReleasePins, s.DeployBCDVersion = []string{pin}, "1.2.3" })
	runCLI(t, "", "releases", "add", manifestFile(t, k, "1.2.3", 2, time.Now().Add(time.Hour)))
	runCLI(t, "", "sites", "create", "fsn1")
	runCLI(t, "", "machines", "add", "--site", "fsn1", "--name", "m1", "--mac", "52:54:00:00:02:01")
	code, out, errOut := runCLI(t, "", "machines", "deploy", "m1", "--url", "https://images.example.test/debian.raw", "--sha256", strings.Repeat("cd", 32), "--size", "4096")
	if code != 0 {
		t.Fatalf("machines deploy: %d %s", code, errOut)
	}
	d, err := s.Store().GetDeployment(context.Background(), strings.TrimSpace(out))
	if err != nil || d.Spec.BCDVersion != "1.2.3" || len(d.Spec.NodeAgent) != 1 {
		t.Errorf("deployment %+v (%v), want the default release", d.Spec, err)
	}
}
