package boot

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// HTTPServer serves what iPXE fetches: the per-machine script at
// /ipxe/{mac}.ipxe, the ramdisk at /ramdisk/vmlinuz and /ramdisk/initrd, and, for
// UEFI HTTP boot, the iPXE EFI binaries at /ipxe/{binary}. Any other path is 404.
// It is an http.Handler; ListenAndServe and Serve run it with timeouts. The zero
// value of every optional field means the default.
//
// No client can hold a connection for ever: a request's headers must arrive
// within HeaderTimeout, a keep-alive connection is closed after IdleTimeout
// without a request, a response is cut when the client has not taken the next
// 256 KiB of it for StallTimeout (the deadline moves with every chunk, so a slow
// but moving client keeps going, as nginx's send_timeout), and a file download is
// cut at StallTimeout plus its size at MinRate however it moves. Stats counts
// what it served and what it cut.
//
// A file goes out by sendfile on a corked connection (full segments, the
// headers with the first of them), and while many are sent at once each may
// leave only its share of a fixed budget unsent in the kernel (see
// notsentLowat), so that a boot storm does not push the host's TCP memory into
// pressure. Both need the connection: Serve and NewServer's server give it.
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

	// StallTimeout is how long a response may make no progress: each 256 KiB of
	// it (and a whole script or error) must be taken by the client within it,
	// or the connection is closed and counted in Stats().Stalled. 0 means
	// DefaultHTTPStallTimeout.
	StallTimeout time.Duration
	// HeaderTimeout bounds the reading of a request's headers (a slowloris
	// trickle is cut by it); 0 means DefaultHTTPHeaderTimeout.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next request
	// for this long; 0 means DefaultHTTPIdleTimeout.
	IdleTimeout time.Duration
	// MinRate, in bytes per second, sizes the upper bound of a file download:
	// StallTimeout plus the file's size at MinRate (the 30 MiB initrd at the
	// default: 30 s + 8 min). A download still running then is cut and counted
	// in Stats().TooSlow. 0 means DefaultHTTPMinRate.
	MinRate int64

	// st holds the counters (*httpState), made on first use and shared by the
	// copies of s that the site agent serves each request with; an
	// unsafe.Pointer rather than an atomic.Pointer so that copying s stays
	// legal (go vet's copylocks).
	st unsafe.Pointer
}

// The defaults of HTTPServer's deadlines, chosen for a boot network: nginx's
// send_timeout is 60 s and its keepalive_timeout 75 s; a firmware that has not
// taken data for 30 s has given up or hung, and 64 KiB/s is far below any link a
// machine boots over (a 1 Mbit/s WAN link does twice that).
const (
	DefaultHTTPStallTimeout  = 30 * time.Second
	DefaultHTTPHeaderTimeout = 10 * time.Second
	DefaultHTTPIdleTimeout   = 60 * time.Second
	DefaultHTTPMinRate       = 64 << 10
)

// httpChunk is how much of a file is sent per write deadline: small enough that
// "no progress" means little (256 KiB in StallTimeout, 8.5 KiB/s at the
// default), large enough that the deadline costs nothing next to the sendfile
// calls it frames (256 per 64 MiB).
const httpChunk = 256 << 10

// HTTPStats counts what an HTTPServer did. Requests and bytes are by route;
// Bytes are body bytes handed to the kernel (none for HEAD).
type HTTPStats struct {
	Script HTTPRouteStats // /ipxe/{mac}.ipxe
	Kernel HTTPRouteStats // /ramdisk/vmlinuz
	Initrd HTTPRouteStats // /ramdisk/initrd
	Binary HTTPRouteStats // /ipxe/{binary}
	Other  HTTPRouteStats // anything else: 404, 405

	// Responses by status class: Status[2] counts 2xx, Status[4] 4xx; Status[0]
	// is unused.
	Status [6]uint64

	Stalled uint64 // responses cut because the client took nothing for StallTimeout
	TooSlow uint64 // file downloads cut at their upper bound (StallTimeout + size at MinRate)

	Connections uint64 // connections accepted (by Serve, or an http.Server from NewServer)
	Open        int64  // connections open now
}

// HTTPRouteStats counts one route's requests and the body bytes sent for them.
type HTTPRouteStats struct {
	Requests uint64
	Bytes    uint64
}

