package boot

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// acceptRecorder hands each connection it accepts to conns, so that a test can
// look at the server's side of it.
type acceptRecorder struct {
	net.Listener
	conns chan net.Conn
}

func (l acceptRecorder) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.conns <- c
	}
	return c, err
}

func tcpOpt(t *testing.T, c net.Conn, opt int) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// TestHTTPCorksFileBodies: while a file's body is being sent its connection is
// corked, with the NOTSENT_LOWAT of its share of the unsent budget; once the
// body is queued it is uncorked, so the last partial segment goes out, and the
// connection serves its next request.
func TestHTTPCorksFileBodies(t *testing.T) {
	orig := httpUnsentBudget
	httpUnsentBudget = func() int64 { return 8 << 20 }
	t.Cleanup(func() { httpUnsentBudget = orig })

	dir := t.TempDir()
	const size = 32<<20 + 7 // not a whole number of segments
	f, err := os.Create(filepath.Join(dir, "initrd"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := acceptRecorder{Listener: ln, conns: make(chan net.Conn, 8)}
	var tab MemTable
	srv := &HTTPServer{URL: "http://" + ln.Addr().String(), Table: &tab, RamdiskDir: dir}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, rec) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	// Four downloads that stall, started one after another: the k-th is sent
	// while k are, so it gets notsentLowat(k) — 0 (the default) while the share
	// of the 8 MiB budget is at least 4 MiB, then 8/3 MiB and 2 MiB.
	want := []int{0, 0, 8 << 20 / 3, 2 << 20}
	var clients []*net.TCPConn
	var servers []net.Conn
	for k := range want {
		c := dialSmallWindow(t, ln.Addr().String())
		defer c.Close()
		if _, err := io.WriteString(c, "GET /ramdisk/initrd HTTP/1.1\r\nHost: boot\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		sc := <-rec.conns
		waitFor(t, fmt.Sprintf("download %d to be corked", k+1), func() (bool, string) {
			v := tcpOpt(t, sc, unix.TCP_CORK)
			return v == 1, fmt.Sprintf("TCP_CORK %d", v)
		})
		if got := tcpOpt(t, sc, unix.TCP_NOTSENT_LOWAT); got != want[k] {
			t.Errorf("download %d of %d at once: TCP_NOTSENT_LOWAT %d, want %d", k+1, len(want), got, want[k])
		}
		clients, servers = append(clients, c), append(servers, sc)
	}

	// The first client reads its whole body, then asks again on the same
	// connection.
	br := bufio.NewReader(clients[0])
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != size {
		t.Fatalf("the body: %d of %d bytes, %v", n, size, err)
	}
	waitFor(t, "the first download to be uncorked", func() (bool, string) {
		v := tcpOpt(t, servers[0], unix.TCP_CORK)
		return v == 0, fmt.Sprintf("TCP_CORK %d", v)
	})
	if _, err := io.WriteString(clients[0], "HEAD /ramdisk/initrd HTTP/1.1\r\nHost: boot\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err = http.ReadResponse(br, &http.Request{Method: http.MethodHead})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the next request on the connection: %v, %v", resp, err)
	}
	resp.Body.Close()
	if st := srv.Stats(); st.Connections != uint64(len(want)) || st.Initrd.Requests != 2 {
		t.Errorf("stats %+v: want %d connections, the first's 2 initrd requests counted", st, len(want))
	}
}

// TestNotsentLowat: one download keeps the kernel's default, many share the
// budget, down to a floor.
func TestNotsentLowat(t *testing.T) {
	b := httpUnsentBudget()
	if got := notsentLowat(1); b >= 4<<20 && got != 0 {
		t.Errorf("one download: %d, want 0 (the default) with a budget of %d", got, b)
	}
	prev := 1 << 62
	for _, n := range []int64{1, 2, 16, 64, 256, 1000, 100000} {
		got := notsentLowat(n)
		eff := got
		if eff == 0 {
			eff = 1 << 62
		}
		if eff > prev {
			t.Errorf("%d downloads: %d, more than with fewer (%d)", n, got, prev)
		}
		if got != 0 && got < 256<<10 {
			t.Errorf("%d downloads: %d, below the 256 KiB floor", n, got)
		}
		prev = eff
	}
	if got := notsentLowat(1 << 40); got != 256<<10 {
		t.Errorf("a huge number of downloads: %d, want the 256 KiB floor", got)
	}
}
