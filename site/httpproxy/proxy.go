package httpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Server's zero fields.
const (
	DefaultMaxConns    = 256
	DefaultIdleTimeout = 2 * time.Minute
	DefaultDialTimeout = 30 * time.Second
)

// Server is the forward proxy. Set the fields before Serve; change the allowed
// destinations only through SetAllowed.
type Server struct {
	// MaxConns bounds the client connections served at once; 0 means
	// DefaultMaxConns.
	MaxConns int
	// IdleTimeout closes a tunnel, or a client connection between requests, that
	// moved no byte for this long; 0 means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// DialTimeout bounds connecting to a destination; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// Dial connects to a destination; nil is a net.Dialer. Tests point it at
	// loopback servers.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger logs refusals and failures; nil discards.
	Logger *slog.Logger

	allowed atomic.Pointer[map[string]bool]

	mu        sync.Mutex
	transport *http.Transport
	tunnels   map[net.Conn]struct{}
	closed    bool
}

// Normalize returns hostport as the proxy compares it: the host lowercased without
// a trailing dot, IPv6 in brackets, the port explicit (defaultPort when missing).
// It fails for anything that is not host[:port].
func Normalize(hostport, defaultPort string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: the whole thing is a host (an IPv6 literal may be bracketed).
		host, port = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), defaultPort
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if !validHost(host) {
		return "", fmt.Errorf("%q is not host:port", hostport)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", fmt.Errorf("%q has no valid port", hostport)
	}
	return net.JoinHostPort(host, strconv.FormatUint(n, 10)), nil
}

// validHost accepts an IP address without a zone, or a name of letters, digits, '-',
// '_' and '.'.
func validHost(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	if h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..") {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// SetAllowed replaces the destinations the proxy forwards to. Each is host:port
// (see Normalize); a malformed entry fails the whole call and keeps the old list.
func (s *Server) SetAllowed(dests []string) error {
	m := make(map[string]bool, len(dests))
	for _, d := range dests {
		n, err := Normalize(d, "")
		if err != nil {
			return fmt.Errorf("http proxy: allowed destination: %w", err)
		}
		m[n] = true
	}
	s.allowed.Store(&m)
	return nil
}

// Allowed reports whether the proxy forwards to hostport (already normalized).
func (s *Server) Allowed(hostport string) bool {
	m := s.allowed.Load()
	return m != nil && (*m)[hostport]
}

func (s *Server) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func (s *Server) idle() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return DefaultIdleTimeout
}

func (s *Server) dial(ctx context.Context, addr string) (net.Conn, error) {
	timeout := s.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if s.Dial != nil {
		return s.Dial(ctx, "tcp", addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// Serve serves ln until ctx is done, then closes it and every tunnel.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	max := s.MaxConns
	if max <= 0 {
		max = DefaultMaxConns
	}
	s.mu.Lock()
	s.tunnels = map[net.Conn]struct{}{}
	s.transport = &http.Transport{
		// The proxy is the last hop: it never goes through another proxy.
		Proxy:                 nil,
		DialContext:           func(ctx context.Context, _, addr string) (net.Conn, error) { return s.dial(ctx, addr) },
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       s.idle(),
		ResponseHeaderTimeout: 2 * time.Minute,
		ForceAttemptHTTP2:     false,
	}
	s.mu.Unlock()
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       s.idle(),
		ErrorLog:          slog.NewLogLogger(s.log().Handler(), slog.LevelDebug),
	}
	lln := newLimitListener(ln, max)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(lln) }()
	var err error
	returned := false
	select {
	case err = <-errc:
		err = fmt.Errorf("http proxy: %w", err)
		returned = true
	case <-ctx.Done():
	}
	lln.Close()
	// Tunnels are hijacked: the http.Server no longer knows them.
	s.mu.Lock()
	s.closed = true
	for c := range s.tunnels {
		c.Close()
	}
	s.mu.Unlock()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = hs.Shutdown(sctx)
	cancel()
	hs.Close()
	if !returned {
		<-errc
	}
	s.transport.CloseIdleConnections()
	return err
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, why string) {
	s.log().Info("http proxy: refused", "from", r.RemoteAddr, "method", r.Method, "target", r.Host, "reason", why)
	http.Error(w, "refused by the site's proxy: "+why, http.StatusForbidden)
}

