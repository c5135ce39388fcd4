package deploy

import (
	"context"
	"crypto/x509"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/bcd/agent/units"
	"github.com/better-compute/bcd/protocol"
)

// TestDeployNodeAgent: a deploy with a node agent writes the binary, both units
// (bcd.service byte for byte the install script's) and the enable symlinks
// into the root, e2fsck-clean; a NoCloud seed into a root without cloud-init
// succeeds with the note.
func TestDeployNodeAgent(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	agent := randBytes(7, 3<<20)
	asrv := serve(t, agent, serveOK, false)
	target := filepath.Join(t.TempDir(), "disk.img")
	p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
	p.NodeAgent = &NodeAgent{Version: "1.2.3", URL: asrv.URL + "/downloads/bcd/1.2.3/linux-amd64", SHA256: sha(agent), Size: int64(len(agent))}
	p.Files = append(deployFiles(), File{Path: protocol.NoCloudSeedDir + "/meta-data", Mode: 0o600, Content: []byte("instance-id: \"n_1\"\n")})
	d := testDeployer(&fakeMachine{})
	d.TempDir = t.TempDir()
	res, err := d.Deploy(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	root := newExtAt(t, target, img.rootStart)
	if got := root.cat(NodeAgentBinaryPath); got != string(agent) {
		t.Errorf("%s: %d bytes, want the release's %d", NodeAgentBinaryPath, len(got), len(agent))
	}
	for _, f := range []struct {
		path, mode, content string
	}{
		{NodeAgentBinaryPath, "0755", ""},
		{NodeAgentUnitPath, "0644", units.BCDUnit},
		{NodeAgentJoinPath, "0644", JoinUnit},
	} {
		if typ, mode, uid, gid := root.stat(f.path); typ != "regular" || mode != f.mode || uid != "0" || gid != "0" {
			t.Errorf("%s: %s %s %s:%s, want regular %s 0:0", f.path, typ, mode, uid, gid, f.mode)
		}
		if f.content != "" && root.cat(f.path) != f.content {
			t.Errorf("%s: %q, want %q", f.path, root.cat(f.path), f.content)
		}
	}
	if !strings.Contains(JoinUnit, "bcd join --token-file /etc/bcd/join-token --node-id \"$(cat /etc/bcd/node-id)\"") ||
		!strings.Contains(JoinUnit, "Before=bcd.service") || !strings.Contains(JoinUnit, "ConditionPathExists=/etc/bcd/join-token") {
		t.Errorf("join unit does not run the provisioned join before bcd.service, once:\n%s", JoinUnit)
	}
	for name, dest := range map[string]string{"bcd.service": NodeAgentUnitPath, "bcd-join.service": NodeAgentJoinPath} {
		l := "/etc/systemd/system/multi-user.target.wants/" + name
		if typ, _, _, _ := root.stat(l); typ != "symlink" {
			t.Errorf("%s: %s, want a symlink", l, typ)
		}
		out := run(t, "debugfs", "-R", "stat "+l, root.spec)
		if !strings.Contains(out, `Fast link dest: "`+dest+`"`) {
			t.Errorf("%s: stat %s, want a link to %s", l, out, dest)
		}
	}
	root.fsck()
	note := ""
	for _, w := range res.Warnings {
		if strings.HasPrefix(w, "cloud-init was not found in the image: ") {
			note = w
		}
	}
	if note == "" {
		t.Errorf("warnings %q: no cloud-init note for a seed in an image without %s", res.Warnings, CloudInitPath)
	}

	// Deployed again over the same disk: the links and files are replaced.
	if _, err := d.Deploy(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	newExtAt(t, target, img.rootStart).fsck()
}

// TestDeployNodeAgentMismatch: an agent whose bytes are not the release's fails
// the deploy with the digest reason, and the disk is left unbootable.
func TestDeployNodeAgentMismatch(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	agent := randBytes(8, 1<<20)
	asrv := serve(t, agent, serveOK, false)
	target := filepath.Join(t.TempDir(), "disk.img")
	p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
	want := sha([]byte("another binary"))
	p.NodeAgent = &NodeAgent{Version: "1.2.3", URL: asrv.URL + "/bcd", SHA256: want}
	_, err := testDeployer(&fakeMachine{}).Deploy(context.Background(), p, nil)
	if err == nil || Reason(err) != protocol.DeployReasonDigest || !strings.Contains(err.Error(), "node agent bcd 1.2.3") ||
		!strings.Contains(err.Error(), "expected "+want) {
		t.Fatalf("err %v (reason %s), want a digest mismatch naming the node agent", err, Reason(err))
	}
	unbootable(t, target)
}

// TestDeployNodeAgentPinnedTLS: the control plane serves releases under its
// own CA: a node agent download whose certificate no system root signs fails
// the deploy, and succeeds when NodeAgentTrust accepts the chain.
func TestDeployNodeAgentPinnedTLS(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	agent := randBytes(9, 1<<20)
	asrv := serve(t, agent, serveOK, true)
	p := params(srv.URL, body, protocol.FormatZstd, img.size, filepath.Join(t.TempDir(), "disk.img"))
	p.NodeAgent = &NodeAgent{Version: "1.2.3", URL: asrv.URL + "/bcd", SHA256: sha(agent)}
	d := testDeployer(&fakeMachine{})
	if _, err := d.Deploy(context.Background(), p, nil); err == nil || Reason(err) != protocol.DeployReasonDownload ||
		!strings.Contains(err.Error(), "node agent bcd 1.2.3") {
		t.Fatalf("untrusted certificate: %v (reason %s)", err, Reason(err))
	}
	unbootable(t, p.Target.Path)
	var asked string
	d.NodeAgentTrust = func(chain []*x509.Certificate, serverName string) error {
		asked = serverName
		if !chain[0].Equal(asrv.Certificate()) {
			return errors.New("another certificate")
		}
		return nil
	}
	if _, err := d.Deploy(context.Background(), p, nil); err != nil {
		t.Fatal(err)
	}
	if asked != "127.0.0.1" {
		t.Errorf("NodeAgentTrust asked for %q, want the URL's host", asked)
	}
	if got := newExtAt(t, p.Target.Path, img.rootStart).cat(NodeAgentBinaryPath); got != string(agent) {
		t.Errorf("bcd: %d bytes, want %d", len(got), len(agent))
	}
}
