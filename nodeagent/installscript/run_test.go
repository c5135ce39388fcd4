//go:build linux

package installscript

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/pki"
)

// TestScriptRunsForReal runs generated scripts, as root, in throwaway roots
// built from busybox-static, the real bcd and the host's curl, against a real
// `better-compute serve` on loopback that serves the downloads route and
// joins the node. systemctl, useradd and gpasswd are recording stand-ins.
func TestScriptRunsForReal(t *testing.T) {
	testenv.NeedRoot(t)
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		testenv.Skip(t, "the script installs bcd for amd64 and arm64 only, this is "+runtime.GOARCH)
	}
	h := newHarness(t)

	// --- A first install joins, and the node shows in nodes list.
	root := h.newRoot(t)
	script := h.script(t, "0.1.0", nil)
	out := root.run(t, script, h.token(t), 0)
	lastLine(t, out, "bcd 0.1.0 installed, joined and started.")
	id := root.nodeID(t)
	if list := h.cli(t, "nodes", "list"); !strings.Contains(list, id) {
		t.Fatalf("node %s is not in nodes list:\n%s", id, list)
	}
	root.wantFile(t, "/usr/local/bin/bcd", h.bcd["0.1.0"], 0o755)
	root.wantFile(t, UnitPath, []byte(BCDUnit), 0o644)
	root.wantFile(t, "/etc/bcd/join-encryption.jwk", nil, 0o644)
	root.wantMode(t, "/etc/bcd", 0o700)
	conf := root.wantFile(t, "/etc/bcd/config.toml", nil, 0o600)
	if !strings.HasPrefix(string(conf), "# Written by the better-compute install script. bcd refuses unknown keys.\ngateway_url = \""+h.gatewayURL+"\"\nsite = \"fsn1\"\nserving_ca_spki_pin = ") {
		t.Errorf("config.toml:\n%s", conf)
	}
	root.wantAbsent(t, PluginsDropInPath)
	root.wantAbsent(t, UnprivilegedDropInPath)
	root.wantAbsent(t, UpdateDropInPath)
	root.wantLog(t, "systemctl daemon-reload", "systemctl enable bcd.service", "systemctl restart bcd.service")
	if strings.Contains(root.log(t), "useradd") {
		t.Error("a root node got an account")
	}
	if v := root.exec(t, "/usr/local/bin/bcd", "version"); !strings.Contains(v, "bcd 0.1.0 ") {
		t.Errorf("installed bcd says %q", v)
	}

	// --- A rerun upgrades without a token and keeps every section.
	boot := "\n[boot]\n# by hand\nlisten = \"0.0.0.0:8080\"\nurl = \"http://10.20.0.2:8080\"\nserver_ip = \"10.20.0.2\"\n"
	root.appendFile(t, "/etc/bcd/config.toml", boot+"\n[plugins]\ndir = \"/opt/plugins\"\n")
	root.clearLog(t)
	out = root.run(t, h.script(t, "0.1.1", nil), "", 0)
	lastLine(t, out, "bcd upgraded to 0.1.1 and restarted.")
	root.wantFile(t, "/usr/local/bin/bcd", h.bcd["0.1.1"], 0o755)
	conf = root.wantFile(t, "/etc/bcd/config.toml", nil, 0o600)
	if !strings.Contains(string(conf), boot) {
		t.Errorf("[boot] was not kept verbatim:\n%s", conf)
	}
	root.wantFile(t, PluginsDropInPath, []byte(PluginsDropIn), 0o644)
	root.wantLog(t, "systemctl daemon-reload", "systemctl restart bcd.service")
	if id2 := root.nodeID(t); id2 != id {
		t.Errorf("the upgrade changed the node from %s to %s", id, id2)
	}

	// --- [plugins] privileged adds the four lines; no [plugins] removes the drop-in.
	root.writeFile(t, "/etc/bcd/config.toml", strings.Replace(string(conf), "dir = \"/opt/plugins\"\n", "dir = \"/opt/plugins\"\nprivileged = \"kata\"\n", 1))
	root.run(t, h.script(t, "0.1.1", nil), "", 0)
	root.wantFile(t, PluginsDropInPath, []byte(PluginsDropIn+PrivilegedDropIn), 0o644)
	conf = root.wantFile(t, "/etc/bcd/config.toml", nil, 0o600)
	root.writeFile(t, "/etc/bcd/config.toml", string(conf[:bytes.Index(conf, []byte("[plugins]"))]))
	root.run(t, h.script(t, "0.1.1", nil), "", 0)
	root.wantAbsent(t, PluginsDropInPath)
	conf = root.wantFile(t, "/etc/bcd/config.toml", nil, 0o600)
	if !strings.Contains(string(conf), boot) || strings.Contains(string(conf), "[plugins]") {
		t.Errorf("config.toml after removing [plugins]:\n%s", conf)
	}

	// --- A wrong digest installs nothing: the old binary stays.
	before := root.read(t, "/etc/bcd/config.toml")
	out = root.run(t, h.script(t, "0.1.0", map[string]string{runtime.GOARCH: strings.Repeat("0", 64)}), "", 1)
	if !strings.Contains(out, "nothing was installed") {
		t.Errorf("wrong digest said:\n%s", out)
	}
	root.wantFile(t, "/usr/local/bin/bcd", h.bcd["0.1.1"], 0o755)
	if after := root.read(t, "/etc/bcd/config.toml"); !bytes.Equal(before, after) {
		t.Error("a refused run changed config.toml")
	}

	// --- Plugins from a signed release: installed with a pins line, rerun
	// keeps one line per plugin; bad archives are refused.
	root.mkdir(t, PluginsDir)
	root.writeFile(t, PluginPinsFile, strings.Repeat("f", 64)+"  other-plugin\n")
	good := h.pluginScript(t, root, "0.2.0", map[string]tarMember{"bcx-ipmi": {body: "#!/bin/sh\necho ipmi\n"}, "README.md": {body: "x"}}, false)
	for range 2 {
		out = root.run(t, good, "", 0)
		lastLine(t, out, "bcd upgraded to 0.2.0 and restarted.")
	}
	plugin := root.wantFile(t, PluginsDir+"/bcx-ipmi", []byte("#!/bin/sh\necho ipmi\n"), 0o755)
	root.wantMode(t, PluginsDir, 0o755)
	pins := string(root.wantFile(t, PluginPinsFile, nil, 0o644))
	if want := strings.Repeat("f", 64) + "  other-plugin\n" + sum(plugin) + "  bcx-ipmi\n"; pins != want {
		t.Errorf("pins file:\n%s\nwant:\n%s", pins, want)
	}
	conf = root.wantFile(t, "/etc/bcd/config.toml", nil, 0o600)
	if !strings.Contains(string(conf), "\n[plugins]\ndir = \"/usr/local/lib/bcd/plugins\"\n") ||
		!strings.Contains(string(conf), "\n[update]\nrelease_pins = \""+h.releasePin+"\"\nrelease_threshold = 1\nrelease_sequence = 20\n") {
		t.Errorf("config.toml with plugins from a release:\n%s", conf)
	}
	root.wantFile(t, PluginsDropInPath, []byte(PluginsDropIn), 0o644)
	// [update] came with the signed release: self-update may write outside
	// ProtectSystem=strict.
	root.wantFile(t, UpdateDropInPath, []byte(UpdateDropIn), 0o644)
	for _, bad := range []struct {
		version string
		members map[string]tarMember
		wrong   bool
		says    string
	}{
		{"0.2.1", map[string]tarMember{"bcx-ipmi": {link: "/bin/busybox"}}, false, "link member"},
		{"0.2.2", map[string]tarMember{"bcx-ipmi": {body: "x"}, "../evil": {body: "x"}}, false, "outside it"},
		{"0.2.3", map[string]tarMember{"bcx-ipmi": {body: "tampered"}}, true, "SHA-256"},
		{"0.2.4", map[string]tarMember{"bcx-ipmi": {hardlink: "README"}, "README": {body: "x"}}, false, "link member"},
		{"0.2.5", map[string]tarMember{"/bcx-ipmi": {body: "x"}}, false, "absolute path"},
		{"0.2.6", map[string]tarMember{"ipmi": {body: "x"}}, false, "no member named bcx-ipmi"},
	} {
		out = root.run(t, h.pluginScript(t, root, bad.version, bad.members, bad.wrong), "", 1)
		if !strings.Contains(out, bad.says) || !strings.Contains(out, "nothing was installed") {
			t.Errorf("%s: the script said:\n%s", bad.version, out)
		}
		root.wantFile(t, PluginsDir+"/bcx-ipmi", plugin, 0o755)
		root.wantFile(t, "/usr/local/bin/bcd", h.bcd["0.1.1"], 0o755)
		root.wantAbsent(t, "/evil")
		root.wantAbsent(t, "/usr/local/lib/evil")
	}

	// An [update] of the operator's keeps its pins; release_sequence is
	// added when missing and raised, never lowered.
	bp, err := pki.BootstrapPins(h.pki)
	if err != nil {
		t.Fatal(err)
	}
	conf = root.read(t, "/etc/bcd/config.toml")
	conf = conf[:bytes.Index(conf, []byte("\n[update]\n"))]
	for _, tc := range []struct{ section, want string }{
		{"[update]\nrelease_pins = \"" + bp.ServingCA + "\"\n", "[update]\nrelease_sequence = 20\nrelease_pins = \"" + bp.ServingCA + "\"\n"},
		{"[update]\nrelease_pins = \"" + bp.ServingCA + "\"\nrelease_sequence = 1_5 # old\n", "[update]\nrelease_pins = \"" + bp.ServingCA + "\"\nrelease_sequence = 20\n"},
		{"[update]\nrelease_sequence = 30\n", "[update]\nrelease_pins = \"" + h.releasePin + "\"\nrelease_threshold = 1\nrelease_sequence = 30\n"},
	} {
		root.writeFile(t, "/etc/bcd/config.toml", string(conf)+"\n"+tc.section)
		root.run(t, good, "", 0)
		if got := string(root.read(t, "/etc/bcd/config.toml")); !strings.HasSuffix(got, "\n\n"+tc.want) {
			t.Errorf("[update] %q became:\n%s\nwant it to end in:\n%s", tc.section, got, tc.want)
		}
	}
	root.wantFile(t, UpdateDropInPath, []byte(UpdateDropIn), 0o644)
	// Without [update] the drop-in goes, as plugins.conf does without [plugins].
	root.writeFile(t, "/etc/bcd/config.toml", string(conf))
	root.run(t, h.script(t, "0.1.1", nil), "", 0)
	root.wantAbsent(t, UpdateDropInPath)

	// --- --unprivileged: the account, both units, and /etc/bcd for the node.
	root = h.newRoot(t)
	out = root.run(t, h.script(t, "0.1.0", nil, "--unprivileged", "--instance-bridges", "br0"), h.token(t), 0)
	lastLine(t, out, "bcd 0.1.0 installed, joined and started.")
	if list := h.cli(t, "nodes", "list"); !strings.Contains(list, root.nodeID(t)) {
		t.Errorf("the unprivileged node is not in nodes list:\n%s", list)
	}
	root.wantLog(t, "useradd --system --no-create-home --home-dir /var/lib/bcd --shell /usr/sbin/nologin bcd",
		"systemctl daemon-reload", "systemctl enable bcd-helper.service", "systemctl restart bcd-helper.service",
		"systemctl enable bcd.service", "systemctl restart bcd.service")
	root.wantFile(t, HelperUnitPath, []byte(HelperUnit), 0o644)
	root.wantFile(t, UnprivilegedDropInPath, []byte(UnprivilegedDropIn), 0o644)
	root.wantOwner(t, "/etc/bcd", 0o750, 0, root.gid(t, "bcd"))
	conf = root.wantFile(t, "/etc/bcd/config.toml", nil, 0o640)
	root.wantOwner(t, "/etc/bcd/config.toml", 0o640, 0, root.gid(t, "bcd"))
	if !strings.Contains(string(conf), "\n[helper]\nsocket = \"/run/bcd-helper/helper.sock\"\nuser = \"bcd\"\ninstance_bridges = \"br0\"\n") {
		t.Errorf("config.toml of an unprivileged node:\n%s", conf)
	}
	root.wantOwner(t, "/usr/local/lib/bcd", 0o755, 0, 0)
	for _, p := range []string{"/var/lib/bcd", "/var/lib/bcd/identity.json", "/var/lib/bcd/node.key"} {
		root.wantOwner(t, p, 0, root.uid(t, "bcd"), root.gid(t, "bcd"))
	}
	root.wantAbsent(t, PluginsDropInPath)
	if strings.Contains(root.log(t), "gpasswd") {
		t.Errorf("a first install without tss or libvirt ran gpasswd:\n%s", root.log(t))
	}
	// A rerun keeps helper mode from the configuration and adds no second
	// account; it takes bcd out of tss (an older script's doing) and sets
	// libvirt up for the node; it sets an existing slots directory to 0755.
	root.clearLog(t)
	root.appendFile(t, "/etc/group", "tss:x:120:root,bcd\n")
	if err := os.Chmod(root.path("/usr/local/lib/bcd"), 0o700); err != nil {
		t.Fatal(err)
	}
	root.appendFile(t, "/etc/passwd", "libvirt-qemu:x:64055:120::/var/lib/libvirt:/usr/sbin/nologin\n")
	root.writeFile(t, "/etc/udev/rules.d/60-bcd-tpm.rules", "KERNEL==\"tpmrm0\", GROUP=\"tss\"\n")
	root.writeFile(t, "/etc/libvirt/qemu.conf", "# stock\n#dynamic_ownership = 1\nuser = \"libvirt-qemu\"\n")
	lastLine(t, root.run(t, h.script(t, "0.1.1", nil), "", 0), "bcd upgraded to 0.1.1 and restarted.")
	root.wantFile(t, UnprivilegedDropInPath, []byte(UnprivilegedDropIn), 0o644)
	if strings.Contains(root.log(t), "useradd") {
		t.Error("the rerun created the account again")
	}
	root.wantLog(t, "gpasswd -a libvirt-qemu bcd", "systemctl is-active --quiet virtqemud.service", "gpasswd -d bcd tss",
		"systemctl restart bcd-helper.service", "systemctl restart bcd.service")
	root.wantAbsent(t, "/etc/udev/rules.d/60-bcd-tpm.rules")
	if q := string(root.read(t, "/etc/libvirt/qemu.conf")); q != "# stock\ndynamic_ownership = 0\nuser = \"libvirt-qemu\"\n" {
		t.Errorf("qemu.conf:\n%s", q)
	}
	groups := string(root.read(t, "/etc/group"))
	if !strings.Contains(groups, "\ntss:x:120:root\n") || !strings.Contains(groups, "\nbcd:x:999:libvirt-qemu\n") {
		t.Errorf("after the rerun bcd should have left tss (root staying) and libvirt-qemu joined bcd:\n%s", groups)
	}
	root.wantOwner(t, "/usr/local/lib/bcd", 0o755, 0, 0)
	// Once bcd is out of tss, a rerun leaves tss alone.
	root.clearLog(t)
	lastLine(t, root.run(t, h.script(t, "0.1.1", nil), "", 0), "bcd upgraded to 0.1.1 and restarted.")
	if log := root.log(t); strings.Contains(log, "gpasswd -d") {
		t.Errorf("a rerun with bcd not in tss ran gpasswd -d:\n%s", log)
	}
	if after := string(root.read(t, "/etc/group")); !strings.Contains(after, "\ntss:x:120:root\n") {
		t.Errorf("a rerun with bcd not in tss changed the group file:\n%s", after)
	}
	root.wantAbsent(t, "/etc/udev/rules.d/60-bcd-tpm.rules")
	// Without [helper] the node is root's again: the drop-in goes, the files are root's.
	conf = root.read(t, "/etc/bcd/config.toml")
	root.writeFile(t, "/etc/bcd/config.toml", string(conf[:bytes.Index(conf, []byte("\n[helper]"))+1]))
	root.run(t, h.script(t, "0.1.1", nil), "", 0)
	root.wantAbsent(t, UnprivilegedDropInPath)
	root.wantOwner(t, "/etc/bcd", 0o700, 0, 0)
	root.wantOwner(t, "/etc/bcd/config.toml", 0o600, 0, 0)
}

