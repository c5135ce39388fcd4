package helper

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/internal/testenv"
)

// bcdBin is a fakehw bcd built once by TestMain: the real processes of the
// peer and startup tests ("" when the build failed: buildErr says why).
var (
	bcdBin   string
	buildErr error
)

// nodeUID and nodeGID are nobody's, the node user of every test.
const (
	nodeUser = "nobody"
	nodeUID  = 65534
	nodeGID  = 65534
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bcd-helper-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// nobody execs copies of the binary below it.
	_ = os.Chmod(dir, 0o755)
	buildErr = buildBcd(dir)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildBcd(dir string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(gomod))
	if mod == "" || mod == os.DevNull {
		return errors.New("go env GOMOD: not in a module")
	}
	out := filepath.Join(dir, "bcd")
	cmd := exec.Command("go", "build", "-tags", "fakehw", "-o", out, "./cmd/bcd")
	cmd.Dir = filepath.Dir(mod)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/bcd: %v\n%s", err, b)
	}
	bcdBin = out
	return nil
}

// needBcd is the built bcd; the test fails if the build did.
func needBcd(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatalf("building bcd for the test: %v", buildErr)
	}
	return bcdBin
}

// tree is one host's files under a temporary directory, laid out as the
// install script lays them out under /, all root's and 0755: the config,
// the helper's runtime directory, the entrypoint, the slots directory and
// the node's data directory.
type tree struct {
	t      *testing.T
	root   string
	config string
	socket string
	entry  string
	slots  string
	data   string
	// extra is appended to config.toml's top level and [update].
	extra, update string
}

func newTree(t *testing.T) *tree {
	t.Helper()
	testenv.NeedRoot(t)
	// Not t.TempDir(): a socket path is at most 108 bytes, and the test's
	// name would be in it.
	root, err := os.MkdirTemp("", "bh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	// nobody reaches the socket and the entrypoint through it.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	tr := &tree{
		t: t, root: root,
		config: filepath.Join(root, "etc/bcd/config.toml"),
		socket: filepath.Join(root, "run/bcd-helper/helper.sock"),
		entry:  filepath.Join(root, "usr/local/bin/bcd"),
		slots:  filepath.Join(root, "usr/local/lib/bcd"),
		data:   filepath.Join(root, "var/lib/bcd"),
	}
	for _, d := range []string{filepath.Dir(tr.config), filepath.Dir(tr.socket), filepath.Dir(tr.entry), filepath.Dir(tr.slots), tr.data} {
		tr.mkdir(d, 0o755)
	}
	tr.writeConfig()
	t.Setenv(EnvTestTrustedRoot, root)
	return tr
}

// mkdir makes d and its parents with mode (whatever the umask).
func (tr *tree) mkdir(d string, mode os.FileMode) {
	tr.t.Helper()
	if err := os.MkdirAll(d, mode); err != nil {
		tr.t.Fatal(err)
	}
	for p := d; strings.HasPrefix(p, tr.root+"/"); p = filepath.Dir(p) {
		if err := os.Chmod(p, mode); err != nil {
			tr.t.Fatal(err)
		}
	}
}

func (tr *tree) writeConfig() {
	tr.t.Helper()
	text := fmt.Sprintf(`site = "fsn1"
data_dir = %q
%s
[helper]
socket = %q
user = %q

[update]
slots_dir = %q
entrypoint = %q
%s
`, tr.data, tr.extra, tr.socket, nodeUser, tr.slots, tr.entry, tr.update)
	if err := os.WriteFile(tr.config, []byte(text), 0o644); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.Chmod(tr.config, 0o644); err != nil {
		tr.t.Fatal(err)
	}
}

func (tr *tree) load() *config.Config {
	tr.t.Helper()
	c, err := config.Load(tr.config, config.ParseOptions{AllowHTTP: true})
	if err != nil {
		tr.t.Fatal(err)
	}
	return c
}

// installBcd copies the built bcd to the entrypoint, root's and 0755, as the
// install script does.
func (tr *tree) installBcd() {
	tr.t.Helper()
	copyFile(tr.t, needBcd(tr.t), tr.entry, 0o755)
}

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, mode); err != nil {
		t.Fatal(err)
	}
}

// withSWTPM gives s a fresh swtpm for its tpm.* operations.
func withSWTPM(t *testing.T, s *Server) {
	t.Helper()
	sw := swtpmtest.Start(t, false)
	s.Keys = &nodekey.Host{RequireTPM: true, OpenTPM: func() (*tpm.TPM, error) { return tpm.OpenTCP(sw.Addr()) }}
	t.Cleanup(func() { s.Keys.Close() })
}

// helperProc is a real bcd helper process run from the tree's entrypoint.
type helperProc struct {
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	exited chan struct{}
	err    error
}

// startHelper runs `bcd helper` from the entrypoint with env added.
func (tr *tree) startHelper(env ...string) *helperProc {
	tr.t.Helper()
	cmd := exec.Command(tr.entry, "helper", "--config", tr.config)
	cmd.Env = append(append(os.Environ(), EnvTestTrustedRoot+"="+tr.root), env...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tr.t.Fatal(err)
	}
	p := &helperProc{cmd: cmd, out: out, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	tr.t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-p.exited
			}
		}
		if tr.t.Failed() {
			tr.t.Logf("bcd helper's output:\n%s", out.String())
		}
	})
	return p
}

// waitServing waits until the helper logged that it serves, failing if it
// exits first.
func (p *helperProc) waitServing(t *testing.T) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(p.out.String(), `"bcd helper serves"`) {
		select {
		case <-p.exited:
			t.Fatalf("bcd helper exited (%v) before serving:\n%s", p.err, p.out.String())
		case <-deadline:
			t.Fatalf("bcd helper did not serve within 30 s:\n%s", p.out.String())
		case <-tick.C:
		}
	}
}

// waitExit waits for the process to exit and returns its exit code.
func (p *helperProc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("bcd helper did not exit within 30 s:\n%s", p.out.String())
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatal(p.err)
	}
	return 0
}

// call runs `bcd helper call op` from exe with cred (nil: as the test, root),
// body on standard input; it returns the exit code and the output.
func (tr *tree) call(exe string, cred *syscall.Credential, op, body string) (int, string) {
	tr.t.Helper()
	cmd := exec.Command(exe, "helper", "call", "--config", tr.config, op)
	cmd.Stdin = strings.NewReader(body)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	case err != nil:
		tr.t.Fatalf("bcd helper call %s: %v\n%s", op, err, out)
	}
	return 0, string(out)
}

// logBuffer is a JSON slog logger into a buffer the test reads.
func logBuffer() (*slog.Logger, *syncbuf.Buffer) {
	b := &syncbuf.Buffer{}
	return slog.New(slog.NewJSONHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

// running is a Server's Run in the background.
type running struct {
	done chan struct{}
	err  error
}

// served runs s in the background until the test ends; it returns once the
// socket is in place.
func served(t *testing.T, s *Server) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{done: make(chan struct{})}
	go func() { r.err = s.Run(ctx); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
			t.Error("the server did not stop within 30 s")
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fi, err := os.Lstat(s.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return r
		}
		select {
		case <-r.done:
			t.Fatalf("the server stopped before serving: %v", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the socket did not appear within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lines is s's lines that contain sub.
func lines(s, sub string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return out
}