// ServeHTTP handles one proxy request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Each request gets its own write deadline: one a previous request on this
	// keep-alive connection set must not cut this one short, and a client that
	// stops reading must not hold its connection forever.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.idle()))
	switch {
	case r.Method == http.MethodConnect:
		dest, err := Normalize(r.Host, "")
		if err != nil || r.URL.Host == "" {
			s.refuse(w, r, "CONNECT needs host:port")
			return
		}
		if !s.Allowed(dest) {
			s.refuse(w, r, "destination "+dest+" is not allowed")
			return
		}
		s.tunnel(w, r, dest)
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.refuse(w, r, "only GET and HEAD are forwarded")
			return
		}
		dest, err := Normalize(r.URL.Host, "80")
		if err != nil || r.URL.User != nil {
			s.refuse(w, r, "the URL has no valid host")
			return
		}
		if !s.Allowed(dest) {
			s.refuse(w, r, "destination "+dest+" is not allowed")
			return
		}
		s.forward(w, r, dest)
	default:
		s.refuse(w, r, "only CONNECT and absolute http:// GET are forwarded")
	}
}

func (s *Server) tunnel(w http.ResponseWriter, r *http.Request, dest string) {
	up, err := s.dial(r.Context(), dest)
	if err != nil {
		s.log().Warn("http proxy: cannot reach an allowed destination", "target", dest, "error", err.Error())
		http.Error(w, "the site's proxy cannot reach "+dest, http.StatusBadGateway)
		return
	}
	// The answer is written on the hijacked connection: through the server it would
	// be framed (Transfer-Encoding: chunked), and a client that reads the CONNECT
	// answer's body would wait for a chunk that never comes.
	down, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return
	}
	_ = down.SetWriteDeadline(time.Now().Add(s.idle()))
	if _, err := io.WriteString(down, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		down.Close()
		up.Close()
		return
	}
	if !s.track(down, up) {
		down.Close()
		up.Close()
		return
	}
	defer s.untrack(down, up)
	// Bytes the client sent after its CONNECT (a TLS ClientHello, pipelined) are
	// already in buf.
	var first []byte
	if n := buf.Reader.Buffered(); n > 0 {
		first, _ = buf.Reader.Peek(n)
	}
	if len(first) > 0 {
		if _, err := up.Write(first); err != nil {
			return
		}
	}
	done := make(chan struct{}, 2)
	go func() { s.pipe(up, down); done <- struct{}{} }()
	go func() { s.pipe(down, up); done <- struct{}{} }()
	<-done
	// One direction ended: end both, so neither side waits on an idle timeout.
	down.Close()
	up.Close()
	<-done
}

// pipe copies src to dst, closing the copy when src stays silent for the idle
// timeout.
func (s *Server) pipe(dst, src net.Conn) {
	idle := s.idle()
	buf := make([]byte, 32<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		n, err := src.Read(buf)
		if n > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(interface{ CloseWrite() error }); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

func (s *Server) track(conns ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, c := range conns {
		s.tunnels[c] = struct{}{}
	}
	return true
}

func (s *Server) untrack(conns ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(s.tunnels, c)
	}
}

// hopHeaders are per connection (RFC 9110 section 7.6.1); a proxy drops them.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, dest string) {
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.Body = http.NoBody
	out.ContentLength = 0
	// Dial exactly the destination that was checked.
	out.URL.Host = dest
	dropHopHeaders(out.Header)
	s.mu.Lock()
	tr := s.transport
	s.mu.Unlock()
	resp, err := tr.RoundTrip(out)
	if err != nil {
		s.log().Warn("http proxy: forwarding failed", "target", dest, "error", err.Error())
		http.Error(w, "the site's proxy cannot reach "+dest, http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	dropHopHeaders(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	_, _ = io.Copy(w, &idleReader{r: resp.Body, rc: rc, idle: s.idle()})
	// The server flushes the end of the body after the handler returns.
	_ = rc.SetWriteDeadline(time.Now().Add(s.idle()))
}

// idleReader extends the client connection's write deadline as the body moves, so
// a long image download is not cut by a fixed timeout but a stalled client is.
type idleReader struct {
	r    io.Reader
	rc   *http.ResponseController
	idle time.Duration
}

func (ir *idleReader) Read(p []byte) (int, error) {
	_ = ir.rc.SetWriteDeadline(time.Now().Add(ir.idle))
	return ir.r.Read(p)
}

// limitListener holds at most cap(sem) accepted connections open at once. Close
// also ends an Accept waiting for a free slot.
type limitListener struct {
	net.Listener
	sem  chan struct{}
	done chan struct{}
	once sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
