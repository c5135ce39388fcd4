package selfupdate

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// testNow is the host clock of every test; manifests expire 30 days later.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// host is one machine's files in a temporary directory: the entrypoint the
// install script wrote, the data directory, the slots, a unit directory.
type host struct {
	t       *testing.T
	root    string
	opts    Options
	keys    []*ecdsa.PrivateKey
	pins    []string
	srv     *httptest.Server
	files   map[string][]byte // what the release server serves, by path
	hits    atomic.Int64      // downloads served
	oldBody []byte            // the install script's binary at the entrypoint
}

func newHost(t *testing.T) *host {
	t.Helper()
	root := t.TempDir()
	h := &host{t: t, root: root, files: map[string][]byte{}}
	data := filepath.Join(root, "var", "lib", "bcd")
	entry := filepath.Join(root, "usr", "local", "bin", "bcd")
	for _, d := range []string{data, filepath.Dir(entry)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	h.oldBody = []byte("#!/bin/sh\necho the install script's bcd 0.1.0\n")
	if err := os.WriteFile(entry, h.oldBody, 0o755); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pin, err := pki.SPKIPin(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		h.keys, h.pins = append(h.keys, k), append(h.pins, pin)
	}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	h.opts = Options{
		Pins:        h.pins[:1],
		Threshold:   1,
		ConfigFloor: 3,
		SlotsDir:    filepath.Join(data, "bin"),
		RecordsDir:  data,
		DataDir:     data,
		Entrypoint:  entry,
		ConfigPath:  filepath.Join(root, "etc", "bcd", "config.toml"),
		UnitDir:     filepath.Join(root, "etc", "systemd", "system"),
		RequireRoot: os.Geteuid() == 0,
		IdleTimeout: 5 * time.Second,
		HTTPClient:  h.srv.Client(),
		Running:     "0.1.0",
		Now:         func() time.Time { return testNow },
	}
	return h
}

func (h *host) serve(w http.ResponseWriter, r *http.Request) {
	body, ok := h.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	h.hits.Add(1)
	_, _ = w.Write(body)
}

// manager is a Manager for the host as the process running version would
// see it, with opts changed by edit.
func (h *host) manager(running string, edit ...func(*Options)) *Manager {
	h.t.Helper()
	o := h.opts
	o.Running = running
	for _, e := range edit {
		e(&o)
	}
	m, err := New(o)
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

// binary is the content of a test build of version.
func binary(version string) []byte {
	return []byte("#!/bin/sh\necho bcd " + version + "\n" + strings.Repeat("#", 200) + "\n")
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func testRelease(version string, seq int64, body []byte) pki.Release {
	return pki.Release{
		Product: "bcd", Version: version, Sequence: seq, Expires: testNow.Add(30 * 24 * time.Hour),
		Artifacts: []pki.Artifact{{Name: pki.BinaryName("bcd", version, runtime.GOOS, runtime.GOARCH), Size: int64(len(body)), SHA256: digest(body)}},
	}
}

func (h *host) sign(r pki.Release, keys ...*ecdsa.PrivateKey) string {
	h.t.Helper()
	if len(keys) == 0 {
		keys = h.keys[:1]
	}
	out, err := pki.SignRelease(r, keys)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(out)
}

// section is a daemon section for version, signed by the first key, its
// binary served at /<version>.
func (h *host) section(version string, seq int64) protocol.DaemonSection {
	h.t.Helper()
	body := binary(version)
	h.files["/"+version] = body
	return protocol.DaemonSection{
		Version: version, URL: h.srv.URL + "/" + version, SHA256: digest(body),
		Signature: h.sign(testRelease(version, seq, body)),
	}
}

// update prepares and swaps to sec as the process running version.
func (h *host) update(running string, sec protocol.DaemonSection) *Manager {
	h.t.Helper()
	m := h.manager(running)
	p, err := m.Prepare(context.Background(), sec, testNow)
	if err != nil {
		h.t.Fatalf("prepare %s: %v", sec.Version, err)
	}
	if p == nil {
		h.t.Fatalf("prepare %s: no plan", sec.Version)
	}
	if err := m.Swap(context.Background(), p, "cmd-"+sec.Version, 7); err != nil {
		h.t.Fatalf("swap to %s: %v", sec.Version, err)
	}
	return m
}

// confirm runs the new binary's first Welcome.
func (h *host) confirm(version string) {
	h.t.Helper()
	out, err := h.manager(version).Confirm()
	if err != nil || out.State != Confirmed {
		h.t.Fatalf("confirm %s: %+v, %v", version, out, err)
	}
}

func (h *host) slotsDir() string { return h.opts.SlotsDir }

func (h *host) link(name string) string {
	h.t.Helper()
	target, err := os.Readlink(filepath.Join(h.slotsDir(), name))
	if errors.Is(err, os.ErrNotExist) {
		return ""
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return target
}

func (h *host) read(path string) []byte {
	h.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatal(err)
	}
	return b
}

func (h *host) exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (h *host) slots() slotsRecord {
	h.t.Helper()
	r, ok, err := readRecord(filepath.Join(h.slotsDir(), SlotsFile), parseSlots)
	if err != nil || !ok {
		h.t.Fatalf("slots.json: %v (exists %v)", err, ok)
	}
	return r
}

func (h *host) updateRecord() updateRecord {
	h.t.Helper()
	r, _, err := readRecord(filepath.Join(h.opts.RecordsDir, UpdateFile), parseUpdate)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func (h *host) upgradeRecord() (upgradeRecord, bool) {
	h.t.Helper()
	r, ok, err := readRecord(filepath.Join(h.opts.RecordsDir, UpgradeFile), parseUpgrade)
	if err != nil {
		h.t.Fatal(err)
	}
	return r, ok
}

// stagingEntries lists what is in the staging directory.
func (h *host) stagingEntries() []string {
	h.t.Helper()
	entries, err := os.ReadDir(filepath.Join(h.opts.DataDir, StagingDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// wantCode fails unless err is a Refusal with code.
func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	r, ok := IsRefusal(err)
	if !ok {
		t.Fatalf("got %v, want a %s refusal", err, code)
	}
	if r.Code != code || !strings.HasPrefix(err.Error(), code+": ") {
		t.Fatalf("got %q, want code %s", err, code)
	}
}

// untouched fails unless the host is as the install script left it: no
// slots, the entrypoint still the plain file, no record of an update.
func (h *host) untouched() {
	h.t.Helper()
	if h.exists(h.slotsDir()) {
		h.t.Errorf("the slots directory was created")
	}
	fi, err := os.Lstat(h.opts.Entrypoint)
	if err != nil || !fi.Mode().IsRegular() {
		h.t.Errorf("the entrypoint is no longer a plain file: %v %v", fi, err)
	}
	if h.exists(filepath.Join(h.opts.RecordsDir, UpgradeFile)) {
		h.t.Errorf("upgrade.json was written")
	}
}
