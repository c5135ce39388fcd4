package helper

import (
	"context"
	"encoding/json"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/selfupdate"
)

// TestHelperCommandStartup: bcd helper refuses each bad tree with exit 1 and
// every problem; on a good one the socket is at [helper] socket, mode 0660,
// group the node's, with no private directory left, and SIGTERM removes it.
func TestHelperCommandStartup(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(tr *tree)
		says  []string
	}{
		{"a config.toml the node user owns", func(tr *tree) {
			if err := os.Chown(tr.config, nodeUID, nodeGID); err != nil {
				t.Fatal(err)
			}
		}, []string{"bcd helper refuses to start:\n  ", "config.toml: owned by uid 65534, not root; the config decides what root does for the node"}},
		{"a group-writable /usr/local/lib and a socket directory anyone can write", func(tr *tree) {
			if err := os.Chmod(filepath.Dir(tr.slots), 0o775|os.ModeSetgid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(filepath.Dir(tr.socket), 0o777); err != nil {
				t.Fatal(err)
			}
		}, []string{"usr/local/lib: mode 2775 is writable by group or other (chmod go-w)\n",
			"run/bcd-helper: the socket's directory: mode 0777 is writable by group or other (chmod go-w)\n"}},
		{"no [helper] section", func(tr *tree) {
			text, err := os.ReadFile(tr.config)
			if err != nil {
				t.Fatal(err)
			}
			i := strings.Index(string(text), "[helper]")
			j := strings.Index(string(text), "[update]")
			if err := os.WriteFile(tr.config, append(text[:i:i], text[j:]...), 0o644); err != nil {
				t.Fatal(err)
			}
		}, []string{"config.toml: has no [helper] section; bcd helper runs only beside a bcd node configured for it"}},
		{"something that is not a socket at the socket's path", func(tr *tree) {
			if err := os.WriteFile(tr.socket, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, []string{"helper.sock exists and is not a socket (----------); refusing to replace it"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newTree(t)
			tr.installBcd()
			tc.setup(tr)
			p := tr.startHelper()
			code := p.waitExit(t)
			out := p.out.String()
			if code != 1 {
				t.Errorf("exit %d, want 1:\n%s", code, out)
			}
			for _, s := range tc.says {
				if !strings.Contains(out, s) {
					t.Errorf("the output does not say %q:\n%s", s, out)
				}
			}
		})
	}

	t.Run("a good tree", func(t *testing.T) {
		tr := newTree(t)
		tr.installBcd()
		// A stale socket, as a killed helper leaves it, is replaced.
		stale, err := net.Listen("unix", tr.socket)
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close()
		p := tr.startHelper()
		p.waitServing(t)
		fi, err := os.Lstat(tr.socket)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != nodeGID {
			t.Errorf("the socket is %v uid %d gid %d; want a socket 0660 root:%d", fi.Mode(), st.Uid, st.Gid, nodeGID)
		}
		left, _ := filepath.Glob(filepath.Join(filepath.Dir(tr.socket), ".helper-*"))
		if len(left) > 0 {
			t.Errorf("private directories left beside the socket: %v", left)
		}

		// A second helper on the same socket is refused; the first keeps it.
		second := tr.startHelper()
		if code := second.waitExit(t); code != 1 || !strings.Contains(second.out.String(), "another bcd helper serves "+tr.socket) {
			t.Errorf("a second helper: exit %d:\n%s", code, second.out.String())
		}
		if code, out := tr.call(tr.entry, nil, OpTPMLoad, `{"record":"eA=="}`); code != 1 || !strings.Contains(out, CodeInvalidRequest) {
			t.Errorf("the first helper does not serve after the second was refused: exit %d: %s", code, out)
		}

		// Without its marker file a fakehw helper refuses to reboot.
		if code, out := tr.call(tr.entry, nil, OpReboot, `{}`); code != 1 ||
			!strings.Contains(out, "HELPER_FAILED: reboot: a fakehw bcd helper never reboots the machine, and "+EnvFakeHWRebootFile+" is not set") {
			t.Errorf("reboot without %s: exit %d: %s", EnvFakeHWRebootFile, code, out)
		}

		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.waitExit(t); code != 0 {
			t.Errorf("SIGTERM: exit %d:\n%s", code, p.out.String())
		}
		if _, err := os.Lstat(tr.socket); !os.IsNotExist(err) {
			t.Errorf("the socket is still there after SIGTERM: %v", err)
		}
	})
}

// TestPeerChecks: real processes call a real bcd helper; only root or the
// node user (uid and gid) running an installed bcd is served.
func TestPeerChecks(t *testing.T) {
	tr := newTree(t)
	tr.installBcd()
	reboots := filepath.Join(tr.root, "reboots")
	p := tr.startHelper(EnvFakeHWRebootFile + "=" + reboots)
	p.waitServing(t)

	elsewhere := filepath.Join(filepath.Dir(needBcd(t)), "elsewhere", "bcd")
	if err := os.MkdirAll(filepath.Dir(elsewhere), 0o755); err != nil {
		t.Fatal(err)
	}
	copyFile(t, needBcd(t), elsewhere, 0o755)
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(elsewhere)) })

	// A bad record: served, then refused by the operation's own validation.
	const probe = `{"record":"eA=="}`
	const served = "INVALID_REQUEST: tpm.load: the record is not a TPM node key's record"
	// nogroup as a supplementary group lets the caller connect (the socket is
	// root:nogroup 0660), so the peer check is what refuses it.
	for _, tc := range []struct {
		name string
		exe  string
		cred *syscall.Credential
		says string
	}{
		{"root from the entrypoint", tr.entry, nil, served},
		{"the node user from the entrypoint", tr.entry, &syscall.Credential{Uid: nodeUID, Gid: nodeGID}, served},
		{"the node user's uid with gid 0", tr.entry, &syscall.Credential{Uid: nodeUID, Gid: 0, Groups: []uint32{nodeGID}},
			"HELPER_PEER_REFUSED: the caller (pid "},
		{"another user", tr.entry, &syscall.Credential{Uid: 1, Gid: 1, Groups: []uint32{nodeGID}},
			"HELPER_PEER_REFUSED: the caller (pid "},
		{"root from a copy of bcd elsewhere", elsewhere, nil,
			"HELPER_PEER_REFUSED: the caller (pid "},
		{"the node user from a copy of bcd elsewhere", elsewhere, &syscall.Credential{Uid: nodeUID, Gid: nodeGID},
			"HELPER_PEER_REFUSED: the caller (pid "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := tr.call(tc.exe, tc.cred, OpTPMLoad, probe)
			if code != 1 || !strings.Contains(out, tc.says) {
				t.Fatalf("exit %d, output %q; want exit 1 saying %q", code, out, tc.says)
			}
			if tc.says == served {
				return
			}
			switch {
			case tc.exe == elsewhere:
				want := "runs " + elsewhere + ": not an installed bcd; bcd helper serves only an installed bcd ([update] entrypoint, bcd-a or bcd-b in the slots directory, or the helper's own binary): " + tr.entry
				if !strings.Contains(out, want) {
					t.Errorf("the refusal does not say %q:\n%s", want, out)
				}
			default:
				want := "runs as uid " + itoa(tc.cred.Uid) + " gid " + itoa(tc.cred.Gid) + "; bcd helper serves only root or the [helper] user nobody (uid 65534 gid 65534)"
				if !strings.Contains(out, want) {
					t.Errorf("the refusal does not say %q:\n%s", want, out)
				}
			}
		})
	}

	t.Run("the go test binary", func(t *testing.T) {
		_, err := NewClientAt(tr.socket).TPMLoad(context.Background(), []byte("x"))
		self, _ := os.Readlink("/proc/self/exe")
		if !IsCode(err, CodePeerRefused) || !strings.Contains(err.Error(), "runs "+self+": not an installed bcd") {
			t.Fatalf("got %v; want %s naming %s", err, CodePeerRefused, self)
		}
	})

	t.Run("a slot binary replaced under its running process", func(t *testing.T) {
		tr.mkdir(tr.slots, 0o755)
		slot := filepath.Join(tr.slots, "bcd-a")
		copyFile(t, needBcd(t), slot, 0o755)
		// bcd helper call reads its request before it connects: replace
		// the slot's file meanwhile, so that it runs a deleted one.
		cmd := exec.Command(slot, "helper", "call", "--config", tr.config, OpTPMLoad)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out syncbuf.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(slot); err != nil {
			t.Fatal(err)
		}
		copyFile(t, needBcd(t), slot, 0o755)
		if _, err := io.WriteString(stdin, probe); err != nil {
			t.Fatal(err)
		}
		stdin.Close()
		err = cmd.Wait()
		want := "runs " + slot + " (deleted): a deleted file"
		if err == nil || !strings.Contains(out.String(), "HELPER_PEER_REFUSED") || !strings.Contains(out.String(), want) {
			t.Fatalf("%v: %s; want a refusal saying %q", err, out.String(), want)
		}
		// The new file at the slot's path is served.
		if code, out := tr.call(slot, nil, OpTPMLoad, probe); code != 1 || !strings.Contains(out, served) {
			t.Errorf("the slot's new binary: exit %d: %s", code, out)
		}
		os.Remove(slot)
	})

	t.Run("the node user reboots", func(t *testing.T) {
		code, out := tr.call(tr.entry, &syscall.Credential{Uid: nodeUID, Gid: nodeGID}, OpReboot, `{}`)
		if code != 0 || strings.TrimSpace(out) != "{}" {
			t.Fatalf("exit %d: %s", code, out)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, _ := os.ReadFile(reboots)
			if strings.HasPrefix(string(b), "reboot ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the fakehw reboot wrote no line to %s within 20 s:\n%s", reboots, p.out.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	// Every refusal was logged with the caller.
	refused := lines(p.out.String(), `"refused a caller"`)
	if len(refused) < 5 {
		t.Errorf("%d refusals logged, want at least 5:\n%s", len(refused), p.out.String())
	}
	for _, l := range refused {
		for _, k := range []string{`"pid":`, `"uid":`, `"gid":`, `"exe":`} {
			if !strings.Contains(l, k) {
				t.Errorf("the log line lacks %s: %s", k, l)
			}
		}
	}
}

func itoa(u uint32) string { return strconv.Itoa(int(u)) }

// TestReExecAfterConfirm: a real bcd helper swaps a signed release that is a
// real bcd for the node, and after the node confirms it re-executes the
// entrypoint, now the new slot, which serves again on the same socket.
func TestReExecAfterConfirm(t *testing.T) {
	r := newRelease(t)
	tr := r.tr
	tr.installBcd()
	sec := r.Section(t, "0.2.0", 2, mustRead(t, needBcd(t)))
	staging := filepath.Join(tr.data, selfupdate.StagingDir)
	if err := os.MkdirAll(staging, 0o700); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(staging, selfupdate.StagedName("0.2.0"))
	copyFile(t, needBcd(t), staged, 0o644)
	for _, p := range []string{staging, staged} {
		if err := os.Chown(p, nodeUID, nodeGID); err != nil {
			t.Fatal(err)
		}
	}
	p := tr.startHelper()
	p.waitServing(t)
	node := &syscall.Credential{Uid: nodeUID, Gid: nodeGID}
	req, err := json.Marshal(UpdateRequest{Running: "0.1.0", Section: &sec, CommandID: "cmd-1", Revision: 3})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := tr.call(tr.entry, node, OpUpdateSwap, string(req)); code != 0 {
		t.Fatalf("update.swap: exit %d: %s", code, out)
	}
	link, err := filepath.EvalSymlinks(tr.entry)
	if err != nil || link != filepath.Join(tr.slots, "bcd-b") {
		t.Fatalf("the entrypoint resolves to %q (%v), want bcd-b", link, err)
	}
	// The node's new binary, run from the entrypoint (now bcd-b), confirms.
	code, out := tr.call(tr.entry, node, OpUpdateConfirm, `{"running":"0.2.0"}`)
	if code != 0 || !strings.Contains(out, `"State":"confirmed"`) {
		t.Fatalf("update.confirm: exit %d: %s", code, out)
	}
	deadline := time.Now().Add(wait)
	for strings.Count(p.out.String(), `"bcd helper serves"`) < 2 {
		select {
		case <-p.exited:
			t.Fatalf("bcd helper exited (%v) instead of re-executing:\n%s", p.err, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("bcd helper did not serve again after the confirm:\n%s", p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/exe")
	if err != nil || exe != filepath.Join(tr.slots, "bcd-b") {
		t.Errorf("the helper (same pid) now runs %q (%v), want bcd-b", exe, err)
	}
	if code, out := tr.call(tr.entry, node, OpUpdateResume, `{"running":"0.2.0"}`); code != 0 || !strings.Contains(out, `"State":"none"`) {
		t.Errorf("the re-executed helper: update.resume: exit %d: %s", code, out)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