// ByRoute names the routes of s as a metric label would: script, kernel,
// initrd, binary, other.
func (s HTTPStats) ByRoute() map[string]HTTPRouteStats {
	return map[string]HTTPRouteStats{
		"script": s.Script, "kernel": s.Kernel, "initrd": s.Initrd, "binary": s.Binary, "other": s.Other,
	}
}

// The routes, as indexes of httpState.routes.
const (
	routeScript = iota
	routeKernel
	routeInitrd
	routeBinary
	routeOther
	numRoutes
)

type httpRouteCounters struct{ requests, bytes atomic.Uint64 }

// httpState is what every copy of an HTTPServer shares.
type httpState struct {
	routes                  [numRoutes]httpRouteCounters
	status                  [6]atomic.Uint64
	stalled, tooSlow, conns atomic.Uint64
	open                    atomic.Int64
	downloads               atomic.Int64 // file bodies being sent now
	warnedNoDeadline        atomic.Bool
}

func (s *HTTPServer) state() *httpState {
	if p := atomic.LoadPointer(&s.st); p != nil {
		return (*httpState)(p)
	}
	atomic.CompareAndSwapPointer(&s.st, nil, unsafe.Pointer(new(httpState)))
	return (*httpState)(atomic.LoadPointer(&s.st))
}

// Stats returns the counters so far.
func (s *HTTPServer) Stats() HTTPStats {
	st := s.state()
	var out HTTPStats
	for i, r := range []*HTTPRouteStats{&out.Script, &out.Kernel, &out.Initrd, &out.Binary, &out.Other} {
		r.Requests = st.routes[i].requests.Load()
		r.Bytes = st.routes[i].bytes.Load()
	}
	for i := range out.Status {
		out.Status[i] = st.status[i].Load()
	}
	out.Stalled = st.stalled.Load()
	out.TooSlow = st.tooSlow.Load()
	out.Connections = st.conns.Load()
	out.Open = st.open.Load()
	return out
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
	if err := s.checkLimits(); err != nil {
		ln.Close()
		return err
	}
	hs := s.NewServer(nil)
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

// checkLimits refuses deadlines that would cut every request at once.
func (s *HTTPServer) checkLimits() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"StallTimeout", s.StallTimeout}, {"HeaderTimeout", s.HeaderTimeout}, {"IdleTimeout", s.IdleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("boot HTTP: %s %v is negative (0 means the default)", d.name, d.v)
		}
	}
	if s.MinRate < 0 {
		return fmt.Errorf("boot HTTP: MinRate %d bytes/s is negative (0 means the default, %d)", s.MinRate, DefaultHTTPMinRate)
	}
	return nil
}

// NewServer returns the http.Server that Serve runs: HeaderTimeout and
// IdleTimeout, the connection counts of Stats, and h as its handler (nil means
// s). It is for a caller that puts a handler of its own in front of s (the site
// agent does) and serves itself; h must hand each request to s.ServeHTTP, with a
// ResponseWriter that unwraps to the connection's (http.ResponseController), for
// the write deadlines to apply.
func (s *HTTPServer) NewServer(h http.Handler) *http.Server {
	if h == nil {
		h = s
	}
	st := s.state()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cmp.Or(s.HeaderTimeout, DefaultHTTPHeaderTimeout),
		IdleTimeout:       cmp.Or(s.IdleTimeout, DefaultHTTPIdleTimeout),
		ErrorLog:          slog.NewLogLogger(s.logger().Handler(), slog.LevelDebug),
		// The handler corks the connection around a file's body (see serveFile).
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, httpConnKey{}, c)
		},
		ConnState: func(_ net.Conn, cs http.ConnState) {
			switch cs {
			case http.StateNew:
				st.conns.Add(1)
				st.open.Add(1)
			case http.StateClosed, http.StateHijacked:
				st.open.Add(-1)
			}
		},
	}
}

func (s *HTTPServer) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

