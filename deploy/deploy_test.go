package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

// fakeMachine records what a deploy asks of the machine instead of doing it.
type fakeMachine struct {
	mu                           sync.Mutex
	kernel, initrd               []byte
	hasInitrd                    bool
	cmdline                      string
	loads, execs, reboots, downs int
}

func (m *fakeMachine) KexecLoad(kernel, initrd *os.File, cmdline string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var err error
	if m.kernel, err = io.ReadAll(kernel); err != nil {
		return err
	}
	m.hasInitrd = initrd != nil
	if initrd != nil {
		if m.initrd, err = io.ReadAll(initrd); err != nil {
			return err
		}
	}
	m.cmdline = cmdline
	m.loads++
	return nil
}
func (m *fakeMachine) KexecExec() error { m.mu.Lock(); m.execs++; m.mu.Unlock(); return nil }
func (m *fakeMachine) Reboot() error    { m.mu.Lock(); m.reboots++; m.mu.Unlock(); return nil }
func (m *fakeMachine) PowerOff() error  { m.mu.Lock(); m.downs++; m.mu.Unlock(); return nil }

// compressed returns the image in a format, made once per image and format.
var (
	compMu    sync.Mutex
	compCache = map[string][]byte{}
)

func compressed(t testing.TB, img *testImage, format string) []byte {
	t.Helper()
	key := img.path + "|" + format
	compMu.Lock()
	defer compMu.Unlock()
	if b, ok := compCache[key]; ok {
		return b
	}
	raw, err := os.ReadFile(img.path)
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	switch format {
	case protocol.FormatRaw:
		out = raw
	case protocol.FormatGzip:
		var buf bytes.Buffer
		w, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
		w.Write(raw)
		w.Close()
		out = buf.Bytes()
	case protocol.FormatZstd:
		enc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
		out = enc.EncodeAll(raw, nil)
	case protocol.FormatXZ:
		testenv.NeedTool(t, "xz")
		cmd := exec.Command("xz", "-c", "-1", "-T2", "--block-size=4MiB")
		cmd.Stdin = bytes.NewReader(raw)
		if out, err = cmd.Output(); err != nil {
			t.Fatalf("xz: %v", err)
		}
	default:
		t.Fatalf("format %s", format)
	}
	compCache[key] = out
	return out
}

// behaviour is how the test server misbehaves.
type behaviour int

const (
	serveOK          behaviour = iota
	serveChunked               // no Content-Length
	serveTruncated             // no Content-Length, stops halfway
	serveAbortHalf             // Content-Length, half the body, then the connection drops
	serve500                   // HTTP 500 at once
	serveShortLength           // Content-Length and body both half
	serveStallHalf             // half the body, then nothing
	serveExtra                 // no Content-Length, the body and then more
)

type server struct {
	*httptest.Server
	hits atomic.Int64
}

func serve(t testing.TB, body []byte, how behaviour, tlsServer bool) *server {
	t.Helper()
	s := &server{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		half := body[:len(body)/2]
		fl := w.(http.Flusher)
		switch how {
		case serveOK:
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write(body)
		case serveChunked:
			w.Write(body)
		case serveTruncated:
			w.Write(half)
		case serveAbortHalf:
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.Write(half)
			fl.Flush()
			panic(http.ErrAbortHandler)
		case serve500:
			http.Error(w, "boom", http.StatusInternalServerError)
		case serveShortLength:
			w.Header().Set("Content-Length", fmt.Sprint(len(half)))
			w.Write(half)
		case serveStallHalf:
			w.Write(half)
			fl.Flush()
			<-r.Context().Done()
		case serveExtra:
			w.Write(body)
			w.Write([]byte("trailing bytes"))
		}
	})
	if tlsServer {
		s.Server = httptest.NewTLSServer(h)
	} else {
		s.Server = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s
}

