package httpproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// startProxy serves s on 127.0.0.1 and returns its http:// URL.
func startProxy(t *testing.T, s *Server, allowed ...string) *url.URL {
	t.Helper()
	if err := s.SetAllowed(allowed); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after its context ended")
		}
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

func backend(t *testing.T, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Proxy-Authorization") != "" || r.Header.Get("Proxy-Connection") != "" {
			http.Error(w, "a hop-by-hop header reached the origin", 500)
			return
		}
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func client(proxy *url.URL, tlsCfg *tls.Config) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
}

func get(t *testing.T, c *http.Client, u string) (int, string, error) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestProxyForwardsOnlyAllowedDestinations: plain GET and CONNECT reach an allowed
// host:port through Go's own proxy client; another port of the same host is 403,
// and nothing is dialled for it.
func TestProxyForwardsOnlyAllowedDestinations(t *testing.T) {
	allowedHTTP := backend(t, "image bytes")
	deniedHTTP := backend(t, "secret")
	allowedTLS := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "gateway") }))
	t.Cleanup(allowedTLS.Close)
	deniedTLS := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "other") }))
	t.Cleanup(deniedTLS.Close)

	var dials atomic.Int32
	s := &Server{Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	proxy := startProxy(t, s, allowedHTTP.Listener.Addr().String(), allowedTLS.Listener.Addr().String())
	pool := allowedTLS.Client().Transport.(*http.Transport).TLSClientConfig
	c := client(proxy, pool)

	if code, body, err := get(t, c, allowedHTTP.URL+"/img.raw"); err != nil || code != 200 || body != "image bytes" {
		t.Errorf("GET allowed: %d %q %v", code, body, err)
	}
	if code, body, err := get(t, c, allowedTLS.URL+"/v1/session"); err != nil || code != 200 || body != "gateway" {
		t.Errorf("CONNECT allowed: %d %q %v", code, body, err)
	}
	before := dials.Load()
	if code, _, err := get(t, c, deniedHTTP.URL+"/"); err != nil || code != 403 {
		t.Errorf("GET denied: %d %v, want 403", code, err)
	}
	if _, _, err := get(t, c, deniedTLS.URL+"/"); err == nil || !strings.Contains(err.Error(), "Forbidden") {
		t.Errorf("CONNECT denied: %v, want a 403 from the proxy", err)
	}
	if d := dials.Load() - before; d != 0 {
		t.Errorf("%d connections dialled for refused requests", d)
	}
}

// TestProxyRefusesOtherRequests: only CONNECT and absolute http:// GET/HEAD pass.
func TestProxyRefusesOtherRequests(t *testing.T) {
	origin := backend(t, "ok")
	proxy := startProxy(t, &Server{}, origin.Listener.Addr().String())
	for _, raw := range []string{
		"POST " + origin.URL + "/ HTTP/1.1\r\nHost: " + origin.Listener.Addr().String() + "\r\nContent-Length: 0\r\n\r\n",
		"PUT " + origin.URL + "/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: " + origin.Listener.Addr().String() + "\r\n\r\n",
		"GET https://" + origin.Listener.Addr().String() + "/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://user:pw@" + origin.Listener.Addr().String() + "/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT " + origin.Listener.Addr().String() + "0 HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", proxy.Host)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(conn, raw)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil {
			t.Errorf("%q: %v", strings.SplitN(raw, "\r\n", 2)[0], err)
			continue
		}
		if resp.StatusCode != 403 {
			t.Errorf("%q: %d, want 403", strings.SplitN(raw, "\r\n", 2)[0], resp.StatusCode)
		}
	}
}

// TestProxyWithCurl: the same through curl -x, the client a ramdisk script would use.
func TestProxyWithCurl(t *testing.T) {
	curl := testenv.NeedTool(t, "curl")
	allowed := backend(t, "kernel")
	denied := backend(t, "no")
	proxy := startProxy(t, &Server{}, allowed.Listener.Addr().String())
	out, err := exec.Command(curl, "-sS", "--fail", "-x", proxy.String(), "--noproxy", "", allowed.URL+"/vmlinuz").CombinedOutput()
	if err != nil || string(out) != "kernel" {
		t.Errorf("curl -x allowed: %v: %s", err, out)
	}
	out, err = exec.Command(curl, "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-x", proxy.String(), "--noproxy", "", denied.URL+"/").CombinedOutput()
	if err != nil || string(out) != "403" {
		t.Errorf("curl -x denied: %v: %s", err, out)
	}
}

