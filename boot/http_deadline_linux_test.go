package boot

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The deadlines of these tests are sized for a loaded 2-core machine: a
// condition is polled until it holds or the deadline passes.
const httpPollDeadline = 60 * time.Second

// waitFor polls cond until it holds; it fails the test after httpPollDeadline,
// naming what it waited for and what it saw last.
func waitFor(t *testing.T, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, seen := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > httpPollDeadline {
			t.Fatalf("after %v, still waiting for %s: %s", httpPollDeadline, what, seen)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// dialSmallWindow connects with a 4 KiB receive buffer, set before the connect so
// the window the client advertises is small from the first segment: a client
// that then does not read stalls the server within a few kilobytes.
func dialSmallWindow(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.TCPConn)
}

func (h *httpHarness) addr() string { return strings.TrimPrefix(h.base, "http://") }

// sparseFile makes name in the harness's ramdisk directory size bytes of zeros
// that take no disk.
func (h *httpHarness) sparseFile(t *testing.T, name string, size int64) {
	t.Helper()
	if err := os.Truncate(filepath.Join(h.srv.RamdiskDir, name), size); err != nil {
		t.Fatal(err)
	}
}

// TestHTTPStalledDownloads: 100 clients ask for a 32 MiB initrd and never read.
// The server cuts each once it has made no progress for StallTimeout, closes the
// connections and frees their descriptors (the clients' own stay open: the
// server did the closing), while a client that reads gets the whole file.
func TestHTTPStalledDownloads(t *testing.T) {
	const stall = 2 * time.Second
	const size = 32 << 20
	h := startHTTP(t, func(s *HTTPServer) { s.StallTimeout = stall; s.Observer = nil })
	h.sparseFile(t, "initrd", size)
	before := openFDs(t)

	const stalled = 100
	conns := make([]*net.TCPConn, stalled)
	for i := range conns {
		conns[i] = dialSmallWindow(t, h.addr())
		defer conns[i].Close()
		if _, err := io.WriteString(conns[i], "GET /ramdisk/initrd HTTP/1.1\r\nHost: boot\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the server to hold 100 connections", func() (bool, string) {
		st := h.srv.Stats()
		return st.Open == stalled, fmt.Sprintf("%+v", st)
	})
	if n := openFDs(t); n < before+2*stalled {
		t.Errorf("%d descriptors open while 100 downloads stall, want at least %d (the clients' and the server's)", n, before+2*stalled)
	}

	// A machine that reads boots meanwhile.
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr}).Get(h.base + "/ramdisk/initrd")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != size || resp.StatusCode != 200 {
		t.Fatalf("the reading client during the stall: %s, %d of %d bytes, %v", resp.Status, n, size, err)
	}
	if st := h.srv.Stats(); st.Stalled == stalled {
		t.Logf("note: every stalled download was cut before the reading client finished (a loaded machine); it still read the whole file")
	}

	took := waitFor(t, "the server to cut every stalled download", func() (bool, string) {
		st := h.srv.Stats()
		return st.Stalled == stalled && st.Open == 0, fmt.Sprintf("%+v", st)
	})
	t.Logf("all %d stalled downloads cut %v after the reading client finished (StallTimeout %v)", stalled, took.Round(time.Millisecond), stall)
	// The server's descriptors are freed; the clients still hold theirs.
	waitFor(t, "the server's descriptors to be freed", func() (bool, string) {
		n := openFDs(t)
		return n <= before+stalled+2, fmt.Sprintf("%d open, %d before the clients and %d clients", n, before, stalled)
	})
	st := h.srv.Stats()
	if st.Initrd.Requests != stalled+1 || st.Status[2] != stalled+1 || st.TooSlow != 0 || st.Connections != stalled+1 {
		t.Errorf("stats %+v: want 101 initrd requests, 101 2xx, 101 connections, 100 stalled, none too slow", st)
	}
	if st.Initrd.Bytes < size {
		t.Errorf("initrd bytes %d: want at least the reading client's %d", st.Initrd.Bytes, size)
	}
	t.Logf("initrd bytes sent: %d: the reading client's %d and %d for the 100 stalled ones", st.Initrd.Bytes, size, st.Initrd.Bytes-size)
	// The server closed the stalled connections: each client now reads what the
	// kernel had queued, then the end.
	for _, c := range conns[:3] {
		c.SetReadDeadline(time.Now().Add(httpPollDeadline))
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("a stalled client after the cut: %v, want the end of the stream", err)
		}
	}
}

// TestHTTPSlowloris: a client trickling its request headers, a line every 100 ms,
// is cut by HeaderTimeout.
func TestHTTPSlowloris(t *testing.T) {
	const timeout = time.Second
	h := startHTTP(t, func(s *HTTPServer) { s.HeaderTimeout = timeout })
	c, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	var lines atomic.Int64
	go func() {
		if _, err := io.WriteString(c, "GET /ramdisk/initrd HTTP/1.1\r\nHost: boot\r\n"); err != nil {
			return
		}
		for {
			time.Sleep(100 * time.Millisecond)
			if _, err := fmt.Fprintf(c, "X-Trickle-%d: still coming\r\n", lines.Load()); err != nil {
				return
			}
			lines.Add(1)
		}
	}()
	c.SetReadDeadline(time.Now().Add(httpPollDeadline))
	got, err := io.ReadAll(c)
	took := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the trickling connection was still open after %v (%d header lines sent)", took, lines.Load())
	}
	if strings.HasPrefix(string(got), "HTTP/1.1 2") {
		t.Fatalf("a request whose headers never ended was answered: %q", got)
	}
	if took < timeout-100*time.Millisecond {
		t.Errorf("cut after %v, before HeaderTimeout %v: by something else (%v, %q)", took, timeout, err, got)
	}
	t.Logf("cut after %v with %d header lines sent (%v)", took.Round(time.Millisecond), lines.Load(), err)
	waitFor(t, "the connection to be closed", func() (bool, string) {
		st := h.srv.Stats()
		return st.Open == 0 && st.Connections == 1, fmt.Sprintf("%+v", st)
	})
}