func testDeployer(m *fakeMachine) *Deployer {
	return &Deployer{
		AllowHTTP:       true,
		AllowFileTarget: true,
		Machine:         m,
		Disks:           func() ([]Disk, error) { return nil, errors.New("no disk list in this test") },
		ProcCmdline:     "/nonexistent",
	}
}

func params(u string, body []byte, format string, imageSize int64, target string) Request {
	p := Request{
		Image:  Image{URL: u, SHA256: sha(body), Size: int64(len(body)), Format: format},
		Target: Target{Path: target},
	}
	if format != protocol.FormatRaw {
		p.Image.ImageSize = imageSize
	}
	return p
}

func smallImage(t testing.TB) *testImage {
	return image(t, imageOpts{cmdlineFile: true})
}

func fat32Image(t testing.TB) *testImage {
	return image(t, imageOpts{fat32: true, bls: true, namedRoot: true, slowLink: true})
}

// TestDeployFormats: every format lands on the target byte for byte.
func TestDeployFormats(t *testing.T) {
	img := smallImage(t)
	for _, tc := range []struct {
		name, format, declared string
		pureXZ                 bool
	}{
		{"raw", protocol.FormatRaw, protocol.FormatRaw, false},
		{"gzip", protocol.FormatGzip, protocol.FormatGzip, false},
		{"xz", protocol.FormatXZ, protocol.FormatXZ, false},
		{"xz-pure-go", protocol.FormatXZ, protocol.FormatXZ, true},
		{"zstd", protocol.FormatZstd, protocol.FormatZstd, false},
		{"zstd-detected", protocol.FormatZstd, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := compressed(t, img, tc.format)
			srv := serve(t, body, serveOK, false)
			target := filepath.Join(t.TempDir(), "disk.img")
			d := testDeployer(&fakeMachine{})
			d.PureGoXZ = tc.pureXZ
			var last Progress
			var calls int
			p := params(srv.URL+"/disk.img", body, tc.declared, img.size, target)
			if tc.declared == "" {
				p.Image.ImageSize = img.size
			}
			res, err := d.Deploy(context.Background(), p, func(pr Progress) { last = pr; calls++ })
			if err != nil {
				t.Fatal(err)
			}
			if got := fileSHA(t, target); got != img.sha256 {
				t.Errorf("target sha256 %s, image %s", got, img.sha256)
			}
			if res.SHA256 != sha(body) || res.Size != int64(len(body)) || res.ImageSize != img.size {
				t.Errorf("result %+v", res)
			}
			if last.Stage != StageDone || last.Done != img.size || last.Total != img.size || calls < 3 {
				t.Errorf("last progress %+v after %d calls", last, calls)
			}
			if !res.RootFound || res.Root.Number != 2 || res.ESP.Number != 1 || res.PartUUID != img.rootGUID {
				t.Errorf("root %+v (%v, %s), esp %+v; want partitions 2 (%s) and 1", res.Root, res.RootFound, res.PartUUID, res.ESP, img.rootGUID)
			}
			if res.After != protocol.AfterNone || res.Target.Path != target {
				t.Errorf("after %q, target %+v", res.After, res.Target)
			}
		})
	}
}

// TestDeploySparse: zero blocks are not written to a fresh target, so a mostly
// empty image takes little space, and the bytes still match.
func TestDeploySparse(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	target := filepath.Join(t.TempDir(), "disk.img")
	if _, err := testDeployer(&fakeMachine{}).Deploy(context.Background(), params(srv.URL, body, protocol.FormatZstd, img.size, target), nil); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(target, &st); err != nil {
		t.Fatal(err)
	}
	var ist syscall.Stat_t
	if err := syscall.Stat(img.path, &ist); err != nil {
		t.Fatal(err)
	}
	allocated := st.Blocks * 512
	t.Logf("image %d bytes, %d allocated in the source, %d in the target", img.size, ist.Blocks*512, allocated)
	if allocated > img.size/3 {
		t.Errorf("target has %d of %d bytes allocated: zero blocks were written", allocated, img.size)
	}
	if fileSHA(t, target) != img.sha256 {
		t.Error("target differs from the image")
	}
}