// TestProxySetAllowed: the list is replaced while serving, and a bad list keeps the
// old one.
func TestProxySetAllowed(t *testing.T) {
	a, b := backend(t, "a"), backend(t, "b")
	s := &Server{}
	proxy := startProxy(t, s, a.Listener.Addr().String())
	c := client(proxy, nil)
	if code, _, _ := get(t, c, b.URL); code != 403 {
		t.Fatalf("b before: %d", code)
	}
	if err := s.SetAllowed([]string{b.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	if code, body, _ := get(t, c, b.URL); code != 200 || body != "b" {
		t.Errorf("b after: %d %q", code, body)
	}
	if code, _, _ := get(t, c, a.URL); code != 403 {
		t.Errorf("a after: %d, want 403", code)
	}
	if err := s.SetAllowed([]string{"no port:x"}); err == nil {
		t.Error("a malformed destination was accepted")
	}
	if code, _, _ := get(t, c, b.URL); code != 200 {
		t.Errorf("b after a refused list: %d", code)
	}
}

// connect opens a tunnel through the proxy to dest.
func connect(t *testing.T, proxy *url.URL, dest string) (net.Conn, *bufio.Reader, error) {
	t.Helper()
	conn, err := net.Dial("tcp", proxy.Host)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dest, dest)
	br := bufio.NewReader(conn)
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	conn.SetReadDeadline(time.Time{})
	if len(resp.TransferEncoding) != 0 || resp.ContentLength > 0 {
		conn.Close()
		return nil, nil, fmt.Errorf("CONNECT answer framed as a body: %v, %d", resp.TransferEncoding, resp.ContentLength)
	}
	if resp.StatusCode != 200 {
		conn.Close()
		return nil, nil, fmt.Errorf("CONNECT: %s", resp.Status)
	}
	return conn, br, nil
}

// echoServer echoes lines on 127.0.0.1.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// TestProxyBoundsConnections: with MaxConns 1 a second client waits until the first
// tunnel ends.
func TestProxyBoundsConnections(t *testing.T) {
	echo := echoServer(t)
	proxy := startProxy(t, &Server{MaxConns: 1}, echo)
	first, br, err := connect(t, proxy, echo)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(first, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
		t.Fatalf("tunnel echo: %q %v", line, err)
	}
	second := make(chan error, 1)
	go func() {
		c, _, err := connect(t, proxy, echo)
		if err == nil {
			c.Close()
		}
		second <- err
	}()
	select {
	case err := <-second:
		t.Fatalf("a second connection was served while the first held the only slot (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	first.Close()
	select {
	case err := <-second:
		if err != nil {
			t.Errorf("second connection after the first closed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the second connection was never served")
	}
}

// TestProxyIdleTunnelCloses: a tunnel that carries nothing for IdleTimeout ends.
func TestProxyIdleTunnelCloses(t *testing.T) {
	echo := echoServer(t)
	proxy := startProxy(t, &Server{IdleTimeout: 150 * time.Millisecond}, echo)
	c, br, err := connect(t, proxy, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err = br.ReadByte()
	if !errors.Is(err, io.EOF) {
		t.Fatalf("idle tunnel: %v, want EOF", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("closed after %s", d)
	}
}

func TestNormalize(t *testing.T) {
	for _, c := range []struct{ in, def, want string }{
		{"GW.Example.com.:443", "", "gw.example.com:443"},
		{"images.example", "80", "images.example:80"},
		{"[2001:db8::1]:8443", "", "[2001:db8::1]:8443"},
		{"10.0.0.1:0080", "", "10.0.0.1:80"},
	} {
		if got, err := Normalize(c.in, c.def); err != nil || got != c.want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "host", ":443", "host:0", "host:99999", "a b:80", "u@h:80", "h/x:80"} {
		if got, err := Normalize(in, ""); err == nil {
			t.Errorf("Normalize(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzNormalize: any destination a client writes either fails or normalizes to a
// host:port that normalizes to itself.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{"gw.example.com:443", "[::1]:80", "a", "A.:1", "[", "]:", "%zz:1", "1.2.3.4:65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Normalize(s, "80")
		if err != nil {
			return
		}
		again, err := Normalize(n, "")
		if err != nil || again != n {
			t.Fatalf("Normalize(%q) = %q, which normalizes to %q, %v", s, n, again, err)
		}
	})
}