// harness is the control plane and the binaries the roots install.
type harness struct {
	dir        string
	bin        string // better-compute
	pki        string
	downloads  string
	apiURL     string
	baseURL    string
	gatewayURL string
	opToken    string
	bcd        map[string][]byte // version → binary
	bcdPath    map[string]string
	releaseKey string
	releasePin string
	rootN      int
}

const basePath = "/bc"

func newHarness(t *testing.T) *harness {
	h := &harness{dir: t.TempDir(), bcd: map[string][]byte{}, bcdPath: map[string]string{}}
	h.downloads = filepath.Join(h.dir, "downloads")
	if err := os.Mkdir(h.downloads, 0o755); err != nil {
		t.Fatal(err)
	}
	repo := repoRoot(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	build := func(out, pkg, version string) {
		defer wg.Done()
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-X github.com/better-compute/bcd/internal/version.Version="+version, "-o", out, pkg)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Sprintf("go build %s: %v\n%s", pkg, err, b))
			mu.Unlock()
		}
	}
	h.bin = filepath.Join(h.dir, "better-compute")
	wg.Add(3)
	go build(h.bin, "./cmd/better-compute", "0.1.0")
	for _, v := range []string{"0.1.0", "0.1.1"} {
		h.bcdPath[v] = filepath.Join(h.dir, "bcd-"+v)
		go build(h.bcdPath[v], "./cmd/bcd", v)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(strings.Join(errs, "\n"))
	}
	for v, p := range h.bcdPath {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h.bcd[v] = b
		h.publish(t, pki.BinaryName("bcd", v, "linux", runtime.GOARCH), b)
	}
	h.pki = filepath.Join(h.dir, "pki")
	h.cli(t, "pki", "init", h.pki)
	h.releaseKey = filepath.Join(h.dir, "release.key")
	h.releasePin = strings.TrimSpace(h.cli(t, "release", "keygen", "--out", h.releaseKey))
	h.serve(t)
	h.cli(t, "sites", "create", "fsn1")
	return h
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func (h *harness) publish(t *testing.T, name string, data []byte) {
	if err := os.WriteFile(filepath.Join(h.downloads, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// serve starts better-compute serve on loopback and waits for its
// addresses; the test's cleanup stops it.
func (h *harness) serve(t *testing.T) {
	tokenFile := filepath.Join(h.dir, "operator-token")
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, h.bin, "serve", "--pki", h.pki, "--data", filepath.Join(h.dir, "data"),
		"--listen", "127.0.0.1:0", "--gateway-listen", "127.0.0.1:0", "--downloads-dir", h.downloads,
		"--base-path", basePath, "--operator-token-file", tokenFile, "--log-level", "warn")
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("better-compute serve stderr:\n%s", stderr.String())
		}
	})
	api := regexp.MustCompile(`^api listening on (https://\S+)$`)
	gw := regexp.MustCompile(`^gateway listening on (https://\S+)$`)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(30 * time.Second)
	for h.apiURL == "" || h.gatewayURL == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("better-compute serve ended:\n%s", stderr.String())
			}
			if m := api.FindStringSubmatch(l); m != nil {
				h.apiURL = m[1]
			}
			if m := gw.FindStringSubmatch(l); m != nil {
				h.gatewayURL = m[1]
			}
		case <-deadline:
			t.Fatalf("better-compute serve did not say where it listens:\n%s", stderr.String())
		}
	}
	go func() {
		for range lines {
		}
	}()
	h.baseURL = strings.TrimSuffix(h.apiURL, basePath)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	h.opToken = strings.TrimSpace(string(tok))
}