// unbootable checks that the target has no partition table left: its first and
// last MiB are zero, so there is neither a protective MBR nor a GPT header.
func unbootable(t *testing.T, target string) {
	t.Helper()
	b, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) == 0 {
		return
	}
	head, tail := b[:min(len(b), wipeSize)], b[max(0, len(b)-wipeSize):]
	if !allZero(head) || !allZero(tail) {
		t.Errorf("target %s: first or last MiB not zero", target)
	}
	if _, err := ReadPartitionTable(bytes.NewReader(b), int64(len(b)), 0); err == nil {
		t.Errorf("target %s still has a partition table", target)
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// TestDeployBadStreams: a stream that is truncated, wrong, corrupt or cut off
// fails with an error that names the URL (without its secrets) and both digests,
// and leaves a target that cannot boot.
func TestDeployBadStreams(t *testing.T) {
	img := smallImage(t)
	formats := []string{protocol.FormatRaw, protocol.FormatGzip, protocol.FormatXZ, protocol.FormatZstd}
	for _, format := range formats {
		good := compressed(t, img, format)
		corrupt := bytes.Clone(good)
		// Flip bytes well inside the compressed data, past any header.
		for i := len(corrupt) / 3; i < len(corrupt)/3+64; i++ {
			corrupt[i] ^= 0x5a
		}
		for _, tc := range []struct {
			name   string
			body   []byte
			how    behaviour
			digest string // declared; "" means the served body's
			reason string
			// wrote: the failure comes after writing began (the target is wiped);
			// otherwise the target was never touched.
			wrote bool
		}{
			{"truncated", good, serveTruncated, sha(good), protocol.DeployReasonSize, true},
			{"wrong-digest", good, serveOK, strings.Repeat("ab", 32), protocol.DeployReasonDigest, true},
			{"garbage", corrupt, serveOK, "", protocol.DeployReasonDecompress, true},
			{"abort-mid-stream", good, serveAbortHalf, "", protocol.DeployReasonDownload, true},
			{"status-500", good, serve500, "", protocol.DeployReasonDownload, false},
			{"short-content-length", good, serveShortLength, "", protocol.DeployReasonSize, false},
			{"extra-bytes", good, serveExtra, "", protocol.DeployReasonSize, true},
		} {
			if format == protocol.FormatRaw && tc.name == "garbage" {
				continue // raw has no structure to corrupt: the digest catches it
			}
			t.Run(format+"/"+tc.name, func(t *testing.T) {
				srv := serve(t, tc.body, tc.how, false)
				dir := t.TempDir()
				target := filepath.Join(dir, "disk.img")
				// The target holds a previous OS.
				previous := bytes.Repeat([]byte("old OS "), 1<<20)
				if err := os.WriteFile(target, previous, 0o600); err != nil {
					t.Fatal(err)
				}
				u, _ := url.Parse(srv.URL + "/images/disk.img?X-Amz-Signature=secretsig")
				u.User = url.UserPassword("user", "secretpass")
				p := params(u.String(), good, format, img.size, target)
				if tc.digest == "" {
					p.Image.SHA256 = sha(tc.body)
				} else {
					p.Image.SHA256 = tc.digest
				}
				var logs bytes.Buffer
				d := testDeployer(&fakeMachine{})
				d.Log = slog.New(slog.NewTextHandler(&logs, nil))
				_, err := d.Deploy(context.Background(), p, nil)
				if err == nil {
					t.Fatal("deploy succeeded")
				}
				msg := err.Error()
				t.Log(msg)
				if Reason(err) != tc.reason {
					t.Errorf("reason %s, want %s", Reason(err), tc.reason)
				}
				for _, secret := range []string{"secretsig", "secretpass", "user:"} {
					if strings.Contains(msg, secret) || strings.Contains(logs.String(), secret) {
						t.Errorf("error or log carries %q", secret)
					}
				}
				if !strings.Contains(msg, srv.URL+"/images/disk.img") {
					t.Errorf("error does not name the URL: %s", msg)
				}
				var se *StreamError
				if !errors.As(err, &se) {
					if tc.name != "status-500" {
						t.Errorf("not a StreamError: %T", err)
					}
				} else {
					if se.ExpectedSHA256 != p.Image.SHA256 || !strings.Contains(msg, p.Image.SHA256) {
						t.Errorf("expected digest %s not in the error", p.Image.SHA256)
					}
					if tc.wrote && se.Received > 0 {
						if want := sha(tc.body[:se.Received]); se.ActualSHA256 != want || !strings.Contains(msg, want) {
							t.Errorf("actual digest %s, want %s over the %d bytes received", se.ActualSHA256, want, se.Received)
						}
					}
				}
				if tc.wrote {
					unbootable(t, target)
				} else if b, _ := os.ReadFile(target); !bytes.Equal(b, previous) {
					t.Error("a deploy refused before writing changed the target")
				}
			})
		}
	}
}

// TestDeployPolicy: what the agent refuses before fetching anything.
func TestDeployPolicy(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatRaw)
	srv := serve(t, body, serveOK, false)
	zst := compressed(t, img, protocol.FormatZstd)
	zsrv := serve(t, zst, serveOK, false)
	target := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		d      func(*Deployer)
		p      func(*Request)
		reason string
		want   string
	}{
		{"http refused", func(d *Deployer) { d.AllowHTTP = false }, nil, protocol.DeployReasonInvalid, "http is not allowed"},
		{"file target refused", func(d *Deployer) { d.AllowFileTarget = false }, nil, protocol.DeployReasonNoDisk, "is a file, not a disk"},
		{"bad sha", nil, func(p *Request) { p.Image.SHA256 = "abc" }, protocol.DeployReasonInvalid, "image.sha256"},
		{"zstd declared raw", nil, func(p *Request) {
			p.Image.URL, p.Image.SHA256, p.Image.Size = zsrv.URL, sha(zst), int64(len(zst))
		}, protocol.DeployReasonDecompress, "declared raw, but the stream starts like raw.zst"},
		{"raw declared zstd", nil, func(p *Request) {
			p.Image.Format, p.Image.ImageSize = protocol.FormatZstd, img.size
		}, protocol.DeployReasonDecompress, "does not start with its magic"},
		{"compressed without image_size", nil, func(p *Request) {
			p.Image.URL, p.Image.SHA256, p.Image.Size, p.Image.Format = zsrv.URL, sha(zst), int64(len(zst)), ""
		}, protocol.DeployReasonInvalid, "image_size: required"},
		{"bad file path", nil, func(p *Request) {
			p.Files = []File{{Path: "/etc/../shadow"}}
		}, protocol.DeployReasonInvalid, "not a clean path"},
		{"kernel without root", nil, func(p *Request) {
			p.After = After{Action: protocol.AfterKexec, Initrd: "/x"}
		}, protocol.DeployReasonInvalid, "after.initrd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDeployer(&fakeMachine{})
			if tc.d != nil {
				tc.d(d)
			}
			p := params(srv.URL, body, protocol.FormatRaw, img.size, target)
			if tc.p != nil {
				tc.p(&p)
			}
			_, err := d.Deploy(context.Background(), p, nil)
			if err == nil || Reason(err) != tc.reason || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v (reason %s), want %s containing %q", err, Reason(err), tc.reason, tc.want)
			}
		})
	}
}

