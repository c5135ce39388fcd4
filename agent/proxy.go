package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"golang.org/x/net/http/httpproxy"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// maxProxyResponse bounds what a CONNECT answer may hold before the tunnel starts.
const maxProxyResponse = 16 << 10

// ParseProxyURL accepts an HTTP proxy as http://host:port: no user, path, query or
// fragment, and an explicit port. The site agent's proxy is the ramdisk's only way
// to the gateway, so anything that would change where bytes go is refused rather
// than guessed at.
func ParseProxyURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, errors.New("not a URL (want http://host:port)")
	case u.Scheme != "http":
		return nil, errors.New("want http://host:port")
	case u.User != nil:
		return nil, errors.New("must not carry a user name or password")
	case u.Hostname() == "":
		return nil, errors.New("has no host")
	case u.Port() == "":
		return nil, errors.New("has no port (want http://host:port)")
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "", u.Opaque != "":
		return nil, errors.New("must be http://host:port with no path or query")
	}
	if n, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || n == 0 {
		return nil, fmt.Errorf("port %q is not a port number", u.Port())
	}
	return &url.URL{Scheme: "http", Host: u.Host}, nil
}

// DialFunc is what http.Transport.DialContext takes.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ProxyDialer returns a dial function that reaches every address through an HTTP
// CONNECT tunnel of proxy, or dials directly when proxy is nil. The tunnel is used
// for http and https alike, so the TLS handshake (and the pin check) runs end to end
// with the gateway: the proxy sees only the host and port.
func ProxyDialer(proxy *url.URL, d *net.Dialer) DialFunc {
	if d == nil {
		d = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	}
	if proxy == nil {
		return d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := d.DialContext(ctx, network, proxy.Host)
		if err != nil {
			return nil, fmt.Errorf("proxy %s: %w", proxy.Host, err)
		}
		tunnel, err := connect(ctx, conn, addr)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("proxy %s: CONNECT %s: %w", proxy.Host, addr, err)
		}
		return tunnel, nil
	}
}

// connect asks the proxy on conn for a tunnel to addr and returns the tunnel.
func connect(ctx context.Context, conn net.Conn, addr string) (net.Conn, error) {
	// The deadline bounds a proxy that accepts and then says nothing; ctx may end
	// sooner, and closing the connection is the only way to interrupt a read.
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: addr},
		Host:   addr,
		Header: http.Header{},
	}
	if err := req.Write(conn); err != nil {
		return nil, ctxOr(ctx, err)
	}
	br := bufio.NewReaderSize(&limitedReader{r: conn, n: maxProxyResponse}, 4096)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, ctxOr(ctx, fmt.Errorf("reading the answer: %w", err))
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the proxy answered %s", resp.Status)
	}
	if !stop() {
		return nil, ctx.Err()
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if br.Buffered() > 0 {
		// The server spoke first through the tunnel; hand those bytes on.
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// ctxOr prefers ctx's error: the connection's deadline is ctx's, and may fire a
// moment before ctx itself reports done.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return err
}

type limitedReader struct {
	r net.Conn
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errors.New("the proxy's answer is too long")
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// bufferedConn reads what the CONNECT reader buffered before the connection itself.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}

// ProxyFor returns the proxy to reach target through: explicit when set (the
// ramdisk's bcd.proxy), else what HTTPS_PROXY, HTTP_PROXY and NO_PROXY say for that
// URL, as every Go and curl client reads them (an installed OS whose only way out is
// a site's proxy), else nil for a direct connection.
func ProxyFor(explicit *url.URL, target string) (*url.URL, error) {
	if explicit != nil {
		return explicit, nil
	}
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	p, err := httpproxy.FromEnvironment().ProxyFunc()(u)
	if err != nil || p == nil {
		return nil, err
	}
	return ParseProxyURL(p.String())
}
