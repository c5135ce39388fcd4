package boot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// HTTPServer serves what iPXE fetches: the per-machine script at
// /ipxe/{mac}.ipxe, the ramdisk at /ramdisk/vmlinuz and /ramdisk/initrd, and, for
// UEFI HTTP boot, the iPXE EFI binaries at /ipxe/{binary}. Any other path is 404.
// It is an http.Handler; ListenAndServe and Serve run it with timeouts. The zero
// value of every optional field means the default.
type HTTPServer struct {
	// Addr is the TCP address ListenAndServe listens on ([boot] listen); empty
	// means ":8080".
	Addr string
	// URL is this server's base URL as machines reach it ([boot] url): a script
	// that retries fetches {URL}/ipxe/{mac}.ipxe again. Required.
	URL string
	// Table says what each MAC boots. Required.
	Table Table
	// Params are the site's bcd.* kernel parameters of every ramdisk script.
	Params ipxe.Params
	// Kernel, Initrd and Cmdline are the ramdisk defaults ([boot] kernel, initrd,
	// cmdline): an entry's own Kernel or Initrd replaces them, its Cmdline is
	// appended.
	Kernel, Initrd, Cmdline string
	// RamdiskDir holds vmlinuz and initrd, served at /ramdisk/vmlinuz and
	// /ramdisk/initrd with range requests; empty serves neither.
	RamdiskDir string
	// BinDir holds the iPXE binaries (the TFTP root), served at /ipxe/{name}: the
	// proxyDHCP hands UEFI HTTP boot clients {URL}/ipxe/{EFIBinary}. Empty serves
	// none.
	BinDir string
	// Nonces mints the boot nonce of each ramdisk script; nil uses protocol.NewBootNonce
	// (the nonce then reaches the site agent only through the Observer).
	Nonces NonceMinter
	// Observer hears of every script, kernel, initrd and binary served; nil
	// discards.
	Observer Observer
	// Logger logs each request at debug level and failures at warn; nil discards.
	Logger *slog.Logger
}

// ListenAndServe listens on Addr and serves until ctx is done.
func (s *HTTPServer) ListenAndServe(ctx context.Context) error {
	addr := cmpOr(s.Addr, ":8080")
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("boot HTTP: listening on %s: %w", addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx is done, then lets running downloads finish for up
// to 5 seconds.
func (s *HTTPServer) Serve(ctx context.Context, ln net.Listener) error {
	if s.URL == "" || s.Table == nil {
		ln.Close()
		return errors.New("boot HTTP: URL and Table are required")
	}
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.logger().Handler(), slog.LevelDebug),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("boot HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	<-errc
	return nil
}

func (s *HTTPServer) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// ServeHTTP routes a request.
func (s *HTTPServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	log := s.logger()
	if log.Enabled(r.Context(), slog.LevelDebug) {
		log.Debug("boot HTTP: request", "from", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "range", r.Header.Get("Range"))
	}
	p := r.URL.Path
	switch {
	case p == "/ramdisk/vmlinuz" && s.RamdiskDir != "":
		s.serveFile(w, r, s.RamdiskDir, "vmlinuz", ServedKernel)
	case p == "/ramdisk/initrd" && s.RamdiskDir != "":
		s.serveFile(w, r, s.RamdiskDir, "initrd", ServedInitrd)
	case strings.HasPrefix(p, "/ipxe/") && strings.HasSuffix(p, ".ipxe"):
		mac, err := protocol.ParseMAC(strings.TrimSuffix(strings.TrimPrefix(p, "/ipxe/"), ".ipxe"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		s.serveScript(w, r, mac)
	case strings.HasPrefix(p, "/ipxe/") && s.BinDir != "" && slices.Contains(ipxe.Binaries, strings.TrimPrefix(p, "/ipxe/")):
		s.serveFile(w, r, s.BinDir, strings.TrimPrefix(p, "/ipxe/"), ServedBinary)
	default:
		http.NotFound(w, r)
	}
}

// remoteIP is the request's source address.
func remoteIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (s *HTTPServer) scriptURL(mac net.HardwareAddr) string {
	return strings.TrimSuffix(s.URL, "/") + "/ipxe/" + mac.String() + ".ipxe"
}

func (s *HTTPServer) serveScript(w http.ResponseWriter, r *http.Request, mac net.HardwareAddr) {
	entry, ok := s.Table.Lookup(mac)
	mode := entry.Mode
	if !ok {
		mode = ""
	}
	var script bytes.Buffer
	var nonce string
	var err error
	switch mode {
	case "":
		err = ipxe.Unknown{MAC: mac.String(), ScriptURL: s.scriptURL(mac)}.Render(&script)
	case ModeLocal:
		err = ipxe.Local{MAC: mac.String()}.Render(&script)
	case ModeRamdisk:
		rd := ipxe.Ramdisk{
			MAC:       mac.String(),
			Kernel:    cmpOr(entry.Kernel, s.Kernel),
			Initrd:    cmpOr(entry.Initrd, s.Initrd),
			Cmdline:   strings.TrimSpace(s.Cmdline + " " + entry.Cmdline),
			Params:    s.Params,
			ScriptURL: s.scriptURL(mac),
			Nonce:     "unminted",
		}
		// Render once without a nonce: a script that cannot be rendered must
		// not cost a nonce the site agent would report.
		if err = rd.Render(&script); err != nil || r.Method == http.MethodHead {
			break
		}
		if nonce, err = s.mintNonce(mac); err != nil {
			break
		}
		rd.Nonce = nonce
		script.Reset()
		err = rd.Render(&script)
	default:
		err = fmt.Errorf("boot entry mode %q is neither %q nor %q", mode, ModeRamdisk, ModeLocal)
	}
	if err != nil {
		s.logger().Warn("boot HTTP: cannot serve the iPXE script", "mac", mac, "mode", mode, "err", err)
		http.Error(w, "this machine's boot script cannot be rendered; see the site agent's log", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store") // every ramdisk script carries a fresh nonce
	h.Set("Content-Length", fmt.Sprint(script.Len()))
	if r.Method == http.MethodHead {
		return
	}
	if _, err := w.Write(script.Bytes()); err != nil {
		return
	}
	if s.Observer != nil {
		s.Observer.Observe(Event{Time: time.Now(), Served: ServedScript, MAC: mac, IP: remoteIP(r), Arch: -1, File: r.URL.Path, Mode: mode, Nonce: nonce})
	}
}

func (s *HTTPServer) mintNonce(mac net.HardwareAddr) (string, error) {
	if s.Nonces == nil {
		return protocol.NewBootNonce()
	}
	n, err := s.Nonces.MintNonce(mac)
	if err != nil {
		return "", fmt.Errorf("minting the boot nonce: %w", err)
	}
	return n, nil
}

// serveFile sends name from dir with range requests and an ETag. name is one of
// a fixed few, never taken from the request.
func (s *HTTPServer) serveFile(w http.ResponseWriter, r *http.Request, dir, name, served string) {
	f, err := os.Open(filepath.Join(dir, name))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.logger().Warn("boot HTTP: cannot open", "file", name, "err", err)
		}
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.Size(), fi.ModTime().UnixNano()))
	if s.Observer != nil && r.Method == http.MethodGet {
		// A download starts once: a range request for a later part is its continuation.
		if rg := r.Header.Get("Range"); rg == "" || strings.HasPrefix(rg, "bytes=0-") {
			s.Observer.Observe(Event{Time: time.Now(), Served: served, IP: remoteIP(r), Arch: -1, File: r.URL.Path})
		}
	}
	http.ServeContent(w, r, name, fi.ModTime(), f)
}
