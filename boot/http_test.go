package boot

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/ipxe"
)

var testParams = ipxe.Params{
	GatewayURL:        "https://gw.eu.example.com",
	ServerName:        "gw.eu.example.com",
	Site:              "site_01k5w",
	ServingCAPin:      "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
	JoinSigningPin:    "sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
	JoinEncryptionPin: "sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=",
}

// countingMinter mints nonce-1, nonce-2, … and remembers for whom.
type countingMinter struct {
	mu   sync.Mutex
	macs []string
}

func (m *countingMinter) MintNonce(mac net.HardwareAddr) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.macs = append(m.macs, mac.String())
	return fmt.Sprintf("nonce-%d", len(m.macs)), nil
}

type httpHarness struct {
	srv    *HTTPServer
	base   string
	minter *countingMinter
	events *recorder
	files  map[string][]byte
}

var (
	localMAC   = mustMAC("52:54:00:00:00:02")
	customMAC  = mustMAC("52:54:00:00:00:03")
	unknownMAC = mustMAC("52:54:00:00:00:ff")
)

func startHTTP(t testing.TB, configure func(*HTTPServer)) *httpHarness {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{
		"vmlinuz":  bytes.Repeat([]byte("kernel!"), 100000),
		"initrd":   bytes.Repeat([]byte("initramfs"), 300000),
		"ipxe.efi": []byte("MZ ipxe efi"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	var tab MemTable
	if err := tab.Set(map[string]Entry{
		testMAC.String():   {Mode: ModeRamdisk},
		localMAC.String():  {Mode: ModeLocal},
		customMAC.String(): {Mode: ModeRamdisk, Kernel: base + "/ramdisk/vmlinuz?v=2", Cmdline: "bcd_debug=1"},
	}); err != nil {
		t.Fatal(err)
	}
	h := &httpHarness{base: base, minter: &countingMinter{}, events: &recorder{}, files: files}
	h.srv = &HTTPServer{
		URL:        base,
		Table:      &tab,
		Params:     testParams,
		Kernel:     base + "/ramdisk/vmlinuz",
		Initrd:     base + "/ramdisk/initrd",
		Cmdline:    "console=ttyS0,115200",
		RamdiskDir: dir,
		Nonces:     h.minter,
		Observer:   h.events,
	}
	if configure != nil {
		configure(h.srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return h
}

func (h *httpHarness) do(t testing.TB, method, path string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, h.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// TestHTTPScripts fetches each kind of script whole. One ramdisk script serves BIOS
// and UEFI alike: its kernel line names the initrd (initrd=initrd), which UEFI's EFI
// stub needs and a BIOS boot ignores.
func TestHTTPScripts(t *testing.T) {
	h := startHTTP(t, nil)
	b := h.base
	ramdisk := `#!ipxe
echo bcd: 52:54:00:12:34:56: booting the ramdisk
kernel ` + b + `/ramdisk/vmlinuz initrd=initrd console=ttyS0,115200 bcd.gateway_url=https://gw.eu.example.com bcd.server_name=gw.eu.example.com bcd.site=site_01k5w bcd.serving_ca_pin=sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= bcd.join_signing_pin=sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= bcd.join_encryption_pin=sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg= bcd.boot_nonce=nonce-1 || goto failed
initrd --name initrd ` + b + `/ramdisk/initrd || goto failed
boot || goto failed
:failed
echo bcd: 52:54:00:12:34:56: loading the ramdisk failed, retrying in 10 s
imgfree
sleep 10
chain --replace --autofree ` + b + `/ipxe/52:54:00:12:34:56.ipxe
`
	custom := `#!ipxe
echo bcd: 52:54:00:00:00:03: booting the ramdisk
kernel ` + b + `/ramdisk/vmlinuz?v=2 initrd=initrd console=ttyS0,115200 bcd_debug=1 bcd.gateway_url=https://gw.eu.example.com bcd.server_name=gw.eu.example.com bcd.site=site_01k5w bcd.serving_ca_pin=sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU= bcd.join_signing_pin=sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA= bcd.join_encryption_pin=sha256/n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg= bcd.boot_nonce=nonce-2 || goto failed
initrd --name initrd ` + b + `/ramdisk/initrd || goto failed
boot || goto failed
:failed
echo bcd: 52:54:00:00:00:03: loading the ramdisk failed, retrying in 10 s
imgfree
sleep 10
chain --replace --autofree ` + b + `/ipxe/52:54:00:00:00:03.ipxe
`
	local := `#!ipxe
echo bcd: 52:54:00:00:00:02: booting from the local disk
iseq ${platform} efi && goto efi ||
sanboot --no-describe --drive 0x80 ||
echo bcd: 52:54:00:00:00:02: no bootable disk 0x80, handing back to the BIOS
exit 1
:efi
# An error makes the firmware try the next boot option (the disk); success would
# open its boot manager menu instead.
exit 1
`
	unknown := `#!ipxe
echo bcd: 52:54:00:00:00:ff has no boot entry on this site, retrying in 30 s
sleep 30
chain --replace --autofree ` + b + `/ipxe/52:54:00:00:00:ff.ipxe
`
	for _, tc := range []struct{ path, want string }{
		{"/ipxe/52:54:00:12:34:56.ipxe", ramdisk},
		{"/ipxe/52-54-00-00-00-03.ipxe", custom}, // dashes, and the entry's own kernel and arguments
		{"/ipxe/52:54:00:00:00:02.ipxe", local},
		{"/ipxe/52:54:00:00:00:FF.ipxe", unknown}, // upper case
	} {
		resp, body := h.do(t, "GET", tc.path)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %s", tc.path, resp.Status)
			continue
		}
		if ct, cc := resp.Header.Get("Content-Type"), resp.Header.Get("Cache-Control"); ct != "text/plain; charset=utf-8" || cc != "no-store" {
			t.Errorf("%s: Content-Type %q Cache-Control %q", tc.path, ct, cc)
		}
		if diff := cmp.Diff(tc.want, string(body)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.path, diff)
		}
	}
	var got []string
	for _, e := range h.events.all() {
		got = append(got, fmt.Sprintf("%s %s %s %s %q %s", e.Served, e.MAC, e.IP, e.File, e.Mode, e.Nonce))
	}
	want := []string{
		"script 52:54:00:12:34:56 127.0.0.1 /ipxe/52:54:00:12:34:56.ipxe \"ramdisk\" nonce-1",
		"script 52:54:00:00:00:03 127.0.0.1 /ipxe/52-54-00-00-00-03.ipxe \"ramdisk\" nonce-2",
		"script 52:54:00:00:00:02 127.0.0.1 /ipxe/52:54:00:00:00:02.ipxe \"local\" ",
		"script 52:54:00:00:00:ff 127.0.0.1 /ipxe/52:54:00:00:00:FF.ipxe \"\" ",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestHTTPNoncePerRender: every fetch of a ramdisk script mints a nonce of its
// own; HEAD and the other scripts mint none.
func TestHTTPNoncePerRender(t *testing.T) {
	h := startHTTP(t, nil)
	path := "/ipxe/52:54:00:12:34:56.ipxe"
	_, first := h.do(t, "GET", path)
	resp, _ := h.do(t, "HEAD", path)
	_, second := h.do(t, "GET", path)
	h.do(t, "GET", "/ipxe/52:54:00:00:00:02.ipxe")
	h.do(t, "GET", "/ipxe/52:54:00:00:00:ff.ipxe")
	if resp.StatusCode != 200 {
		t.Errorf("HEAD: %s", resp.Status)
	}
	if !strings.Contains(string(first), "bcd.boot_nonce=nonce-1 ") || !strings.Contains(string(second), "bcd.boot_nonce=nonce-2 ") {
		t.Errorf("nonces not fresh per render:\n%s\n%s", first, second)
	}
	if diff := cmp.Diff([]string{testMAC.String(), testMAC.String()}, h.minter.macs); diff != "" {
		t.Errorf("minted for (-want +got):\n%s", diff)
	}
}

// TestHTTPRefusesBadParameters: a value that does not fit on a kernel command line
// fails the script with 500, mints no nonce and logs which parameter.
func TestHTTPRefusesBadParameters(t *testing.T) {
	for _, tc := range []struct {
		name      string
		configure func(*HTTPServer)
	}{
		{"site with a space", func(s *HTTPServer) { s.Params.Site = "fsn 1" }},
		{"server name with a quote", func(s *HTTPServer) { s.Params.ServerName = `gw"x` }},
		{"cmdline with a quote", func(s *HTTPServer) { s.Cmdline = `init="/bin/sh"` }},
		{"kernel URL with a space", func(s *HTTPServer) { s.Kernel = "http://10.0.0.1/vm linuz" }},
		{"minter failing", func(s *HTTPServer) {
			s.Nonces = NonceMinterFunc(func(net.HardwareAddr) (string, error) { return "", fmt.Errorf("store full") })
		}},
		{"minter minting garbage", func(s *HTTPServer) {
			s.Nonces = NonceMinterFunc(func(net.HardwareAddr) (string, error) { return "a b", nil })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHTTP(t, tc.configure)
			resp, body := h.do(t, "GET", "/ipxe/52:54:00:12:34:56.ipxe")
			if resp.StatusCode != 500 || strings.Contains(string(body), "#!ipxe") {
				t.Errorf("%s: %q", resp.Status, body)
			}
			if strings.HasPrefix(tc.name, "minter") {
				return
			}
			if len(h.minter.macs) != 0 {
				t.Errorf("a nonce was minted for a script that was refused")
			}
			// The other scripts do not depend on the parameters.
			if resp, _ := h.do(t, "GET", "/ipxe/52:54:00:00:00:02.ipxe"); resp.StatusCode != 200 {
				t.Errorf("local script: %s", resp.Status)
			}
		})
	}
}

func TestHTTPServesOnlyItsPaths(t *testing.T) {
	h := startHTTP(t, nil)
	for _, path := range []string{
		"/",
		"/ipxe/",
		"/ipxe/52:54:00:12:34.ipxe",
		"/ipxe/52:54:00:12:34:56:78.ipxe",
		"/ipxe/525400123456.ipxe",
		"/ipxe/52:54-00:12:34:56.ipxe",
		"/ipxe/zz:54:00:12:34:56.ipxe",
		"/ipxe/52:54:00:12:34:56",
		"/ipxe/52:54:00:12:34:56.ipxe/x",
		"/ipxe/ipxe.efi", // no BinDir configured
		"/ramdisk/",
		"/ramdisk/other",
		"/ramdisk/vmlinuz/",
		"/ramdisk/../ramdisk/vmlinuz.bak",
		"/ramdisk/%2e%2e/secret",
		"/etc/passwd",
	} {
		if resp, _ := h.do(t, "GET", path); resp.StatusCode != 404 {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
	if resp, _ := h.do(t, "POST", "/ipxe/52:54:00:12:34:56.ipxe"); resp.StatusCode != 405 {
		t.Errorf("POST: %s", resp.Status)
	}
	if len(h.minter.macs) != 0 {
		t.Error("a refused request minted a nonce")
	}
}

func TestHTTPRamdiskFiles(t *testing.T) {
	h := startHTTP(t, func(s *HTTPServer) { s.BinDir = s.RamdiskDir })
	for _, tc := range []struct{ path, file string }{
		{"/ramdisk/vmlinuz", "vmlinuz"},
		{"/ramdisk/initrd", "initrd"},
		{"/ipxe/ipxe.efi", "ipxe.efi"},
	} {
		resp, body := h.do(t, "GET", tc.path)
		if resp.StatusCode != 200 || !bytes.Equal(body, h.files[tc.file]) {
			t.Errorf("GET %s: %s, %d bytes", tc.path, resp.Status, len(body))
		}
		if resp.Header.Get("ETag") == "" || resp.Header.Get("Accept-Ranges") != "bytes" {
			t.Errorf("GET %s: ETag %q Accept-Ranges %q", tc.path, resp.Header.Get("ETag"), resp.Header.Get("Accept-Ranges"))
		}
	}
	kernel := h.files["vmlinuz"]
	resp, body := h.do(t, "GET", "/ramdisk/vmlinuz", "Range", "bytes=1000-1999")
	if resp.StatusCode != 206 || !bytes.Equal(body, kernel[1000:2000]) {
		t.Errorf("range: %s %d bytes", resp.Status, len(body))
	}
	if cr := resp.Header.Get("Content-Range"); cr != fmt.Sprintf("bytes 1000-1999/%d", len(kernel)) {
		t.Errorf("Content-Range %q", cr)
	}
	etag := resp.Header.Get("ETag")
	resp, body = h.do(t, "GET", "/ramdisk/vmlinuz", "Range", fmt.Sprintf("bytes=%d-", len(kernel)-10), "If-Range", etag)
	if resp.StatusCode != 206 || !bytes.Equal(body, kernel[len(kernel)-10:]) {
		t.Errorf("If-Range with the current ETag: %s %d bytes", resp.Status, len(body))
	}
	if resp, _ := h.do(t, "GET", "/ramdisk/vmlinuz", "If-None-Match", etag); resp.StatusCode != 304 {
		t.Errorf("If-None-Match: %s", resp.Status)
	}
	if resp, body := h.do(t, "HEAD", "/ramdisk/initrd"); resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != int64(len(h.files["initrd"])) {
		t.Errorf("HEAD: %s %d", resp.Status, resp.ContentLength)
	}
	var served []string
	for _, e := range h.events.all() {
		served = append(served, e.Served+" "+e.File+" "+e.IP.String())
	}
	want := []string{
		"kernel /ramdisk/vmlinuz 127.0.0.1",
		"initrd /ramdisk/initrd 127.0.0.1",
		"http-binary /ipxe/ipxe.efi 127.0.0.1",
		"kernel /ramdisk/vmlinuz 127.0.0.1", // If-None-Match: a new download attempt
	}
	if diff := cmp.Diff(want, served); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestHTTPStatsConcurrent: Stats counts exactly what 8 clients at once were sent,
// by route and status class, and the connections they opened.
func TestHTTPStatsConcurrent(t *testing.T) {
	h := startHTTP(t, func(s *HTTPServer) { s.BinDir = s.RamdiskDir; s.Observer = nil })
	var dials atomic.Uint64
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	c := &http.Client{Transport: tr}
	resp0, _ := h.do(t, "HEAD", "/ramdisk/vmlinuz")
	tag := resp0.Header.Get("ETag")
	before := h.srv.Stats() // the two HEADs above, over http.DefaultClient

	type req struct {
		route, method, path string
		header              []string
		status              int
	}
	reqs := []req{
		{"script", "GET", "/ipxe/52:54:00:12:34:56.ipxe", nil, 200},
		{"kernel", "GET", "/ramdisk/vmlinuz", nil, 200},
		{"kernel", "GET", "/ramdisk/vmlinuz", []string{"If-None-Match", tag}, 304},
		{"initrd", "GET", "/ramdisk/initrd", []string{"Range", "bytes=0-999"}, 206},
		{"initrd", "HEAD", "/ramdisk/initrd", nil, 200},
		{"binary", "GET", "/ipxe/ipxe.efi", nil, 200},
		{"other", "GET", "/nope", nil, 404},
	}
	const clients, rounds = 8, 25
	var mu sync.Mutex
	want := map[string]HTTPRouteStats{}
	var wantStatus [6]uint64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range rounds {
				for _, rq := range reqs {
					r, err := http.NewRequest(rq.method, h.base+rq.path, nil)
					if err != nil {
						t.Error(err)
						return
					}
					for i := 0; i+1 < len(rq.header); i += 2 {
						r.Header.Set(rq.header[i], rq.header[i+1])
					}
					resp, err := c.Do(r)
					if err != nil {
						t.Error(err)
						return
					}
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != rq.status {
						t.Errorf("%s %s: %s, %v", rq.method, rq.path, resp.Status, err)
						return
					}
					mu.Lock()
					w := want[rq.route]
					w.Requests++
					w.Bytes += uint64(n)
					want[rq.route] = w
					wantStatus[rq.status/100]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	tr.CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
	waitForOpen := time.Now().Add(60 * time.Second)
	for h.srv.Stats().Open != 0 && time.Now().Before(waitForOpen) {
		time.Sleep(10 * time.Millisecond)
	}
	got := h.srv.Stats()
	got.Kernel.Requests -= before.Kernel.Requests
	got.Status[2] -= before.Status[2]
	got.Connections -= before.Connections
	if diff := cmp.Diff(want, got.ByRoute()); diff != "" {
		t.Errorf("by route (-want +got):\n%s", diff)
	}
	if got.Status != wantStatus || got.Connections != dials.Load() || got.Open != 0 || got.Stalled != 0 || got.TooSlow != 0 {
		t.Errorf("status %v connections %d open %d stalled %d too slow %d; want status %v, %d connections (the client's dials), none open, none cut",
			got.Status, got.Connections, got.Open, got.Stalled, got.TooSlow, wantStatus, dials.Load())
	}
	if want["kernel"].Bytes != clients*rounds*uint64(len(h.files["vmlinuz"])) || want["initrd"].Bytes != clients*rounds*1000 {
		t.Errorf("the clients themselves were sent %+v", want)
	}
}

// TestHTTPRefusesAHardLink: a ramdisk or iPXE file that is a hard link (here to a
// file outside the directory) is 404, as a FIFO there is, without hanging.
func TestHTTPRefusesAHardLink(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("SECRET"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startHTTP(t, func(s *HTTPServer) { s.BinDir = s.RamdiskDir })
	dir := h.srv.RamdiskDir
	for _, name := range []string{"initrd", "ipxe.efi"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(outside, filepath.Join(dir, "initrd")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "ipxe.efi"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/ramdisk/initrd", "/ipxe/ipxe.efi"} {
		resp, body := h.do(t, "GET", path)
		if resp.StatusCode != 404 || bytes.Contains(body, []byte("SECRET")) {
			t.Errorf("GET %s: %s %q, want 404", path, resp.Status, body)
		}
	}
	if resp, body := h.do(t, "GET", "/ramdisk/vmlinuz"); resp.StatusCode != 200 || !bytes.Equal(body, h.files["vmlinuz"]) {
		t.Errorf("GET the single-link kernel: %s, %d bytes", resp.Status, len(body))
	}
}