// ServeHTTP routes a request. Its response goes through an httpWriter, which
// moves the write deadline with progress and counts what was sent.
func (s *HTTPServer) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	st := s.state()
	w := &httpWriter{
		ResponseWriter: rw,
		rc:             http.NewResponseController(rw),
		stall:          cmp.Or(s.StallTimeout, DefaultHTTPStallTimeout),
		route:          routeOther,
	}
	if err := w.extend(); err != nil && st.warnedNoDeadline.CompareAndSwap(false, true) {
		s.logger().Warn("boot HTTP: the response writer cannot set write deadlines (it does not unwrap to the connection's); a client that stops reading holds its connection", "err", err)
	}
	defer w.finish(st)
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		// iPXE never sends a body with GET; reading one a client trickles would
		// hold the connection without any deadline, so it is refused unread and
		// the connection closed.
		w.Header().Set("Connection", "close")
		_ = w.rc.SetReadDeadline(time.Now())
		http.Error(w, "a boot request has no body", http.StatusBadRequest)
		return
	}
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
		w.route = routeKernel
		s.serveFile(w, r, s.RamdiskDir, "vmlinuz", ServedKernel)
	case p == "/ramdisk/initrd" && s.RamdiskDir != "":
		w.route = routeInitrd
		s.serveFile(w, r, s.RamdiskDir, "initrd", ServedInitrd)
	case strings.HasPrefix(p, "/ipxe/") && strings.HasSuffix(p, ".ipxe"):
		mac, err := protocol.ParseMAC(strings.TrimSuffix(strings.TrimPrefix(p, "/ipxe/"), ".ipxe"))
		if err != nil {
			http.NotFound(w, r)
			return
		}
		w.route = routeScript
		s.serveScript(w, r, mac)
	case strings.HasPrefix(p, "/ipxe/") && s.BinDir != "" && slices.Contains(ipxe.Binaries, strings.TrimPrefix(p, "/ipxe/")):
		w.route = routeBinary
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
	var refused *RefusedError
	if errors.As(err, &refused) {
		// The minter counted and logged it (rate-limited): a spoofer must not
		// fill the log.
		http.Error(w, refused.Message, refused.Status)
		return
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

// RefusedError is a NonceMinter's refusal of the client that asked for the
// script (its address is not the MAC's, it asks too often): the script is
// answered with Status and Message instead, and no nonce leaves.
type RefusedError struct {
	Status  int    // an HTTP status: 403, 429
	Message string // for the client, one line
}

func (e *RefusedError) Error() string { return e.Message }

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
func (s *HTTPServer) serveFile(w *httpWriter, r *http.Request, dir, name, served string) {
	path := filepath.Join(dir, name)
	// O_NONBLOCK: a FIFO put there must not hang the request; what was opened is
	// checked below.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.logger().Warn("boot HTTP: cannot open", "file", name, "err", err)
		}
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err == nil {
		err = servable(path, fi)
	}
	if err != nil {
		s.logger().Warn("boot HTTP: refusing to serve", "file", name, "err", err)
		http.NotFound(w, r)
		return
	}
	// The download's upper bound, from the whole file even for a range: generous.
	w.bound = w.start.Add(w.stall + time.Duration(float64(fi.Size())/float64(cmp.Or(s.MinRate, DefaultHTTPMinRate))*float64(time.Second)))
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", fmt.Sprintf(`"%x-%x"`, fi.Size(), fi.ModTime().UnixNano()))
	if s.Observer != nil && r.Method == http.MethodGet {
		// A download starts once: a range request for a later part is its continuation.
		if rg := r.Header.Get("Range"); rg == "" || strings.HasPrefix(rg, "bytes=0-") {
			s.Observer.Observe(Event{Time: time.Now(), Served: served, IP: remoteIP(r), Arch: -1, File: r.URL.Path})
		}
	}
	if c, ok := r.Context().Value(httpConnKey{}).(net.Conn); ok && r.Method == http.MethodGet {
		st := s.state()
		n := st.downloads.Add(1)
		defer st.downloads.Add(-1)
		setNotsentLowat(c, notsentLowat(n))
		// Cork the connection for the body, as nginx's tcp_nopush does: the
		// headers go out with the file's first bytes, and each sendfile call
		// (one per httpChunk, and one per wait for the client) tops up the
		// segment the previous one left partial instead of pushing it alone,
		// which made a quarter of the segments small (41 KB a packet on average
		// beside nginx's 55 over the bench's veth). Uncorking once the body is
		// queued sends the last partial segment at once.
		if setCork(c, true) {
			defer setCork(c, false)
		}
	}
	http.ServeContent(w, r, name, fi.ModTime(), f)
}

