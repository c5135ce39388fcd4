package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/nodeagent/helper"
	"github.com/better-compute/bcd/pki/tpmattest"
	"github.com/better-compute/bcd/protocol"
)

// nobody is the node user of these tests: [helper] user = "nobody".
const nobody = 65534

// TestHelperUnprivilegedNode runs the unprivileged mode on one host tree
// (spec "Running bcd node unprivileged"): a real serve, a TPM join as root
// with swtpm, then bcd helper as root and bcd node as uid/gid nobody, started
// from the [update] entrypoint. Only the join and the helper are given swtpm
// (BCD_FAKEHW_TPM_TCP); the node signs its mutual TLS through tpm.sign. The
// tree's directories are root's 0755 and config.toml root's 0640 with group
// nobody, as the install script leaves /etc/bcd, and the tree's root is the
// helper's trusted root (BCD_FAKEHW_HELPER_TRUSTED_ROOT), since /tmp is 1777.
//
//  1. the node runs as uid 65534 with no effective capability, and is ready;
//  2. daemon.upgrade (nodes upgrade) to a second signed build: the node
//     stages into data_dir/staging, the helper installs into the root-owned
//     slots_dir and swaps, the node execs, is welcomed and confirms through
//     the helper; slots.json is root's 0644 and update.json root's 0600;
//  3. nodes reboot reaches the helper's reboot (a fakehw helper writes
//     BCD_FAKEHW_HELPER_REBOOT_FILE instead);
//  4. a copy of bcd at another path, as nobody with the same config, is
//     refused by the helper: its identity does not load (HELPER_PEER_REFUSED);
//  5. the certificate renewal (one-minute certificates) makes the next node
//     key in the TPM through the helper, and the session goes on.
func TestHelperUnprivilegedNode(t *testing.T) {
	testenv.NeedRoot(t)
	began := time.Now()
	sw := swtpmtest.Start(t, true)
	tp, err := tpm.OpenTCP(sw.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ek, err := tp.EK()
	tp.Close() // swtpm serves one client at a time: the join's, then the helper's
	if err != nil {
		t.Fatal(err)
	}
	tpmEnv := nodekey.EnvTPMTCP + "=" + sw.Addr()

	key, pin := releaseKey(t)
	downloads := t.TempDir()
	v010 := fakehwVersion(t, "0.1.0", "")
	r011 := signRelease(t, downloads, key, fakehwVersion(t, "0.1.1", ""), "0.1.1", 2)
	// One-minute certificates: the node renews at about 40 s, its next key
	// made in the TPM through tpm.create.
	cp := newControlPlane(t, "--release-pins", pin, "--downloads-dir", downloads, "--cert-lifetime", "1m")
	cp.mustBC("sites", "create", "fsn1")
	cp.mustBC("tpm", "enroll", "--site", "fsn1", "--pool", "tpm-pool", "--ek-sha256", tpmattest.EKSHA256(ek.PKIX))

	// The host tree, laid out as the install script leaves a helper node.
	h := newHost(t, cp, "fsn1")
	root := h.dir
	for _, d := range []string{filepath.Dir(root), root} {
		// t.TempDir's are 0700: nobody could not reach its config.
		chmod(t, d, 0o755)
	}
	var (
		etc      = filepath.Dir(h.config)
		entry    = filepath.Join(root, "usr/local/bin/bcd")
		slots    = filepath.Join(root, "usr/local/lib/bcd")
		sockDir  = filepath.Join(root, "run/bcd-helper")
		socket   = filepath.Join(sockDir, "helper.sock")
		runBcd   = filepath.Join(root, "run/bcd")
		marker   = filepath.Join(t.TempDir(), "reboots")
		tpmPool  = "tpm-pool"
		nodeCred = &syscall.Credential{Uid: nobody, Gid: nobody}
	)
	for _, d := range []string{filepath.Dir(entry), sockDir, runBcd} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// /run/bcd is the node's; /usr/local/lib/bcd the helper makes.
	chown(t, runBcd, nobody, nobody)
	copyFile(t, v010, entry)
	cfg, err := os.ReadFile(h.config)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(cfg), fmt.Sprintf("socket_path = %q", filepath.Join(root, "bcd.sock")), fmt.Sprintf("socket_path = %q", filepath.Join(runBcd, "bcd.sock")), 1)
	text += fmt.Sprintf("\n[helper]\nsocket = %q\nuser = \"nobody\"\n", socket)
	text += fmt.Sprintf("\n[update]\nrelease_pins = %q\nrelease_threshold = 1\nrelease_sequence = 1\nslots_dir = %q\nentrypoint = %q\n", pin, slots, entry)
	if err := os.WriteFile(h.config, []byte(text), 0o640); err != nil {
		t.Fatal(err)
	}
	chown(t, h.config, 0, nobody)
	chmod(t, h.config, 0o640)
	chown(t, etc, 0, nobody)
	chmod(t, etc, 0o750)

	// The join runs as root with the TPM, and hands node.key and
	// identity.json to nobody; the script then gives data_dir to the node.
	if r := run(t, entry, []string{tpmEnv}, "", "join", "--config", h.config, "--attestor", "tpm"); r.code != 0 {
		t.Fatalf("bcd join --attestor tpm: %s\nserve log:\n%s", r, cp.log)
	}
	id := identityNodeID(t, h.data)
	nodeKey, err := os.ReadFile(filepath.Join(h.data, "node.key"))
	if err != nil || !tpm.IsRecord(nodeKey) {
		t.Fatalf("node.key is not a TPM key's record: %v\n%.80s", err, nodeKey)
	}
	for _, f := range []string{"node.key", "identity.json"} {
		if uid, _ := owner(t, filepath.Join(h.data, f)); uid != nobody {
			t.Errorf("the join left %s to uid %d, want the [helper] user's %d", f, uid, nobody)
		}
	}
	chownR(t, h.data, nobody, nobody)

	helperEnv := []string{tpmEnv, helper.EnvTestTrustedRoot + "=" + root, "BCD_FAKEHW_HELPER_REBOOT_FILE=" + marker, "BCD_TEST_UPDATE_DEADLINE=30s"}
	hp := startAgentBin(t, entry, helperEnv, "helper", "--config", h.config)
	waitLog(t, hp, "bcd helper serves", 20*time.Second)
	if fi, err := os.Lstat(socket); err != nil || fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("the helper's socket %s: %v %v, want a 0660 socket", socket, err, fi)
	}
	if _, gid := owner(t, socket); gid != nobody {
		t.Errorf("the helper's socket is group %d, want nobody's %d", gid, nobody)
	}

	// 1. bcd node as nobody, from the entrypoint, without swtpm's address.
	node := startAgentAs(t, nodeCred, entry, []string{"BCD_TEST_UPDATE_DEADLINE=30s"}, "node", "--config", h.config)
	pid := node.cmd.Process.Pid
	logs := func() string {
		return fmt.Sprintf("--- bcd node log:\n%s\n--- bcd helper log:\n%s", node.log, hp.log)
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nserve log:\n%s\n%s", append(args, cp.log, logs())...)
	}
	row := cp.waitNode(id, 60*time.Second, "ready and connected on 0.1.0", func(r nodeRow) bool {
		select {
		case <-node.done:
			fail("bcd node exited: %v", node.cmd.ProcessState)
		default:
		}
		return r.State == protocol.NodeReady && r.Connected && r.DaemonVersion == "0.1.0"
	})
	if row.Pool != tpmPool {
		t.Errorf("node %+v: want pool %s from the EK's enrollment", row, tpmPool)
	}
	st := procStatus(t, pid)
	if !strings.HasPrefix(st["Uid"], "65534\t65534\t65534\t65534") || !strings.HasPrefix(st["Gid"], "65534\t65534\t65534\t65534") {
		t.Errorf("bcd node runs as Uid %q Gid %q, want nobody's 65534 throughout", st["Uid"], st["Gid"])
	}
	if st["CapEff"] != "0000000000000000" {
		t.Errorf("bcd node has CapEff %s, want none", st["CapEff"])
	}
	environ, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if strings.Contains(string(environ), nodekey.EnvTPMTCP) {
		t.Errorf("bcd node was given %s: it must reach the TPM only through the helper", nodekey.EnvTPMTCP)
	}
	noTPMOpen(t, pid)
	if l := node.log.String(); !strings.Contains(l, "bcd node runs unprivileged beside bcd helper") || !strings.Contains(l, socket) {
		t.Errorf("bcd node did not log its mode and the helper's socket:\n%s", l)
	}
	t.Logf("node %s ready as nobody with its TPM key through the helper: %s", id, time.Since(began).Round(time.Millisecond))

	// 2. daemon.upgrade to 0.1.1, delivered through the helper.
	step := time.Now()
	cp.mustBC("releases", "add", r011.manifest)
	cmdID := strings.TrimSpace(cp.mustBC("nodes", "upgrade", id, "--version", "0.1.1"))
	cp.waitNode(id, 60*time.Second, "connected on 0.1.1", func(r nodeRow) bool { return r.Connected && r.DaemonVersion == "0.1.1" })
	waitCommand(t, cp, cmdID, protocol.StateSucceeded, 30*time.Second, logs)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != filepath.Join(slots, "bcd-b") {
		fail("bcd node (pid %d) runs %q (%v), want the exec of %s", pid, exe, err, filepath.Join(slots, "bcd-b"))
	}
	if st := procStatus(t, pid); !strings.HasPrefix(st["Uid"], "65534\t") || st["CapEff"] != "0000000000000000" {
		t.Errorf("after the exec, bcd node runs as Uid %q CapEff %s", st["Uid"], st["CapEff"])
	}
	staging := filepath.Join(h.data, selfupdate.StagingDir)
	if uid, _ := owner(t, staging); uid != nobody {
		t.Errorf("%s is uid %d's, want the node's: the node stages the release itself", staging, uid)
	}
	if entries, err := os.ReadDir(staging); err != nil || len(entries) != 0 {
		t.Errorf("staging after the swap: %v %v, want the staged file installed and removed", entries, err)
	}
	for _, f := range []struct {
		name string
		mode fs.FileMode
	}{{selfupdate.SlotsFile, 0o644}, {selfupdate.UpdateFile, 0o600}} {
		path := filepath.Join(slots, f.name)
		fi, err := os.Stat(path)
		if err != nil {
			fail("%s: %v", path, err)
		}
		if uid, _ := owner(t, path); uid != 0 || fi.Mode().Perm() != f.mode {
			t.Errorf("%s is uid %d's mode %04o, want root's %04o", path, uid, fi.Mode().Perm(), f.mode)
		}
	}
	if _, err := os.Stat(filepath.Join(slots, selfupdate.UpgradeFile)); err == nil {
		t.Errorf("upgrade.json is still there after the confirmation")
	}
	un := &updatingNode{h: h, id: id, entry: entry, proc: node}
	if us := un.update(t); us.version(us.Current) != "0.1.1" || us.version(us.Previous) != "0.1.0" || us.Floor != 2 || !us.EntrypointLinked || us.Pending != nil {
		t.Errorf("bcd update after the helper's swap: %s", us.raw)
	}
	if target, err := os.Readlink(entry); err != nil || target != filepath.Join(slots, selfupdate.CurrentLink) {
		t.Errorf("the entrypoint links to %q (%v), want the slots' current", target, err)
	}
	// The helper re-executes the entrypoint once the node confirmed, so
	// that root runs the node's release too (same pid).
	deadline := time.Now().Add(20 * time.Second)
	for {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", hp.cmd.Process.Pid))
		if exe == filepath.Join(slots, "bcd-b") && strings.Count(hp.log.String(), "bcd helper serves") == 2 {
			break
		}
		if time.Now().After(deadline) {
			fail("bcd helper (pid %d) runs %q, want the re-exec of the confirmed %s", hp.cmd.Process.Pid, exe, filepath.Join(slots, "bcd-b"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("0.1.0 → 0.1.1 through the helper in %s", time.Since(step).Round(time.Millisecond))

	// 3. nodes reboot: the helper's reboot, as a fakehw helper records it.
	cp.mustBC("nodes", "reboot", id)
	deadline = time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(marker)
		if strings.HasPrefix(string(b), "reboot ") {
			break
		}
		if time.Now().After(deadline) {
			fail("no reboot reached the helper within 20 s (%s: %q)", marker, b)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// 4. A copy of bcd elsewhere, as nobody with the same config: refused.
	elsewhere := t.TempDir()
	chmod(t, elsewhere, 0o755)
	other := filepath.Join(elsewhere, "bcd")
	copyFile(t, filepath.Join(slots, "bcd-b"), other)
	r := runAs(t, nodeCred, other, nil, "", "node", "--config", h.config)
	if r.code == 0 || !strings.Contains(r.stderr, "the identity does not load") || !strings.Contains(r.stderr, helper.CodePeerRefused) {
		fail("bcd node from %s: %s, want its identity refused with %s", other, r, helper.CodePeerRefused)
	}
	if !strings.Contains(hp.log.String(), "refused a caller") {
		t.Errorf("the helper did not log the refused caller")
	}
	// 5. The renewal: a new TPM key through the helper, the session kept.
	deadline = time.Now().Add(90 * time.Second)
	for {
		r := cp.node(t, id)
		if r.CertNotAfter.After(row.CertNotAfter) && r.Connected && strings.Contains(node.log.String(), "node certificate renewed") {
			break
		}
		if time.Now().After(deadline) {
			fail("no renewal within 90 s of one-minute certificates (node %+v)", r)
		}
		time.Sleep(500 * time.Millisecond)
	}
	renewedKey, err := os.ReadFile(filepath.Join(h.data, "node.key"))
	if err != nil || !tpm.IsRecord(renewedKey) || string(renewedKey) == string(nodeKey) {
		t.Errorf("after the renewal node.key is not a new TPM record (%v, same as the join's: %v)", err, string(renewedKey) == string(nodeKey))
	}
	if !strings.Contains(hp.log.String(), "made a node key in the TPM") {
		t.Errorf("the helper did not make the renewal's key in the TPM")
	}
	if t.Failed() {
		t.Fatalf("serve log:\n%s\n%s", cp.log, logs())
	}
	t.Logf("TestHelperUnprivilegedNode: %s", time.Since(began).Round(time.Millisecond))
}

func chmod(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid, gid int) {
	t.Helper()
	if err := os.Lchown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}

// chownR is chown -R, as the install script gives data_dir to the node.
func chownR(t *testing.T, dir string, uid, gid int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func owner(t *testing.T, path string) (uid, gid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// procStatus is /proc/<pid>/status by field.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// noTPMOpen fails when pid has a TPM device open.
func noTPMOpen(t *testing.T, pid int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && strings.HasPrefix(target, "/dev/tpm") {
			t.Errorf("bcd node (pid %d) has %s open (fd %s)", pid, target, fd.Name())
		}
	}
}

// waitLog waits until p's log has s, or p exits.
func waitLog(t *testing.T, p *agentProcess, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(p.log.String(), s) {
		select {
		case <-p.done:
			t.Fatalf("%s exited before saying %q:\n%s", p.cmd.Path, s, p.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not say %q within %s:\n%s", p.cmd.Path, s, timeout, p.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitCommand polls commands get until the command is in state.
func waitCommand(t *testing.T, cp *controlPlane, id, state string, timeout time.Duration, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last apitype.Command
	for {
		if err := json.Unmarshal([]byte(cp.mustBC("commands", "get", id, "-o", "json")), &last); err != nil {
			t.Fatalf("commands get %s -o json: %v", id, err)
		}
		if last.State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("command %s not %s within %s: %+v\nserve log:\n%s\n%s", id, state, timeout, last, cp.log, logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
