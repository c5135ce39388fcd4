package downloads

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/bcd/protocol"
)

// serve starts the handler on loopback and returns its base URL.
func serve(t *testing.T, o Options) string {
	t.Helper()
	h, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

// get sends path as written, without Go's URL cleaning.
func get(t *testing.T, base, path string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", base, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = path
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestRoutes(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "dl")
	blobs := filepath.Join(tmp, "blobs")
	outside := filepath.Join(tmp, "secret")
	write(t, outside, "SECRET")
	write(t, filepath.Join(dir, "bcd_0.1.0_linux_amd64"), "bcd amd64 from dir")
	write(t, filepath.Join(dir, "bcd_0.1.0_linux_arm64"), "bcd arm64 from dir")
	write(t, filepath.Join(dir, "bcd_1.2.3-rc.1+build.5_linux_amd64"), "bcd rc")
	// A file named with the v goreleaser leaves out is not what v1.2.4 asks for.
	write(t, filepath.Join(dir, "bcd_v1.2.4_linux_amd64"), "misnamed")
	write(t, filepath.Join(dir, "bcx-ipmi_0.1.0_linux_arm64.tar.gz"), "ipmi archive")
	write(t, filepath.Join(blobs, "bcd/0.1.0/bcd_0.1.0_linux_amd64"), "bcd amd64 from blob")
	write(t, filepath.Join(dir, "bcd_0.1.0_darwin_amd64"), "darwin")
	write(t, filepath.Join(dir, "other_0.1.0_linux_amd64"), "other")
	// A symlink named like a release file, pointing out of the directory.
	if err := os.Symlink(outside, filepath.Join(dir, "bcd_6.6.6_linux_amd64")); err != nil {
		t.Fatal(err)
	}
	// A symlink inside the directory, to a real release file.
	if err := os.Symlink("bcd_0.1.0_linux_arm64", filepath.Join(dir, "bcd_0.1.1_linux_arm64")); err != nil {
		t.Fatal(err)
	}
	// In the blob store too.
	if err := os.MkdirAll(filepath.Join(blobs, "bcd/6.6.7"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(blobs, "bcd/6.6.7/bcd_6.6.7_linux_amd64")); err != nil {
		t.Fatal(err)
	}
	// A directory named like a release file.
	if err := os.Mkdir(filepath.Join(dir, "bcd_0.2.0_linux_amd64"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A FIFO named like one must not hang the server.
	if err := syscall.Mkfifo(filepath.Join(dir, "bcd_0.3.0_linux_amd64"), 0o644); err != nil {
		t.Fatal(err)
	}

	base := serve(t, Options{BasePath: "/p", Dir: dir, Blob: DirBlobs(blobs)})
	ok := map[string]string{
		"/p/downloads/bcd/0.1.0/linux-amd64":                 "bcd amd64 from blob",
		"/p/downloads/bcd/v0.1.0/linux-amd64":                "bcd amd64 from blob",
		"/p/downloads/bcd/v0.1.0/linux-arm64":                "bcd arm64 from dir",
		"/p/downloads/bcd/1.2.3-rc.1+build.5/linux-amd64":    "bcd rc",
		"/p/downloads/bcd/0.1.0/linux-arm64":                 "bcd arm64 from dir",
		"/p/downloads/bcd/v1.2.3-rc.1+build.5/linux-amd64":   "bcd rc",
		"/p/downloads/bcx-ipmi/0.1.0/linux-arm64":            "ipmi archive",
		"/p/downloads/bcd/v1.2.3-rc.1%2Bbuild.5/linux-amd64": "", // %2B is not in the pattern
	}
	for path, want := range ok {
		resp, body := get(t, base, path, nil)
		if want == "" {
			if resp.StatusCode != 404 {
				t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
			}
			continue
		}
		if resp.StatusCode != 200 || body != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, resp.StatusCode, body, want)
			continue
		}
		for k, v := range map[string]string{
			"Content-Type":  "application/octet-stream",
			"Cache-Control": "public, max-age=31536000, immutable",
		} {
			if got := resp.Header.Get(k); got != v {
				t.Errorf("GET %s: %s %q, want %q", path, k, got, v)
			}
		}
		if resp.Header.Get("Last-Modified") == "" {
			t.Errorf("GET %s: no Last-Modified", path)
		}
	}
	notFound := []string{
		"/p/downloads/bcd/0.1.0/linux-386",
		"/p/downloads/bcd/0.1.0/darwin-amd64",
		"/p/downloads/bcd/0.1.0/windows-amd64",
		"/p/downloads/other/0.1.0/linux-amd64",
		"/p/downloads/bcd/0.9.9/linux-amd64",  // missing
		"/p/downloads/bcd/0.2.0/linux-amd64",  // a directory
		"/p/downloads/bcd/0.3.0/linux-amd64",  // a FIFO
		"/p/downloads/bcd/6.6.6/linux-amd64",  // symlink out of dir
		"/p/downloads/bcd/6.6.7/linux-amd64",  // symlink out of the blob store
		"/p/downloads/bcd/0.1.1/linux-arm64",  // symlink inside dir: still refused
		"/p/downloads/bcd/01.0.0/linux-amd64", // not semver
		"/p/downloads/bcd/1.0/linux-amd64",    // not semver
		"/p/downloads/bcd/V1.0.0/linux-amd64", // upper-case V
		"/p/downloads/bcd/v1.2.4/linux-amd64", // only bcd_1.2.4_… would do
		"/p/downloads/bcd/vv0.1.0/linux-amd64",
		"/p/downloads/bcd/../../secret",
		"/p/downloads/bcd/..%2f..%2fsecret/linux-amd64",
		"/p/downloads/bcd/0.1.0%2flinux-amd64",
		"/p/downloads/bcd%2f0.1.0/linux-amd64",
		"/p/downloads/bcd/%2e%2e/linux-amd64",
		"/p/downloads/%2e%2e/0.1.0/linux-amd64",
		"/p/downloads/bcd/0.1.0/linux-amd64/",
		"/p/downloads/bcd/0.1.0/linux-amd64/x",
		"/p/downloads/bcd/0.1.0/./linux-amd64",
		"/p/downloads//bcd/0.1.0/linux-amd64",
		"/p/downloads/bcd/0.1.0/linux%2Damd64",
		"/p/downloads/bcd/0.1.0/linux-amd64?x=1",
		"/downloads/bcd/0.1.0/linux-amd64", // outside the base path
		"/p/downloads/",
		"/p/downloads/bcd/" + strings.Repeat("1", 200) + ".0.0/linux-amd64",
	}
	for _, path := range notFound {
		resp, body := get(t, base, path, nil)
		if resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", path, resp.StatusCode)
		}
		if strings.Contains(body, "SECRET") {
			t.Errorf("GET %s leaked the file outside the directory", path)
		}
	}
}

func TestRangeAndHead(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "bcd_1.0.0_linux_amd64"), "0123456789")
	base := serve(t, Options{Dir: dir})
	resp, body := get(t, base, "/downloads/bcd/1.0.0/linux-amd64", map[string]string{"Range": "bytes=2-4"})
	if resp.StatusCode != http.StatusPartialContent || body != "234" {
		t.Errorf("range: %d %q, want 206 \"234\"", resp.StatusCode, body)
	}
	resp, err := http.Head(base + "/downloads/bcd/1.0.0/linux-amd64")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 10 {
		t.Errorf("HEAD: %d length %d", resp.StatusCode, resp.ContentLength)
	}
	resp, err = http.Post(base+"/downloads/bcd/1.0.0/linux-amd64", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}
}

