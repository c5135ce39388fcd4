package pluginhost

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/bmc"
)

var nowhere = bmc.Host{Name: "m-1", Address: "127.0.0.1", Port: 9, Username: "admin", Password: "pw-never-used"}

// refusedWith calls the plugin and wants a refusal naming want, at once: a
// refused plugin fails calls instead of leaving them waiting.
func refusedWith(t *testing.T, h *Host, want string) {
	t.Helper()
	d, err := h.Driver("bcx-ipmi")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = d.PowerStatus(ctx, nowhere)
	if err == nil || bmc.KindOf(err) != bmc.KindPlugin || !strings.Contains(err.Error(), want) {
		t.Fatalf("call: %v (kind %s), want a plugin error containing %q", err, bmc.KindOf(err), want)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the refusal took %s", time.Since(start))
	}
	st, ok := h.Status("bcx-ipmi")
	if !ok || st.Running || !strings.Contains(st.LastError, want) {
		t.Errorf("status %+v", st)
	}
}

// TestTamperedBinaryIsRefused: one byte changed and the plugin does not start, and
// the error says which file, which digest and which pin.
func TestTamperedBinaryIsRefused(t *testing.T) {
	dir := pluginDir(t)
	path := filepath.Join(dir, "bcx-ipmi")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(path, b, 0o755); err != nil {
		t.Fatal(err)
	}
	h, logs := newHost(t, dir)
	refusedWith(t, h, "sha256 of "+path+" is ")
	refusedWith(t, h, "but line 1 of "+filepath.Join(dir, "pins")+" pins ")
	if !strings.Contains(logs.String(), "refusing to start it") {
		t.Errorf("the log does not say why:\n%s", logs)
	}
}

func TestUnpinnedPluginIsRefused(t *testing.T) {
	dir := pluginDir(t)
	writePins(t, dir, "# nothing pinned\n")
	h, _ := newHost(t, dir)
	refusedWith(t, h, "has no line for bcx-ipmi: refusing to start it")
}

func TestPluginWithoutPinsFileIsRefused(t *testing.T) {
	dir := pluginDir(t)
	os.Remove(filepath.Join(dir, "pins"))
	h, _ := newHost(t, dir)
	refusedWith(t, h, "pins file: open "+filepath.Join(dir, "pins"))
}

func TestWritablePluginIsRefused(t *testing.T) {
	dir := pluginDir(t)
	if err := os.Chmod(filepath.Join(dir, "bcx-ipmi"), 0o775); err != nil {
		t.Fatal(err)
	}
	h, _ := newHost(t, dir)
	refusedWith(t, h, "has mode 0775: group or others may change it")
}

func TestBadPinsFileIsRefused(t *testing.T) {
	dir := pluginDir(t)
	writePins(t, dir, "not a pin\n")
	h, _ := newHost(t, dir)
	refusedWith(t, h, "pins file line 1")
}

func TestHostRefusesBadNames(t *testing.T) {
	h, _ := newHost(t, pluginDir(t))
	for _, name := range []string{"", "../bcx-ipmi", "pins", "a/b", ".."} {
		if _, err := h.Driver(name); err == nil {
			t.Errorf("Driver(%q) accepted", name)
		}
	}
}

// TestCgroupFailureStopsEveryPlugin: a cgroup that cannot be prepared means no
// plugin runs, and Start and Driver say why.
func TestCgroupFailureStopsEveryPlugin(t *testing.T) {
	h := &Host{Dir: pluginDir(t), Cgroup: filepath.Join(t.TempDir(), "nope", "plugins"), RuntimeDir: t.TempDir()}
	err := h.Start()
	if err == nil || !strings.Contains(err.Error(), "cannot be prepared") {
		t.Fatalf("Start: %v", err)
	}
	if _, err2 := h.Driver("bcx-ipmi"); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("Driver after a failed Start: %v", err2)
	}
	h.Close()
}