// TestHTTPIdleTimeout: a keep-alive connection that asks for nothing more is
// closed after IdleTimeout.
func TestHTTPIdleTimeout(t *testing.T) {
	const idle = time.Second
	h := startHTTP(t, func(s *HTTPServer) { s.IdleTimeout = idle })
	c, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /ipxe/52:54:00:00:00:02.ipxe HTTP/1.1\r\nHost: boot\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 || resp.Close {
		t.Fatalf("%s close=%v %v", resp.Status, resp.Close, err)
	}
	answered := time.Now()
	c.SetReadDeadline(time.Now().Add(httpPollDeadline))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("idle connection: read %d bytes, %v; want the server to close it", n, err)
	}
	if took := time.Since(answered); took < idle-100*time.Millisecond {
		t.Errorf("closed %v after the answer, before IdleTimeout %v", took, idle)
	}
}

// TestHTTPTooSlow: a client that keeps reading, but too slowly for the file's
// upper bound (StallTimeout plus its size at MinRate), is cut at the bound and
// counted as too slow, not as stalled.
func TestHTTPTooSlow(t *testing.T) {
	const size = 64 << 20
	// Bound: 3 s + 64 MiB at 64 MiB/s = 4 s. The client reads at most 3.2 MB/s
	// and would need 20 s; it drains what the kernel buffers for the connection
	// (a few MB on loopback) well within StallTimeout, so it is never stalled.
	const bound = 4 * time.Second
	h := startHTTP(t, func(s *HTTPServer) { s.StallTimeout = 3 * time.Second; s.MinRate = 64 << 20 })
	h.sparseFile(t, "vmlinuz", size)
	c, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /ramdisk/vmlinuz HTTP/1.1\r\nHost: boot\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	var read atomic.Int64
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			read.Add(int64(n))
			if err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	took := waitFor(t, "the slow download to be cut", func() (bool, string) {
		st := h.srv.Stats()
		return st.TooSlow+st.Stalled == 1 && st.Open == 0, fmt.Sprintf("%+v, %d bytes read", st, read.Load())
	})
	c.Close()
	if st := h.srv.Stats(); st.TooSlow != 1 || st.Stalled != 0 || st.Kernel.Bytes >= size {
		t.Errorf("stats %+v: want the moving client cut as too slow, before the whole file", st)
	}
	if took < bound-500*time.Millisecond {
		t.Errorf("cut %v after the request, before its %v bound", took, bound)
	}
	t.Logf("cut %v after the request, %d bytes read by then", took.Round(time.Millisecond), read.Load())
}

// TestHTTPRefusesBody: a GET carrying a body is refused unread, and the
// connection closed, rather than read at the client's pace.
func TestHTTPRefusesBody(t *testing.T) {
	h := startHTTP(t, nil)
	c, err := net.Dial("tcp", h.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /ramdisk/initrd HTTP/1.1\r\nHost: boot\r\nContent-Length: 1000000\r\n\r\nabc"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(httpPollDeadline))
	got, err := io.ReadAll(c) // the end, or a reset for the unread body
	if !strings.HasPrefix(string(got), "HTTP/1.1 400 ") {
		t.Fatalf("%v: %q", err, got)
	}
	if st := h.srv.Stats(); st.Status[4] != 1 || st.Initrd.Requests != 0 || st.Other.Requests != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestHTTPDeadlineResetPerRequest: the write deadline a download left on a
// keep-alive connection does not fail the next request, which comes after it.
func TestHTTPDeadlineResetPerRequest(t *testing.T) {
	const stall = 300 * time.Millisecond
	h := startHTTP(t, func(s *HTTPServer) { s.StallTimeout = stall })
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	for i, p := range []string{"/ramdisk/vmlinuz", "/ipxe/52:54:00:00:00:02.ipxe", "/ramdisk/initrd"} {
		if i > 0 {
			time.Sleep(3 * stall) // past the deadline the request before set
		}
		resp, err := c.Get(h.base + p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n == 0 {
			t.Fatalf("GET %s after %v idle: %s, %d bytes, %v", p, 3*stall, resp.Status, n, err)
		}
	}
	if st := h.srv.Stats(); st.Connections != 1 || st.Stalled != 0 {
		t.Errorf("stats %+v: want the three requests over one connection, none cut", st)
	}
}

// TestHTTPRefusesNegativeLimits: a negative deadline or rate is an error naming
// it, not a server that cuts every download at once.
func TestHTTPRefusesNegativeLimits(t *testing.T) {
	for name, configure := range map[string]func(*HTTPServer){
		"StallTimeout":  func(s *HTTPServer) { s.StallTimeout = -time.Second },
		"HeaderTimeout": func(s *HTTPServer) { s.HeaderTimeout = -1 },
		"IdleTimeout":   func(s *HTTPServer) { s.IdleTimeout = -1 },
		"MinRate":       func(s *HTTPServer) { s.MinRate = -1 },
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := &HTTPServer{URL: "http://" + ln.Addr().String(), Table: &MemTable{}}
		configure(s)
		err = s.Serve(t.Context(), ln)
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s negative: Serve returned %v, want an error naming it", name, err)
		}
	}
}