// TestDeployCancelAndStall: a cancelled deploy and a download that stops both
// fail and leave the target unbootable.
func TestDeployCancelAndStall(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatRaw)
	t.Run("stall", func(t *testing.T) {
		srv := serve(t, body, serveStallHalf, false)
		target := filepath.Join(t.TempDir(), "disk.img")
		d := testDeployer(&fakeMachine{})
		d.StallTimeout = 300 * time.Millisecond
		_, err := d.Deploy(context.Background(), params(srv.URL, body, protocol.FormatRaw, img.size, target), nil)
		if err == nil || Reason(err) != protocol.DeployReasonDownload || !strings.Contains(err.Error(), "nothing received for") {
			t.Fatalf("err %v", err)
		}
		unbootable(t, target)
	})
	t.Run("cancel", func(t *testing.T) {
		srv := serve(t, body, serveStallHalf, false)
		target := filepath.Join(t.TempDir(), "disk.img")
		ctx, cancel := context.WithCancel(context.Background())
		d := testDeployer(&fakeMachine{})
		d.ProgressInterval = time.Millisecond
		var once sync.Once
		_, err := d.Deploy(ctx, params(srv.URL, body, protocol.FormatRaw, img.size, target), func(p Progress) {
			if p.Done > 0 {
				once.Do(func() { time.AfterFunc(50*time.Millisecond, cancel) })
			}
		})
		if err == nil || Reason(err) != protocol.DeployReasonCancelled {
			t.Fatalf("err %v (reason %s)", err, Reason(err))
		}
		unbootable(t, target)
	})
}