// cli runs better-compute against the control plane and returns its stdout.
func (h *harness) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(), "BETTER_COMPUTE_TOKEN="+h.opToken, "BETTER_COMPUTE_SERVER="+h.apiURL, "BETTER_COMPUTE_PKI="+h.pki)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("better-compute %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// token creates a single-use node token for pool_test in fsn1.
func (h *harness) token(t *testing.T) string {
	out := h.cli(t, "tokens", "create", "--role", "node", "--pool", "pool_test", "--site", "fsn1")
	tok := regexp.MustCompile(`bcjt_[A-Za-z0-9_-]+`).FindString(out)
	if tok == "" {
		t.Fatalf("tokens create printed no token:\n%s", out)
	}
	return tok
}

// script generates an install script for version with the digests of the
// published binaries (or the given ones) and extra flags.
func (h *harness) script(t *testing.T, version string, digests map[string]string, extra ...string) []byte {
	if digests == nil {
		digests = map[string]string{runtime.GOARCH: sum(h.bcd[version])}
	}
	var spec []string
	for arch, d := range digests {
		spec = append(spec, arch+"="+d)
	}
	args := append([]string{"daemon", "install-script", "--pool", "pool_test", "--site", "fsn1",
		"--gateway-url", h.gatewayURL, "--base-url", h.baseURL + basePath, "--bcd-version", version,
		"--sha256", strings.Join(spec, ","), "--pki", h.pki}, extra...)
	return []byte(h.cli(t, args...))
}

type tarMember struct {
	body     string
	link     string // a symlink to this
	hardlink string // a hard link to this
}

// pluginScript publishes release version (the 0.1.1 bcd and a bcx-ipmi
// archive of members), signs its manifest and returns a script that
// installs both. With wrong, the published archive is not the signed one.
func (h *harness) pluginScript(t *testing.T, r *chroot, version string, members map[string]tarMember, wrong bool) []byte {
	archive := tarGz(t, members)
	bare := pki.BinaryName("bcd", version, "linux", runtime.GOARCH)
	arch := pki.ArchiveName("bcx-ipmi", version, "linux", runtime.GOARCH)
	dist := filepath.Join(h.dir, "dist-"+version)
	if err := os.MkdirAll(dist, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{bare: h.bcd["0.1.1"], arch: archive, "checksums.txt": []byte("x")} {
		if err := os.WriteFile(filepath.Join(dist, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.cli(t, "release", "sign", "--product", "bcd", "--version", version, "--sequence", "20", "--expires", "24h", "--key", h.releaseKey, dist)
	h.publish(t, bare, h.bcd["0.1.1"])
	if wrong {
		archive = tarGz(t, map[string]tarMember{"bcx-ipmi": {body: "not the signed one"}})
	}
	h.publish(t, arch, archive)
	return []byte(h.cli(t, "daemon", "install-script", "--pool", "pool_test", "--site", "fsn1",
		"--gateway-url", h.gatewayURL, "--base-url", h.baseURL+basePath, "--bcd-version", version,
		"--release-manifest", filepath.Join(dist, pki.ManifestFile), "--release-pins", h.releasePin,
		"--install-plugins", "bcx-ipmi", "--pki", h.pki))
}

func tarGz(t *testing.T, members map[string]tarMember) []byte {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	// Hard link targets go first, as tar requires.
	names := make([]string, 0, len(members))
	for n, m := range members {
		if m.hardlink == "" {
			names = append([]string{n}, names...)
		} else {
			names = append(names, n)
		}
	}
	for _, n := range names {
		m := members[n]
		hdr := &tar.Header{Name: n, Mode: 0o755, Size: int64(len(m.body)), Typeflag: tar.TypeReg, ModTime: time.Unix(1e9, 0)}
		switch {
		case m.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, m.link, 0
		case m.hardlink != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, m.hardlink, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Size > 0 {
			if _, err := io.WriteString(tw, m.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// chroot is a throwaway root a script runs in.
type chroot struct{ dir string }

// newRoot builds a root from busybox-static (every applet linked into
// /bin, /sbin, /usr/bin and /usr/sbin), the host's curl with its libraries
// and the serving CA as its CA bundle, device nodes, and the stand-ins.
func (h *harness) newRoot(t *testing.T) *chroot {
	busybox := testenv.NeedTool(t, "busybox")
	curl := testenv.NeedTool(t, "curl")
	ldd := testenv.NeedTool(t, "ldd")
	if f, err := elf.Open(busybox); err != nil {
		t.Fatal(err)
	} else {
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				testenv.Skip(t, busybox+" is dynamically linked; install busybox-static")
			}
		}
		f.Close()
	}
	h.rootN++
	r := &chroot{dir: filepath.Join(h.dir, fmt.Sprintf("root%d", h.rootN))}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc/ssl/certs", "dev", "var/log", "root", "tmp"} {
		r.mkdir(t, "/"+d)
	}
	if err := os.Chmod(filepath.Join(r.dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	r.copyIn(t, busybox, "/bin/busybox")
	if out, err := r.command("/bin/busybox", "--install", "-s").CombinedOutput(); err != nil {
		t.Fatalf("busybox --install: %v\n%s", err, out)
	}
	curlPath, err := filepath.EvalSymlinks(curl)
	if err != nil {
		t.Fatal(err)
	}
	r.copyIn(t, curlPath, "/usr/bin/curl")
	libs, err := exec.Command(ldd, curlPath).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", curlPath, err)
	}
	for _, m := range regexp.MustCompile(`(?m)(?:=>\s*)?(/\S+)\s+\(0x`).FindAllStringSubmatch(string(libs), -1) {
		r.copyIn(t, m[1], m[1])
	}
	ca, err := os.ReadFile(filepath.Join(h.pki, pki.ServingCACertFile))
	if err != nil {
		t.Fatal(err)
	}
	r.writeFile(t, "/etc/ssl/certs/ca-certificates.crt", string(ca))
	r.writeFile(t, "/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n")
	r.writeFile(t, "/etc/group", "root:x:0:\n")
	for _, d := range []struct {
		name         string
		major, minor int
	}{{"null", 1, 3}, {"zero", 1, 5}, {"random", 1, 8}, {"urandom", 1, 9}} {
		if err := syscall.Mknod(filepath.Join(r.dir, "dev", d.name), syscall.S_IFCHR|0o666, d.major<<8|d.minor); err != nil {
			t.Fatal(err)
		}
	}
	record := "#!/bin/sh\necho \"$(basename \"$0\") $*\" >>/var/log/stand-ins.log\n"
	r.writeExec(t, "/usr/bin/systemctl", record+"case $1 in is-active) exit 3 ;; esac\n")
	r.writeExec(t, "/usr/sbin/useradd", record+"for name; do :; done\n"+
		"echo \"$name:x:999:999::/var/lib/bcd:/usr/sbin/nologin\" >>/etc/passwd\necho \"$name:x:999:\" >>/etc/group\n")
	// gpasswd -a/-d USER GROUP edits the group file as the real one does, so
	// a test sees who is a member afterwards, not only that it was called.
	r.writeExec(t, "/usr/sbin/gpasswd", record+`case $1 in -a | -d) ;; *) exit 2 ;; esac
awk -F: -v OFS=: -v op="$1" -v u="$2" -v g="$3" '
$1 == g {
	n = split($4, m, ","); out = ""
	for (i = 1; i <= n; i++) if (m[i] != u && m[i] != "") out = out (out == "" ? "" : ",") m[i]
	if (op == "-a") out = out (out == "" ? "" : ",") u
	$4 = out
}
{ print }' /etc/group >/etc/group.new && mv /etc/group.new /etc/group
`)
	return r
}

func (r *chroot) path(p string) string { return filepath.Join(r.dir, p) }

func (r *chroot) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: r.dir}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	return cmd
}

// run runs script in the root with token on its standard input and wants
// exit code code; it returns stdout and stderr together.
func (r *chroot) run(t *testing.T, script []byte, token string, code int) string {
	t.Helper()
	r.writeFile(t, "/install-bcd.sh", string(script))
	cmd := r.command("/bin/sh", "/install-bcd.sh")
	cmd.Stdin = strings.NewReader(token + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	got := 0
	if ee, ok := err.(*exec.ExitError); ok {
		got = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if got != code {
		t.Fatalf("install-bcd.sh exited %d, want %d:\n%s", got, code, out.String())
	}
	if token != "" && strings.Contains(out.String(), token) {
		t.Error("the script printed the join token")
	}
	return out.String()
}

func (r *chroot) exec(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := r.command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

func (r *chroot) nodeID(t *testing.T) string {
	t.Helper()
	var id struct {
		NodeID string `json:"node_id"`
	}
	if err := json.Unmarshal(r.read(t, "/var/lib/bcd/identity.json"), &id); err != nil || id.NodeID == "" {
		t.Fatalf("identity.json: %v %+v", err, id)
	}
	return id.NodeID
}

func (r *chroot) mkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(r.path(p), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (r *chroot) copyIn(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	r.mkdir(t, filepath.Dir(dst))
	if err := os.WriteFile(r.path(dst), data, 0o755); err != nil {
		t.Fatal(err)
	}
}

func (r *chroot) writeFile(t *testing.T, p, content string) {
	t.Helper()
	r.mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(r.path(p), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (r *chroot) writeExec(t *testing.T, p, content string) {
	t.Helper()
	os.Remove(r.path(p))
	r.writeFile(t, p, content)
	if err := os.Chmod(r.path(p), 0o755); err != nil {
		t.Fatal(err)
	}
}

func (r *chroot) appendFile(t *testing.T, p, content string) {
	t.Helper()
	r.writeFile(t, p, string(r.read(t, p))+content)
}

func (r *chroot) read(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(r.path(p))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantFile checks p's mode and, unless want is nil, its content; it
// returns the content.
func (r *chroot) wantFile(t *testing.T, p string, want []byte, mode os.FileMode) []byte {
	t.Helper()
	fi, err := os.Lstat(r.path(p))
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Errorf("%s is %v, want a regular file %04o", p, fi.Mode(), mode)
	}
	got := r.read(t, p)
	if want != nil && !bytes.Equal(got, want) {
		if len(got) < 4096 && len(want) < 4096 {
			t.Errorf("%s:\n%s\nwant:\n%s", p, got, want)
		} else {
			t.Errorf("%s: %d bytes (sha256 %s), want %d bytes (%s)", p, len(got), sum(got), len(want), sum(want))
		}
	}
	return got
}

func (r *chroot) wantMode(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(r.path(p))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != mode {
		t.Errorf("%s is %04o, want %04o", p, fi.Mode().Perm(), mode)
	}
}

// wantOwner checks uid, gid and, unless mode is 0, the mode.
func (r *chroot) wantOwner(t *testing.T, p string, mode os.FileMode, uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(r.path(p))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || int(st.Gid) != gid || (mode != 0 && fi.Mode().Perm() != mode) {
		t.Errorf("%s is %d:%d %04o, want %d:%d %04o", p, st.Uid, st.Gid, fi.Mode().Perm(), uid, gid, mode)
	}
}

func (r *chroot) wantAbsent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(r.path(p)); err == nil {
		t.Errorf("%s exists", p)
	}
}

func (r *chroot) log(t *testing.T) string {
	b, err := os.ReadFile(r.path("/var/log/stand-ins.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

func (r *chroot) clearLog(t *testing.T) { os.Remove(r.path("/var/log/stand-ins.log")) }

// wantLog wants the stand-ins to have been called with these lines, in
// this order (other calls may come between).
func (r *chroot) wantLog(t *testing.T, lines ...string) {
	t.Helper()
	log := r.log(t)
	rest := "\n" + log
	for _, l := range lines {
		i := strings.Index(rest, "\n"+l+"\n")
		if i < 0 {
			t.Errorf("stand-in log lacks %q (in order):\n%s", l, log)
			return
		}
		rest = rest[i+len(l)+1:]
	}
}

func (r *chroot) id(t *testing.T, file, name string, field int) int {
	t.Helper()
	for _, l := range strings.Split(string(r.read(t, file)), "\n") {
		f := strings.Split(l, ":")
		if len(f) > field && f[0] == name {
			var n int
			if _, err := fmt.Sscan(f[field], &n); err == nil {
				return n
			}
		}
	}
	t.Fatalf("%s has no %s", file, name)
	return -1
}

func (r *chroot) uid(t *testing.T, name string) int { return r.id(t, "/etc/passwd", name, 2) }
func (r *chroot) gid(t *testing.T, name string) int { return r.id(t, "/etc/group", name, 2) }

// lastLine wants out's last line to be want, exactly.
func lastLine(t *testing.T, out, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if got := lines[len(lines)-1]; got != want {
		t.Errorf("last line %q, want %q; output:\n%s", got, want, out)
	}
}
