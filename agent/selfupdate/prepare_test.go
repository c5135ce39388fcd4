package selfupdate

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// TestPrepareRefuses is every refusal of step 1 and of the download: each
// leaves the host as it was, staging included.
func TestPrepareRefuses(t *testing.T) {
	tests := []struct {
		name string
		// setup changes the host, the options or the section.
		setup     func(h *host, o *Options, sec *protocol.DaemonSection)
		serverNow time.Time
		code      string
	}{
		{name: "no release pins", code: CodeNoReleasePins,
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) { o.Pins = nil }},
		{name: "fewer pinned signers than the threshold", code: "RELEASE_UNTRUSTED",
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) { o.Pins, o.Threshold = h.pins, 2 }},
		{name: "signed by a key that is not pinned", code: "RELEASE_UNTRUSTED",
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) { o.Pins = h.pins[1:] }},
		{name: "no signed manifest", code: "RELEASE_UNTRUSTED",
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) { sec.Signature = "" }},
		{name: "another product", code: "RELEASE_MISMATCH",
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				r := testRelease("0.2.0", 5, binary("0.2.0"))
				r.Product = "bcx-ipmi"
				sec.Signature = h.sign(r)
			}},
		{name: "another version", code: "RELEASE_MISMATCH",
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				sec.Signature = h.sign(testRelease("0.3.0", 5, binary("0.2.0")))
			}},
		{name: "expired on the host clock", code: "RELEASE_EXPIRED",
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) {
				o.Now = func() time.Time { return testNow.Add(31 * 24 * time.Hour) }
			}},
		{name: "expired on server time only", code: "RELEASE_EXPIRED", serverNow: testNow.Add(31 * 24 * time.Hour)},
		{name: "below the config floor", code: "RELEASE_ROLLBACK",
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) { o.ConfigFloor = 6 }},
		{name: "below update.json's floor", code: "RELEASE_ROLLBACK",
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) {
				writeFile(t, filepath.Join(o.RecordsDir, UpdateFile), `{"floor": 6, "failed": []}`)
			}},
		{name: "binary not listed", code: "RELEASE_INCOMPLETE",
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				r := testRelease("0.2.0", 5, binary("0.2.0"))
				r.Artifacts[0].Name = pki.BinaryName("bcd", "0.2.0", runtime.GOOS, "riscv64-not-"+runtime.GOARCH)
				sec.Signature = h.sign(r)
			}},
		{name: "section digest is not the manifest's", code: "RELEASE_MISMATCH",
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) { sec.SHA256 = digest([]byte("other")) }},
		{name: "malformed section digest", code: CodeSectionInvalid,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) { sec.SHA256 = "ABC" }},
		{name: "malformed section version", code: CodeSectionInvalid,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) { sec.Version = "latest" }},
		{name: "http URL", code: CodeInsecureURL,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				sec.URL = "http" + strings.TrimPrefix(sec.URL, "https")
			}},
		{name: "failed before", code: CodeFailedBefore,
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) {
				writeFile(t, filepath.Join(o.RecordsDir, UpdateFile),
					`{"floor": 0, "failed": [{"version": "0.2.0", "reason": "bcd 0.2.0 did not start", "at": "2026-02-01T00:00:00Z"}]}`)
			}},
		{name: "larger than MaxSize", code: CodeTooLarge,
			setup: func(h *host, o *Options, _ *protocol.DaemonSection) { o.MaxSize = 10 }},
		{name: "Content-Length is not the manifest's size", code: CodeSizeMismatch,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				h.files["/0.2.0"] = append(binary("0.2.0"), "more"...)
			}},
		{name: "streams more than the manifest's size", code: CodeSizeMismatch,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				sec.URL = h.handle(t, func(w http.ResponseWriter, r *http.Request) {
					w.(http.Flusher).Flush() // no Content-Length: chunked
					for range 10 {
						_, _ = w.Write(binary("0.2.0"))
					}
				})
			}},
		{name: "streams fewer bytes", code: CodeSizeMismatch,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				sec.URL = h.handle(t, func(w http.ResponseWriter, r *http.Request) {
					w.(http.Flusher).Flush()
					_, _ = w.Write(binary("0.2.0")[:10])
				})
			}},
		{name: "digest mismatch while streaming", code: CodeDigestMismatch,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) {
				h.files["/0.2.0"] = []byte(strings.ToUpper(string(binary("0.2.0"))))
			}},
		{name: "not found", code: CodeDownloadFailed,
			setup: func(h *host, o *Options, sec *protocol.DaemonSection) { delete(h.files, "/0.2.0") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			sec := h.section("0.2.0", 5)
			o := h.opts
			if tt.setup != nil {
				tt.setup(h, &o, &sec)
			}
			m, err := New(o)
			if err != nil {
				t.Fatal(err)
			}
			p, err := m.Prepare(context.Background(), sec, tt.serverNow)
			wantCode(t, err, tt.code)
			t.Log(err)
			if p != nil {
				t.Errorf("a plan with the refusal: %+v", p)
			}
			if got := h.stagingEntries(); len(got) != 0 {
				t.Errorf("staging holds %v after a refusal", got)
			}
			h.untouched()
		})
	}
}