// TestDeployHTTPSAndProxy: an https server verified against given roots, and an
// http image fetched through a forward proxy on loopback.
func TestDeployHTTPSAndProxy(t *testing.T) {
	img := smallImage(t)
	body := compressed(t, img, protocol.FormatZstd)
	t.Run("https", func(t *testing.T) {
		srv := serve(t, body, serveOK, true)
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		target := filepath.Join(t.TempDir(), "disk.img")
		d := testDeployer(&fakeMachine{})
		d.AllowHTTP = false
		d.TLSConfig = &tls.Config{RootCAs: pool}
		if _, err := d.Deploy(context.Background(), params(srv.URL, body, protocol.FormatZstd, img.size, target), nil); err != nil {
			t.Fatal(err)
		}
		if fileSHA(t, target) != img.sha256 {
			t.Error("target differs")
		}
		// Without the roots the server is not trusted.
		d.TLSConfig = nil
		_, err := d.Deploy(context.Background(), params(srv.URL, body, protocol.FormatZstd, img.size, target), nil)
		if err == nil || Reason(err) != protocol.DeployReasonDownload || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("untrusted server: %v", err)
		}
	})
	t.Run("proxy", func(t *testing.T) {
		srv := serve(t, body, serveOK, false)
		var proxied atomic.Int64
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !r.URL.IsAbs() {
				http.Error(w, "not a proxy request", http.StatusBadRequest)
				return
			}
			proxied.Add(1)
			out, err := http.NewRequestWithContext(r.Context(), r.Method, r.URL.String(), nil)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			resp, err := http.DefaultTransport.RoundTrip(out)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer resp.Body.Close()
			w.Header().Set("Content-Length", resp.Header.Get("Content-Length"))
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
		}))
		defer proxy.Close()
		target := filepath.Join(t.TempDir(), "disk.img")
		d := testDeployer(&fakeMachine{})
		p := params(srv.URL, body, protocol.FormatZstd, img.size, target)
		p.Proxy = proxy.URL
		if _, err := d.Deploy(context.Background(), p, nil); err != nil {
			t.Fatal(err)
		}
		if proxied.Load() != 1 || srv.hits.Load() != 1 {
			t.Errorf("proxy saw %d requests, server %d", proxied.Load(), srv.hits.Load())
		}
		// The Deployer's own proxy applies when the params name none.
		pu, _ := url.Parse(proxy.URL)
		d.Proxy = pu
		p.Proxy = ""
		if _, err := d.Deploy(context.Background(), p, nil); err != nil {
			t.Fatal(err)
		}
		if proxied.Load() != 2 {
			t.Errorf("proxy saw %d requests, want 2", proxied.Load())
		}
	})
}
