package boot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pin/tftp/v3"
	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/internal/testenv"
)

// tftpRoot makes a TFTP root with an iPXE-sized binary, a file whose size is a whole
// number of blocks (the transfer must end with an empty block), and the traps the
// server must refuse.
func tftpRoot(t testing.TB) (root string, files map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "ipxe")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	files = map[string][]byte{
		"undionly.kpxe":   random(1<<20 + 123),
		"ipxe.efi":        random(512 * 200),
		"sub/snponly.efi": random(4000),
	}
	for name, b := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "secret"), []byte("outside the root"), 0o600))
	must(os.Symlink("../secret", filepath.Join(root, "escape")))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "absolute-link")))
	must(os.Symlink("undionly.kpxe", filepath.Join(root, "inside-link")))
	must(syscall.Mkfifo(filepath.Join(root, "fifo"), 0o644))
	// A hard link is the file outside itself: os.Root does not see it leave.
	must(os.Link(filepath.Join(dir, "secret"), filepath.Join(root, "hard-link")))
	if os.Geteuid() == 0 {
		must(syscall.Mknod(filepath.Join(root, "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}
	files["inside-link"] = files["undionly.kpxe"]
	return root, files
}

func startTFTP(t testing.TB, root string, configure func(*TFTPServer)) (*TFTPServer, netip.AddrPort) {
	t.Helper()
	s := &TFTPServer{Addr: "127.0.0.1:0", Root: root}
	if configure != nil {
		configure(s)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, s.LocalAddr()
}

// rawRRQ sends a read request from a fresh socket and returns the first packet the
// server answers with.
func rawRRQ(t testing.TB, addr netip.AddrPort, name string, opts ...string) (op uint16, body []byte, conn *net.UDPConn) {
	t.Helper()
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	pkt := append([]byte{0, 1}, name...)
	pkt = append(pkt, 0)
	pkt = append(pkt, "octet\x00"...)
	for _, o := range opts {
		pkt = append(append(pkt, o...), 0)
	}
	if _, err := conn.WriteToUDPAddrPort(pkt, addr); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 70000)
	n, _, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("RRQ %q: no answer: %v", name, err)
	}
	return binary.BigEndian.Uint16(buf), buf[2:n], conn
}

// TestTFTPRefuses: every trap is an immediate error packet whose text is the
// code's own, "access violation", naming nothing on the server (it was
// "access violation: statat absolute-link: path escapes from parent"); the
// server's log keeps the detail.
func TestTFTPRefuses(t *testing.T) {
	root, _ := tftpRoot(t)
	var logged syncbuf.Buffer
	s, addr := startTFTP(t, root, func(s *TFTPServer) {
		s.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	cases := []string{
		"../secret",
		"sub/../../secret",
		"sub/../undionly.kpxe", // ".." is refused even when it stays inside
		"/undionly.kpxe",
		"/etc/passwd",
		"escape",
		"absolute-link",
		"fifo",
		"hard-link",
		"sub",
		"sub/",
		"./undionly.kpxe",
		"sub//snponly.efi",
		`sub\snponly.efi`,
		"undionly.kpxe\x01",
		"undi only.kpxe",
		strings.Repeat("a", 300),
	}
	if os.Geteuid() == 0 {
		cases = append(cases, "null")
	}
	for _, name := range cases {
		start := time.Now()
		op, body, _ := rawRRQ(t, addr, name)
		if op != 5 {
			t.Errorf("%q: opcode %d, want an error packet", name, op)
			continue
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("%q: refused after %v", name, d)
		}
		if msg := string(body[2:]); msg != "access violation\x00" {
			t.Errorf("%q: error %q, want just \"access violation\"", name, msg)
		}
	}
	for _, detail := range []string{"path escapes from parent", "has 2 links", "not a regular file (a FIFO)", "not a regular file (a directory)", `path element \"..\"`} {
		if !strings.Contains(logged.String(), detail) {
			t.Errorf("the server's log does not keep %q:\n%s", detail, logged.String())
		}
	}
	if n := strings.Count(logged.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings for %d refusals in well under a second, want 1", n, len(cases))
	}
	if got := s.Stats(); got.Refused != uint64(len(cases)) || got.Transfers != 0 {
		t.Errorf("stats %+v, want %d refused", got, len(cases))
	}
}

// TestTFTPNotFoundIsQuick: iPXE asks for autoexec.ipxe before anything else; the
// answer must be an immediate "file not found", never a timeout.
func TestTFTPNotFoundIsQuick(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, nil)
	start := time.Now()
	op, body, _ := rawRRQ(t, addr, "autoexec.ipxe", "blksize", "1432", "tsize", "0")
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("answered after %v", d)
	}
	if op != 5 || binary.BigEndian.Uint16(body) != 1 || !strings.Contains(string(body[2:]), "not found") {
		t.Errorf("answer opcode %d %q, want error 1 file not found", op, body)
	}
	if got := s.Stats(); got.NotFound != 1 {
		t.Errorf("stats %+v", got)
	}
}

// TestTFTPAtCapacityWaits: beyond MaxTransfers a request is left unanswered, never
// refused with an error packet (firmware gives up the boot on one), and counted
// in Waits; the client's own retransmission is answered once a slot frees.
func TestTFTPAtCapacityWaits(t *testing.T) {
	root, files := tftpRoot(t)
	s, addr := startTFTP(t, root, func(s *TFTPServer) {
		s.MaxTransfers = 1
		s.Timeout = 200 * time.Millisecond
		s.Retries = 2
	})
	// A client that takes the first block and never acknowledges it holds the
	// only slot until the server gives up on it.
	op, _, _ := rawRRQ(t, addr, "undionly.kpxe")
	if op != 3 {
		t.Fatalf("first transfer: opcode %d, want DATA", op)
	}
	// A second request gets nothing while the slot is taken: no error packet.
	conn := listenLoopback(t)
	if _, err := conn.WriteToUDPAddrPort([]byte("\x00\x01ipxe.efi\x00octet\x00"), addr); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
	if n, _, err := conn.ReadFromUDPAddrPort(make([]byte, 2000)); err == nil {
		t.Fatalf("a request beyond capacity was answered with %d bytes; want silence", n)
	}
	if got := s.Stats(); got.Waits != 1 {
		t.Errorf("stats %+v, want 1 wait", got)
	}
	// A client that sends its request again, as firmware does, gets the file once
	// the stuck transfer is abandoned.
	c, err := tftp.NewClient(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetTimeout(200 * time.Millisecond)
	c.SetRetries(20)
	c.SetBackoff(func(int) time.Duration { return 0 })
	wt, err := c.Receive("ipxe.efi", "octet")
	if err != nil {
		t.Fatalf("a client beyond capacity: %v", err)
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil || !bytes.Equal(b.Bytes(), files["ipxe.efi"]) {
		t.Fatalf("a client beyond capacity got %d bytes (%v)", b.Len(), err)
	}
	// The server counts a transfer once it holds the last acknowledgement, a little
	// after the client has its file.
	if got := waitStats(s, func(st TFTPStats) bool { return st.Transfers == 1 }); got.Waits < 1 || got.Failed != 1 || got.Transfers != 1 || got.Refused != 0 {
		t.Errorf("stats %+v, want waits, 1 failed, 1 transfer, none refused", got)
	}
}

// TestTFTPTimeoutCapped: a timeout option beyond tftpMaxTimeout is left out of the
// OACK (RFC 2349 has the OACK echo the value asked, so it is not lowered), and a
// request that is never acknowledged holds its transfer for the few first-packet
// retries only, not 255 s times the retries.
func TestTFTPTimeoutCapped(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, func(s *TFTPServer) { s.Timeout = 100 * time.Millisecond })
	start := time.Now()
	op, body, conn := rawRRQ(t, addr, "ipxe.efi", "timeout", "255", "blksize", "1468")
	if op != tftpOpOACK || strings.Contains(string(body), "timeout") || !strings.Contains(string(body), "blksize\x001468") {
		t.Fatalf("answer opcode %d %q, want an OACK of blksize alone", op, body)
	}
	// Count what arrives until the server gives up: the OACK and tftpFirstRetries
	// more, 100 ms apart.
	copies := 1
	buf := make([]byte, 2000)
	for {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, _, err := conn.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
		copies++
	}
	if copies != 1+tftpFirstRetries {
		t.Errorf("the OACK arrived %d times, want %d", copies, 1+tftpFirstRetries)
	}
	st := waitStats(s, func(st TFTPStats) bool { return st.Failed == 1 })
	if st.Failed != 1 {
		t.Errorf("stats %+v, want the transfer abandoned", st)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("abandoned after %v", d)
	}
	// A timeout within the cap is granted.
	if op, body, _ := rawRRQ(t, addr, "ipxe.efi", "timeout", strconv.Itoa(tftpMaxTimeout)); op != tftpOpOACK || !strings.Contains(string(body), "timeout\x00"+strconv.Itoa(tftpMaxTimeout)+"\x00") {
		t.Errorf("timeout %d: answer opcode %d %q", tftpMaxTimeout, op, body)
	}
}

// TestTFTPTransferLife: a client that acknowledges every block just before the
// server would send it again still loses its transfer after TransferTimeout.
func TestTFTPTransferLife(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, func(s *TFTPServer) {
		s.Timeout = 2 * time.Second
		s.TransferTimeout = 500 * time.Millisecond
	})
	// A slow client: each ACK 100 ms after its block, well within the timeout.
	buf := make([]byte, 2000)
	c := listenLoopback(t)
	c.WriteToUDPAddrPort([]byte("\x00\x01undionly.kpxe\x00octet\x00"), addr)
	start := time.Now()
	var end time.Duration // when the last block arrived
	for {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			break
		}
		end = time.Since(start)
		if n < 4 || buf[1] != tftpOpDATA {
			t.Fatalf("opcode %d", buf[1])
		}
		time.Sleep(100 * time.Millisecond)
		c.WriteToUDPAddrPort([]byte{0, tftpOpACK, buf[2], buf[3]}, from)
	}
	// Uncut, the 2049 blocks would take over 200 s.
	if end > 3*time.Second {
		t.Errorf("the slow transfer was cut after %v; want about 500 ms", end)
	}
	if st := waitStats(s, func(st TFTPStats) bool { return st.Failed >= 1 }); st.Failed < 1 || st.Transfers != 0 {
		t.Errorf("stats %+v, want the slow transfer failed", st)
	}
}

// waitStats waits up to a second for the server's counters to satisfy ok.
func waitStats(s *TFTPServer, ok func(TFTPStats) bool) TFTPStats {
	deadline := time.Now().Add(time.Second)
	for !ok(s.Stats()) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return s.Stats()
}

// tftpGet fetches name with the pin/tftp client.
func tftpGet(t testing.TB, addr netip.AddrPort, name string, blksize int) []byte {
	t.Helper()
	c, err := tftp.NewClient(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetTimeout(time.Second)
	if blksize > 0 {
		c.SetBlockSize(blksize)
	}
	wt, err := c.Receive(name, "octet")
	if err != nil {
		t.Fatalf("RRQ %s: %v", name, err)
	}
	var b bytes.Buffer
	if _, err := wt.WriteTo(&b); err != nil {
		t.Fatalf("receiving %s: %v", name, err)
	}
	return b.Bytes()
}

// TestTFTPWithRealClients fetches the files with tftp-hpa's tftp and curl, the two
// TFTP clients Debian ships, and compares digests; it refuses tftp-hpa's put.
func TestTFTPWithRealClients(t *testing.T) {
	tftpBin := testenv.NeedTool(t, "tftp")
	curl := testenv.NeedTool(t, "curl")
	root, files := tftpRoot(t)
	s, addr := startTFTP(t, root, nil)
	out := t.TempDir()
	host, port := addr.Addr().String(), strconv.Itoa(int(addr.Port()))
	for _, name := range []string{"undionly.kpxe", "ipxe.efi", "sub/snponly.efi", "inside-link"} {
		want := sha256.Sum256(files[name])
		dst := filepath.Join(out, strings.ReplaceAll(name, "/", "_"))
		for _, client := range []struct {
			name string
			cmd  *exec.Cmd
		}{
			{"tftp-hpa", exec.Command(tftpBin, "-m", "binary", host, port, "-c", "get", name, dst)},
			{"curl", exec.Command(curl, "-sS", "--fail", "--max-time", "20", "-o", dst, "tftp://"+addr.String()+"/"+name)},
			{"curl --tftp-blksize 1468", exec.Command(curl, "-sS", "--fail", "--max-time", "20", "--tftp-blksize", "1468", "-o", dst, "tftp://"+addr.String()+"/"+name)},
		} {
			os.Remove(dst)
			if b, err := client.cmd.CombinedOutput(); err != nil {
				t.Errorf("%s get %s: %v: %s", client.name, name, err, b)
				continue
			}
			got, err := os.ReadFile(dst)
			if err != nil {
				t.Errorf("%s get %s: %v", client.name, name, err)
				continue
			}
			if sha256.Sum256(got) != want {
				t.Errorf("%s get %s: %d bytes, digest differs from the %d-byte file", client.name, name, len(got), len(files[name]))
			}
		}
	}
	if got := waitStats(s, func(st TFTPStats) bool { return st.Transfers == 12 }); got.Transfers != 12 {
		t.Errorf("stats %+v, want 12 transfers", got)
	}

	// Refusals as the real clients see them.
	src := filepath.Join(out, "upload")
	os.WriteFile(src, []byte("not welcome"), 0o644)
	b, _ := exec.Command(tftpBin, "-m", "binary", host, port, "-c", "put", src, "uploaded").CombinedOutput()
	if !strings.Contains(string(b), "read-only") {
		t.Errorf("tftp put: %q, want the read-only error", b)
	}
	if _, err := os.Lstat(filepath.Join(root, "uploaded")); err == nil {
		t.Error("put wrote a file")
	}
	for _, name := range []string{"../secret", "escape", "autoexec.ipxe"} {
		dst := filepath.Join(out, "refused")
		start := time.Now()
		b, err := exec.Command(curl, "-sS", "--fail", "--max-time", "20", "-o", dst, "tftp://"+addr.String()+"/"+name).CombinedOutput()
		if err == nil {
			t.Errorf("curl got %s: %s", name, b)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("curl %s: refused after %v", name, d)
		}
	}
}

// TestTFTPSurvivesLoss: with a tenth of the datagrams dropped both ways, transfers
// still complete, by the server's retransmissions.
func TestTFTPSurvivesLoss(t *testing.T) {
	root, files := tftpRoot(t)
	s, addr := startTFTP(t, root, func(s *TFTPServer) {
		s.Timeout = 50 * time.Millisecond
		s.Retries = 20
	})
	proxy := newLossyProxy(t, addr, 0.1)
	var wg sync.WaitGroup
	for i, blksize := range []int{0, 1468, 1468, 8192} {
		wg.Go(func() {
			c, err := tftp.NewClient(proxy.String())
			if err != nil {
				t.Error(err)
				return
			}
			c.SetTimeout(50 * time.Millisecond)
			c.SetRetries(20)
			c.SetBackoff(func(int) time.Duration { return 0 })
			if blksize > 0 {
				c.SetBlockSize(blksize)
			}
			var b bytes.Buffer
			var werr error
			for range 10 { // the request itself may be lost
				wt, err := c.Receive("ipxe.efi", "octet")
				if err != nil {
					werr = err
					continue
				}
				b.Reset()
				if _, werr = wt.WriteTo(&b); werr == nil {
					break
				}
			}
			if werr != nil {
				t.Errorf("client %d: %v", i, werr)
			} else if !bytes.Equal(b.Bytes(), files["ipxe.efi"]) {
				t.Errorf("client %d: %d bytes received, differs", i, b.Len())
			}
		})
	}
	wg.Wait()
	t.Logf("proxy dropped %d of %d datagrams; server stats %+v", proxy.dropped.Load(), proxy.relayed.Load(), s.Stats())
	if proxy.dropped.Load() == 0 {
		t.Error("the proxy dropped nothing: the test proved nothing")
	}
}

func TestCleanTFTPPath(t *testing.T) {
	for name, ok := range map[string]bool{
		"undionly.kpxe":     true,
		"efi/ipxe.efi":      true,
		"a-b_c.d~":          true,
		"":                  false,
		"/undionly.kpxe":    false,
		"../x":              false,
		"a/../b":            false,
		"a/./b":             false,
		".":                 false,
		"a/":                false,
		"a//b":              false,
		`a\b`:               false,
		"a b":               false,
		"a\x00b":            false,
		"caf\xc3\xa9":       false,
		fmt.Sprint(1 << 20): true,
	} {
		_, err := cleanTFTPPath(name)
		if (err == nil) != ok {
			t.Errorf("cleanTFTPPath(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

// TestTFTPRepeatedRequestIsOneTransfer: a client that sends its RRQ again from the
// same port (firmware does, when the first answer is slow) gets one transfer, from
// one server port, not a second one it would have to refuse; a new request after
// the transfer ended starts a new one.
func TestTFTPRepeatedRequestIsOneTransfer(t *testing.T) {
	root, files := tftpRoot(t)
	s, addr := startTFTP(t, root, nil)
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rrq := append([]byte{0, 1}, "ipxe.efi\x00octet\x00"...)
	for range 3 {
		if _, err := conn.WriteToUDPAddrPort(rrq, addr); err != nil {
			t.Fatal(err)
		}
	}
	want := files["ipxe.efi"]
	buf := make([]byte, 2048)
	var got []byte
	var server netip.AddrPort
	for block := uint16(1); ; block++ {
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("block %d: %v", block, err)
		}
		if !server.IsValid() {
			server = from
		} else if from != server {
			t.Fatalf("block %d came from %s, the transfer's port is %s: a second transfer", block, from, server)
		}
		if op, num := binary.BigEndian.Uint16(buf), binary.BigEndian.Uint16(buf[2:]); op != 3 || num != block {
			t.Fatalf("got opcode %d block %d, want DATA %d", op, num, block)
		}
		got = append(got, buf[4:n]...)
		ack := []byte{0, 4, byte(block >> 8), byte(block)}
		if _, err := conn.WriteToUDPAddrPort(ack, server); err != nil {
			t.Fatal(err)
		}
		if n-4 < 512 {
			break
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("received %d bytes, want the %d of ipxe.efi", len(got), len(want))
	}
	// Nothing else arrives: the repeats started nothing.
	conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, from, err := conn.ReadFromUDPAddrPort(buf); err == nil {
		t.Fatalf("a further %d-byte packet from %s after the transfer", n, from)
	}
	waitStats := func(cond func(TFTPStats) bool) TFTPStats {
		deadline := time.Now().Add(2 * time.Second)
		for {
			st := s.Stats()
			if cond(st) || time.Now().After(deadline) {
				return st
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if st := waitStats(func(st TFTPStats) bool { return st.Transfers == 1 }); st.Transfers != 1 || st.Repeats != 2 {
		t.Fatalf("stats %+v, want 1 transfer and 2 repeats dropped", st)
	}
	// The same port asking again once its transfer is over is a new request.
	if _, err := conn.WriteToUDPAddrPort(rrq, addr); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, _, err := conn.ReadFromUDPAddrPort(buf)
	if err != nil || n < 4 || binary.BigEndian.Uint16(buf) != 3 || binary.BigEndian.Uint16(buf[2:]) != 1 {
		t.Fatalf("a new request from the same port after the transfer: %d bytes, %v", n, err)
	}
}

// TestTFTPFloodOfUnacknowledgedRequests: thousands of requests from as many source
// ports, each asking for timeout 255 and never acknowledging (as spoofed sources
// never do), cost the server little: a real client fetching a file during the
// flood gets it promptly, and no flooding port ever hears "server busy" or any
// other error.
func TestTFTPFloodOfUnacknowledgedRequests(t *testing.T) {
	root, files := tftpRoot(t)
	s, addr := startTFTP(t, root, nil) // the defaults, as bcd site runs it
	const sources = 3000
	flood := make([]*net.UDPConn, sources)
	for i := range flood {
		flood[i] = listenLoopback(t)
	}
	rrq := []byte("\x00\x01undionly.kpxe\x00octet\x00timeout\x00255\x00blksize\x001468\x00tsize\x000\x00")
	stop := make(chan struct{})
	var peak atomic.Int64
	var sent atomic.Int64
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		// Round after round until the client has its file: a port whose
		// transfer was abandoned starts another.
		for round := 0; ; round++ {
			for _, c := range flood {
				select {
				case <-stop:
					return
				default:
				}
				c.WriteToUDPAddrPort(rrq, addr)
				sent.Add(1)
				peak.Store(max(peak.Load(), s.active.Load()))
			}
		}
	}()
	// Let the flood take hold before the client asks.
	deadline := time.Now().Add(20 * time.Second)
	for s.active.Load() < sources/2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	c, err := tftp.NewClient(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetTimeout(time.Second)
	c.SetRetries(5)
	c.SetBlockSize(1468)
	var got bytes.Buffer
	wt, err := c.Receive("undionly.kpxe", "octet")
	if err == nil {
		_, err = wt.WriteTo(&got)
	}
	took := time.Since(start)
	close(stop)
	<-flooded
	if err != nil || !bytes.Equal(got.Bytes(), files["undionly.kpxe"]) {
		t.Fatalf("the client during the flood: %d bytes (%v)", got.Len(), err)
	}
	// Unloaded it takes a few tens of milliseconds; a loaded 2-core machine
	// may stretch that, but not to the seconds a held-up client would wait.
	if took > 5*time.Second {
		t.Errorf("the client took %v during the flood", took)
	}
	if p := peak.Load(); p < sources/2 {
		t.Errorf("at most %d transfers ran at once: the flood did not take hold", p)
	}
	// What the flooding ports received: OACKs, never an error packet.
	buf := make([]byte, 2000)
	oacks := 0
	for _, fc := range flood {
		rc, err := fc.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		// Read what is queued without waiting: Go's deadlines return before
		// trying once they have passed.
		rc.Read(func(fd uintptr) bool {
			for {
				n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_DONTWAIT)
				if err != nil {
					return true
				}
				if n >= 2 && buf[1] == tftpOpERROR {
					t.Errorf("a flooding port got error %q", buf[2:n])
				}
				oacks++
			}
		})
	}
	st := s.Stats()
	t.Logf("%d requests from %d ports, %d transfers at most at once, %d OACKs received; the client took %v; stats %+v", sent.Load(), sources, peak.Load(), oacks, took, st)
	if st.Refused != 0 || oacks == 0 {
		t.Errorf("stats %+v, %d OACKs: want the flood answered with OACKs and nothing refused", st, oacks)
	}
}