func TestBlobOnly(t *testing.T) {
	blobs := t.TempDir()
	write(t, filepath.Join(blobs, "bcx-ipmi/2.0.0/bcx-ipmi_2.0.0_linux_amd64.tar.gz"), "tgz")
	base := serve(t, Options{Blob: DirBlobs(blobs)})
	for _, v := range []string{"2.0.0", "v2.0.0"} {
		if resp, body := get(t, base, "/downloads/bcx-ipmi/"+v+"/linux-amd64", nil); resp.StatusCode != 200 || body != "tgz" {
			t.Errorf("blob only, version %s: %d %q", v, resp.StatusCode, body)
		}
	}
	if resp, _ := get(t, base, "/downloads/bcd/2.0.0/linux-amd64", nil); resp.StatusCode != 404 {
		t.Errorf("blob only, missing: %d", resp.StatusCode)
	}
}

type failingBlobs struct{}

func (failingBlobs) Open(context.Context, string) (Blob, error) {
	return nil, errors.New("blob store down")
}

func TestBlobErrorIsNotServedFromDir(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "bcd_1.0.0_linux_amd64"), "x")
	base := serve(t, Options{Dir: dir, Blob: failingBlobs{}})
	// A failing blob store is not a missing file: answering from dir could
	// serve a stale binary the blob store has replaced.
	if resp, _ := get(t, base, "/downloads/bcd/1.0.0/linux-amd64", nil); resp.StatusCode != 404 {
		t.Errorf("got %d, want 404", resp.StatusCode)
	}
}