// handle serves f at a new path and returns its URL.
func (h *host) handle(t *testing.T, f http.HandlerFunc) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/", f)
	h.srv.Config.Handler = mux
	return h.srv.URL + "/handled"
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareIdleDownload: a server that sends part of the binary and then
// nothing is cut off by the idle watchdog, well before any overall limit.
func TestPrepareIdleDownload(t *testing.T) {
	for _, stallBeforeHeaders := range []bool{false, true} {
		t.Run(map[bool]string{false: "after some bytes", true: "before the headers"}[stallBeforeHeaders], func(t *testing.T) {
			h := newHost(t)
			sec := h.section("0.2.0", 5)
			done := make(chan struct{})
			t.Cleanup(func() { close(done) })
			sec.URL = h.handle(t, func(w http.ResponseWriter, r *http.Request) {
				if !stallBeforeHeaders {
					_, _ = w.Write(binary("0.2.0")[:20])
					w.(http.Flusher).Flush()
				}
				select {
				case <-r.Context().Done():
				case <-done:
				}
			})
			m := h.manager("0.1.0", func(o *Options) { o.IdleTimeout = 300 * time.Millisecond })
			start := time.Now()
			_, err := m.Prepare(context.Background(), sec, testNow)
			wantCode(t, err, CodeDownloadFailed)
			if !strings.Contains(err.Error(), "no data for 300ms") {
				t.Errorf("the refusal does not name the idle watchdog: %v", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the idle download took %s to give up", d)
			}
			if got := h.stagingEntries(); len(got) != 0 {
				t.Errorf("staging holds %v", got)
			}
		})
	}
}

// TestPrepareSameVersion: the running version is nothing to do.
func TestPrepareSameVersion(t *testing.T) {
	h := newHost(t)
	sec := h.section("0.1.0", 3)
	sec.Version = "v0.1.0"
	p, err := h.manager("0.1.0").Prepare(context.Background(), sec, testNow)
	if p != nil || err != nil {
		t.Fatalf("got %+v, %v; want nothing to do", p, err)
	}
	if h.hits.Load() != 0 {
		t.Error("downloaded the running version")
	}
	h.untouched()
}

// TestPrepareStages: a verified release ends up in staging, 0700, whole.
func TestPrepareStages(t *testing.T) {
	h := newHost(t)
	sec := h.section("0.2.0", 5)
	p, err := h.manager("0.1.0").Prepare(context.Background(), sec, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != "0.2.0" || p.Sequence != 5 {
		t.Errorf("plan %+v", p)
	}
	dir := filepath.Join(h.opts.DataDir, StagingDir)
	if got := string(h.read(filepath.Join(dir, "bcd-0.2.0"))); got != string(binary("0.2.0")) {
		t.Errorf("staged %q", got)
	}
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != stagingMode {
		t.Errorf("staging directory: %v %v", fi.Mode(), err)
	}
	if got := h.stagingEntries(); len(got) != 1 {
		t.Errorf("staging holds %v, want only bcd-0.2.0", got)
	}
	h.untouched()
}
