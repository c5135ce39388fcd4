package pluginhost

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/bmc/pins"
	"github.com/better-compute/bcd/bmc/sandbox"
)

// TestMain lets the test binary be the sandbox launcher, as bcd is in production
// (`bcd plugin-exec`), so the tests run the real launcher code.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "plugin-exec" {
		err := sandbox.Exec(os.Args[2:])
		fmt.Fprintf(os.Stderr, "[ERROR] %v\n", err)
		os.Exit(126)
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// pluginBinaryEnv names a bcx-ipmi binary built beforehand, for a test binary that
// runs where there is no Go toolchain (testbed's TestPluginCgroupsInVM runs this
// package's tests inside a VM).
const pluginBinaryEnv = "BCD_TEST_BCX_IPMI"

// pluginBinary builds bcx-ipmi once, static as a release builds it, unless
// BCD_TEST_BCX_IPMI names one.
func pluginBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(pluginBinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v", pluginBinaryEnv, err)
		}
		return p
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "bcx-ipmi-build-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(buildDir, "bcx-ipmi"), "github.com/better-compute/bcd/plugins/bcx-ipmi")
		// The module root, wherever the test binary runs from.
		if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
			cmd.Dir = filepath.Join(filepath.Dir(file), "..", "..")
		}
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build bcx-ipmi: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "bcx-ipmi")
}

// pluginDir makes a [plugins] dir holding bcx-ipmi and its pin, as the install
// script leaves it.
func pluginDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	b, err := os.ReadFile(pluginBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bcx-ipmi"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	writePins(t, dir, pins.Format("bcx-ipmi", sha256.Sum256(b)))
	return dir
}

func writePins(t *testing.T, dir, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, pins.FileName), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// logBuffer collects every log line of a host, to search for what must not be
// there.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// newHost returns a started host for dir with test timings; launcher prefixes the
// test binary's plugin-exec (e.g. ip netns exec NS).
func newHost(t *testing.T, dir string, launcherPrefix ...string) (*Host, *logBuffer) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	var w io.Writer = logs
	if testing.Verbose() {
		w = io.MultiWriter(logs, os.Stderr)
	}
	h := &Host{
		Dir:            dir,
		Launcher:       append(append([]string(nil), launcherPrefix...), self, "plugin-exec"),
		RuntimeDir:     t.TempDir(),
		CallTimeout:    30 * time.Second,
		HealthInterval: time.Second,
		MinBackoff:     100 * time.Millisecond,
		MaxBackoff:     time.Second,
		Logger:         slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h, logs
}

// procStatus reads the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}