func TestInvalidConfig(t *testing.T) {
	for name, o := range map[string]Options{
		"neither":      {},
		"base slash":   {Dir: t.TempDir(), BasePath: "/p/"},
		"base no root": {Dir: t.TempDir(), BasePath: "p"},
		"missing dir":  {Dir: filepath.Join(t.TempDir(), "nope")},
	} {
		_, err := New(o)
		var e *protocol.ErrorResponse
		if !errors.As(err, &e) || e.Code != protocol.CodeInvalidConfig {
			t.Errorf("%s: New err = %v, want INVALID_CONFIG", name, err)
		}
	}
}

func TestParsePathStripsOneV(t *testing.T) {
	for path, want := range map[string]Route{
		"bcd/v0.1.0/linux-amd64": {Product: "bcd", Version: "0.1.0", OS: "linux", Arch: "amd64", File: "bcd_0.1.0_linux_amd64"},
		"bcd/0.1.0/linux-amd64":  {Product: "bcd", Version: "0.1.0", OS: "linux", Arch: "amd64", File: "bcd_0.1.0_linux_amd64"},
		"bcx-ipmi/v1.2.3-rc.1/linux-arm64": {Product: "bcx-ipmi", Version: "1.2.3-rc.1", OS: "linux", Arch: "arm64",
			File: "bcx-ipmi_1.2.3-rc.1_linux_arm64.tar.gz"},
	} {
		got, ok := ParsePath(path)
		if !ok || got != want {
			t.Errorf("ParsePath(%q) = %+v, %v; want %+v", path, got, ok, want)
		}
	}
	r, _ := ParsePath("bcd/v0.1.0/linux-amd64")
	if r.Key() != "bcd/0.1.0/bcd_0.1.0_linux_amd64" {
		t.Errorf("blob key %q", r.Key())
	}
}

func FuzzParsePath(f *testing.F) {
	for _, s := range []string{"bcd/0.1.0/linux-amd64", "bcx-ipmi/v1.2.3-rc.1+b.5/linux-arm64", "bcd/../x/linux-amd64", "bcd/%2e%2e/linux-amd64"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, ok := ParsePath(s)
		if !ok {
			return
		}
		for _, bad := range []string{"/", "\\", "%", "..", "\x00"} {
			if strings.Contains(r.File, bad) || strings.Contains(r.Version, bad) {
				t.Fatalf("%q gave file %q", s, r.File)
			}
		}
	})
}

// TestHardLinkRefused: os.Root stops a name from leaving the directory, not a
// hard link made inside it to a file elsewhere; such a file, in the directory or
// the blob store, is 404 to the client and logged for the operator.
func TestHardLinkRefused(t *testing.T) {
	tmp := t.TempDir()
	dir := filepath.Join(tmp, "dl")
	blobs := filepath.Join(tmp, "blobs")
	outside := filepath.Join(tmp, "secret")
	write(t, outside, "SECRET")
	write(t, filepath.Join(dir, "bcd_0.1.0_linux_arm64"), "bcd arm64 from dir")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(blobs, "bcd/0.4.1"), 0o755))
	must(os.Link(outside, filepath.Join(dir, "bcd_0.4.0_linux_amd64")))
	must(os.Link(outside, filepath.Join(blobs, "bcd/0.4.1/bcd_0.4.1_linux_amd64")))
	var logged strings.Builder
	base := serve(t, Options{Dir: dir, Blob: DirBlobs(blobs), Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	for _, path := range []string{"/downloads/bcd/0.4.0/linux-amd64", "/downloads/bcd/0.4.1/linux-amd64"} {
		resp, body := get(t, base, path, nil)
		if resp.StatusCode != 404 || strings.Contains(body, "SECRET") {
			t.Errorf("GET %s: %d %q, want 404 without the file outside", path, resp.StatusCode, body)
		}
	}
	if got := strings.Count(logged.String(), "has 3 links; it must have one"); got != 2 {
		t.Errorf("log has %d refusals naming the links, want 2:\n%s", got, logged.String())
	}
	// A file with one link beside them is served.
	if resp, body := get(t, base, "/downloads/bcd/0.1.0/linux-arm64", nil); resp.StatusCode != 200 || body != "bcd arm64 from dir" {
		t.Errorf("GET the single-link file: %d %q", resp.StatusCode, body)
	}
}