// notsentLowat is the TCP_NOTSENT_LOWAT of a file download while n are being
// sent: the kernel's share of unsent file data, httpUnsentBudget over all of
// them, and 0 (the kernel's default: as much as the send buffer holds) while
// that share exceeds what a send buffer holds anyway.
//
// Without it every download keeps its send buffer full (the kernel grows it to
// 4 MiB), and 256 downloads at once queue a gigabyte: the host's TCP memory
// reaches its pressure threshold, the kernel drops segments, and connections
// stall in retransmission timeouts (the bench at 256 clients: ~400 RTOs per
// 2 s window, throughput erratic). One download alone keeps its full buffer,
// which spares it a wait for every few hundred kilobytes.
func notsentLowat(n int64) int {
	const floor, ceiling = 256 << 10, 4 << 20
	share := httpUnsentBudget() / max(n, 1)
	if share >= ceiling {
		return 0
	}
	return int(max(share, floor))
}

// httpConnKey is the request context's key to its connection (set by NewServer).
type httpConnKey struct{}

// httpWriter is the ResponseWriter of every request: it counts the status and
// the body bytes, and moves the connection's write deadline as the response
// progresses, chunk by chunk, without losing http.ServeContent's sendfile path
// (ReadFrom hands the connection's ReadFrom an *io.LimitedReader of the
// *os.File per chunk, the one shape net's sendfile recognises).
type httpWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	start time.Time
	bound time.Time // when a file download must have ended; zero: none
	route int

	code    int
	bytes   uint64
	since   int  // bytes written since the deadline was set last
	atBound bool // the deadline set last is bound, not now+stall
	cut     bool // a deadline ended the response
	tooSlow bool
	lr      io.LimitedReader
}

// extend sets the write deadline StallTimeout from now, or at the bound if that
// comes first.
func (w *httpWriter) extend() error {
	now := time.Now()
	if w.start.IsZero() {
		w.start = now
	}
	d := now.Add(w.stall)
	w.atBound, w.since = false, 0
	if !w.bound.IsZero() && d.After(w.bound) {
		d, w.atBound = w.bound, true
	}
	return w.rc.SetWriteDeadline(d)
}

// failed notes why a write failed: a deadline is a cut, counted by finish.
func (w *httpWriter) failed(err error) {
	if err != nil && !w.cut && errors.Is(err, os.ErrDeadlineExceeded) {
		w.cut, w.tooSlow = true, w.atBound
	}
}

func (w *httpWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *httpWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	var n int
	for len(p) > 0 {
		if w.since >= httpChunk {
			_ = w.extend()
		}
		m, err := w.ResponseWriter.Write(p[:min(len(p), httpChunk)])
		n += m
		w.bytes += uint64(m)
		w.since += m
		if err != nil {
			w.failed(err)
			return n, err
		}
		p = p[m:]
	}
	return n, nil
}

// ReadFrom sends src chunk by chunk, each with a deadline of its own.
func (w *httpWriter) ReadFrom(src io.Reader) (int64, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	rf, ok := w.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{w}, src)
	}
	inner, remain := src, int64(1<<63-1)
	outer, limited := src.(*io.LimitedReader)
	if limited {
		inner, remain = outer.R, outer.N
	}
	var n int64
	var err error
	for remain > 0 {
		_ = w.extend()
		ask := min(remain, httpChunk)
		w.lr = io.LimitedReader{R: inner, N: ask}
		var m int64
		m, err = rf.ReadFrom(&w.lr)
		n += m
		remain -= m
		w.bytes += uint64(m)
		if err != nil {
			w.failed(err)
			break
		}
		if m < ask {
			break // src ended
		}
	}
	if limited {
		outer.N = remain
	}
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *httpWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// finish counts the request when its handler returns.
func (w *httpWriter) finish(st *httpState) {
	code := w.code
	if code == 0 {
		code = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	st.routes[w.route].requests.Add(1)
	st.routes[w.route].bytes.Add(w.bytes)
	st.status[min(max(code/100, 1), 5)].Add(1)
	switch {
	case w.tooSlow:
		st.tooSlow.Add(1)
	case w.cut:
		st.stalled.Add(1)
	}
}
