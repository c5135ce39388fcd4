package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scriptedTFTP is a lock-step (or windowed) TFTP reader whose hooks play the
// faults a network and a client can have: a DATA lost on the way, an ACK lost on
// the way, an ACK sent twice.
type scriptedTFTP struct {
	t    *testing.T
	conn *net.UDPConn
	// loseData says whether the n-th arrival of block b is lost before the client
	// sees it; loseAck whether the client's ACK of b is lost; dupAck whether it is
	// sent twice.
	loseData func(b uint64, n int) bool
	loseAck  func(b uint64) bool
	dupAck   func(b uint64) bool
	mode     string // "octet" when empty

	oack     map[string]string
	arrivals map[uint64]int // DATA packets that reached the client, per block
}

func newScriptedTFTP(t *testing.T) *scriptedTFTP {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &scriptedTFTP{t: t, conn: c, arrivals: map[uint64]int{}}
}

// get fetches name with the options given (name, value pairs) and returns the
// file; it fails the test on a timeout of 3 s or an error packet.
func (c *scriptedTFTP) get(addr netip.AddrPort, name string, opts ...string) []byte {
	c.t.Helper()
	rrq := append([]byte{0, 1}, name...)
	rrq = append(append(append(rrq, 0), cmpOr(c.mode, "octet")...), 0)
	for _, o := range opts {
		rrq = append(append(rrq, o...), 0)
	}
	if _, err := c.conn.WriteToUDPAddrPort(rrq, addr); err != nil {
		c.t.Fatal(err)
	}
	blksize, window := 512, 1
	var server netip.AddrPort
	var out []byte
	var got uint64 // blocks received in order
	buf := make([]byte, 70000)
	var lastAck uint64
	ack := func(b uint64) {
		lastAck = b
		if c.loseAck != nil && c.loseAck(b) {
			return
		}
		p := []byte{0, 4, 0, 0}
		binary.BigEndian.PutUint16(p[2:], uint16(b))
		n := 1
		if c.dupAck != nil && c.dupAck(b) {
			n = 2
		}
		for range n {
			if _, err := c.conn.WriteToUDPAddrPort(p, server); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	for {
		c.conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		n, from, err := c.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			c.t.Fatalf("after %d blocks: %v", got, err)
		}
		if server.IsValid() && from != server {
			c.t.Fatalf("a datagram from %v, the transfer is with %v", from, server)
		}
		server = from
		p := buf[:n]
		switch binary.BigEndian.Uint16(p) {
		case tftpOpOACK:
			c.oack = map[string]string{}
			f := strings.Split(string(p[2:]), "\x00")
			for i := 0; i+1 < len(f); i += 2 {
				c.oack[f[i]] = f[i+1]
			}
			if v, ok := c.oack["blksize"]; ok {
				blksize, _ = strconv.Atoi(v)
			}
			if v, ok := c.oack["windowsize"]; ok {
				window, _ = strconv.Atoi(v)
			}
			ack(0)
		case tftpOpDATA:
			wire := binary.BigEndian.Uint16(p[2:])
			// The block this is, of those that can be in flight.
			b := got + 1 + uint64(wire-uint16(got+1))
			if uint16(b) != wire || b > got+uint64(window) {
				b = got - uint64(uint16(got)-wire) // an old one, sent again
			}
			c.arrivals[b]++
			if c.loseData != nil && c.loseData(b, c.arrivals[b]) {
				continue
			}
			if b != got+1 {
				// Out of order, or a repeat: acknowledge what we have (RFC 7440),
				// which for lock-step is the repeat's own number.
				ack(got)
				continue
			}
			got++
			out = append(out, p[4:]...)
			last := len(p)-4 < blksize
			// A window is counted from the last ACK (RFC 7440), not from block 0.
			if last || got-lastAck == uint64(window) {
				ack(got)
			}
			if last {
				return out
			}
		case tftpOpERROR:
			c.t.Fatalf("error packet %q", p[4:])
		default:
			c.t.Fatalf("opcode %d", binary.BigEndian.Uint16(p))
		}
	}
}

// TestTFTPFaults plays the faults of each direction against the server and checks
// the file arrives whole, with as many retransmissions as were needed and no more.
func TestTFTPFaults(t *testing.T) {
	root, files := tftpRoot(t)
	want := files["ipxe.efi"] // 200 blocks of 512
	cases := []struct {
		name        string
		opts        []string
		setup       func(*scriptedTFTP)
		retransmits uint64
		// check looks at what reached the client.
		check func(t *testing.T, c *scriptedTFTP)
	}{
		{name: "clean", retransmits: 0},
		{name: "DATA lost", retransmits: 3, setup: func(c *scriptedTFTP) {
			c.loseData = func(b uint64, n int) bool { return n == 1 && (b == 1 || b == 77 || b == 201) }
		}},
		{name: "ACK lost", retransmits: 2, setup: func(c *scriptedTFTP) {
			lost := map[uint64]bool{5: true, 150: true}
			c.loseAck = func(b uint64) bool { l := lost[b]; delete(lost, b); return l }
		}},
		{name: "OACK lost", opts: []string{"blksize", "512", "tsize", "0"}, retransmits: 0, setup: func(c *scriptedTFTP) {
			lost := true
			c.loseAck = func(b uint64) bool { l := lost && b == 0; lost = false; return l }
		}},
		{name: "duplicate ACKs", retransmits: 0, setup: func(c *scriptedTFTP) {
			c.dupAck = func(uint64) bool { return true }
		}, check: func(t *testing.T, c *scriptedTFTP) {
			// Sorcerer's Apprentice: a duplicate ACK must not send the next
			// block twice.
			for b, n := range c.arrivals {
				if n != 1 {
					t.Errorf("block %d arrived %d times", b, n)
				}
			}
		}},
		{name: "windowsize 8, DATA lost", opts: []string{"windowsize", "8"}, setup: func(c *scriptedTFTP) {
			c.loseData = func(b uint64, n int) bool { return n == 1 && b == 20 }
		}, check: func(t *testing.T, c *scriptedTFTP) {
			if c.oack["windowsize"] != "8" {
				t.Errorf("OACK %v, want windowsize 8", c.oack)
			}
			// The client's ACK of 19 makes the server go on from 20 at once
			// (RFC 7440): 20 to 24 arrive twice, nothing waits for a timeout.
			for b, n := range c.arrivals {
				if want := 1 + btoi(b >= 20 && b <= 24); n != want {
					t.Errorf("block %d arrived %d times, want %d", b, n, want)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The faults are the only reason to retransmit: a timeout long
			// enough that a loaded machine (make test boots VMs beside this)
			// never stalls the client past it, short enough that the three
			// lost blocks cost under a second.
			s, addr := startTFTP(t, root, func(s *TFTPServer) { s.Timeout = 300 * time.Millisecond })
			c := newScriptedTFTP(t)
			if tc.setup != nil {
				tc.setup(c)
			}
			got := c.get(addr, "ipxe.efi", tc.opts...)
			if !bytes.Equal(got, want) {
				t.Fatalf("got %d bytes, want the %d-byte file", len(got), len(want))
			}
			st := waitStats(s, func(st TFTPStats) bool { return st.Transfers == 1 })
			if st.Transfers != 1 || st.Failed != 0 {
				t.Errorf("stats %+v", st)
			}
			if !strings.HasPrefix(tc.name, "windowsize") && st.Retransmits != tc.retransmits {
				t.Errorf("%d retransmits, want %d", st.Retransmits, tc.retransmits)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

// TestTFTPOptions: blksize from the smallest RFC 2348 allows to the largest, and
// beyond; tsize; timeout; options the server does not know.
func TestTFTPOptions(t *testing.T) {
	root, files := tftpRoot(t)
	_, addr := startTFTP(t, root, nil)
	want := files["sub/snponly.efi"] // 4000 bytes
	for _, tc := range []struct {
		opts []string
		oack map[string]string // nil: no OACK, the data at once
	}{
		{nil, nil},
		{[]string{"blksize", "8"}, map[string]string{"blksize": "8"}},
		{[]string{"blksize", "7"}, nil},
		{[]string{"blksize", "512"}, map[string]string{"blksize": "512"}},
		{[]string{"blksize", "1468", "tsize", "0"}, map[string]string{"blksize": "1468", "tsize": "4000"}},
		{[]string{"BLKSIZE", "65464"}, map[string]string{"blksize": "65464"}},
		{[]string{"blksize", "65465"}, map[string]string{"blksize": "65464"}},
		{[]string{"blksize", "99999999999999999999"}, map[string]string{"blksize": "65464"}},
		{[]string{"blksize", "x"}, nil},
		{[]string{"tsize", "0", "timeout", "3"}, map[string]string{"tsize": "4000", "timeout": "3"}},
		{[]string{"timeout", "0", "multicast", "", "frob", "1"}, nil},
		{[]string{"windowsize", "1000"}, map[string]string{"windowsize": strconv.Itoa(tftpMaxWindow)}},
	} {
		name := strings.Join(tc.opts, " ")
		c := newScriptedTFTP(t)
		got := c.get(addr, "sub/snponly.efi", tc.opts...)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: got %d bytes, want the %d-byte file", name, len(got), len(want))
		}
		if len(c.oack) != len(tc.oack) {
			t.Errorf("%s: OACK %v, want %v", name, c.oack, tc.oack)
			continue
		}
		for k, v := range tc.oack {
			if c.oack[k] != v {
				t.Errorf("%s: OACK %v, want %v", name, c.oack, tc.oack)
			}
		}
	}

	// A file that is a whole number of blocks ends with an empty block.
	c := newScriptedTFTP(t)
	if got := c.get(addr, "ipxe.efi", "blksize", "1024"); !bytes.Equal(got, files["ipxe.efi"]) {
		t.Errorf("ipxe.efi at 1024: %d bytes", len(got))
	}
	if c.arrivals[101] != 1 {
		t.Errorf("arrivals %v, want an empty block 101", c.arrivals[101])
	}
}

// TestTFTPMaxBlockSize: MaxBlockSize caps what a client gets.
func TestTFTPMaxBlockSize(t *testing.T) {
	root, files := tftpRoot(t)
	_, addr := startTFTP(t, root, func(s *TFTPServer) { s.MaxBlockSize = 1000 })
	c := newScriptedTFTP(t)
	if got := c.get(addr, "undionly.kpxe", "blksize", "1468"); !bytes.Equal(got, files["undionly.kpxe"]) {
		t.Errorf("got %d bytes", len(got))
	}
	if c.oack["blksize"] != "1000" {
		t.Errorf("OACK %v, want blksize 1000", c.oack)
	}
}

// TestTFTPBlockNumberWraps: a transfer of more than 65535 blocks goes on from
// block 0, as iPXE, tftp-hpa and curl expect.
func TestTFTPBlockNumberWraps(t *testing.T) {
	root := t.TempDir()
	file := bytes.Repeat([]byte("0123456789abcdef"), 65540*64/16) // 65540 blocks of 64
	if err := writeFile(root+"/big", file); err != nil {
		t.Fatal(err)
	}
	_, addr := startTFTP(t, root, nil)
	c := newScriptedTFTP(t)
	if got := c.get(addr, "big", "blksize", "64", "windowsize", "64"); !bytes.Equal(got, file) {
		t.Errorf("got %d bytes, want %d", len(got), len(file))
	}
}

// TestTFTPClientGoesAway: a client that closes its socket mid-transfer frees the
// slot as soon as the kernel says nobody listens there (ICMP port unreachable),
// well before the retries would run out.
func TestTFTPClientGoesAway(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, func(s *TFTPServer) {
		s.Timeout = 300 * time.Millisecond
		s.Retries = 10
	})
	op, _, conn := rawRRQ(t, addr, "undionly.kpxe")
	if op != tftpOpDATA {
		t.Fatalf("opcode %d, want DATA", op)
	}
	start := time.Now()
	conn.Close()
	// The first retransmission meets the closed port.
	st := waitStats(s, func(st TFTPStats) bool { return st.Failed == 1 })
	if st.Failed != 1 {
		t.Fatalf("stats %+v, want the transfer failed", st)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("failed after %v", d)
	}
}

// TestTFTPClientError: an ERROR from the client ends its transfer at once.
func TestTFTPClientError(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, nil)
	c := listenLoopback(t)
	c.WriteToUDPAddrPort([]byte("\x00\x01undionly.kpxe\x00octet\x00blksize\x001468\x00"), addr)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || binary.BigEndian.Uint16(buf[:n]) != tftpOpOACK {
		t.Fatalf("answer %q (%v), want an OACK", buf[:max(n, 0)], err)
	}
	// RFC 2347: a client that does not like the OACK answers with error 8, to the
	// transfer's port.
	if _, err := c.WriteToUDPAddrPort([]byte("\x00\x05\x00\x08no thanks\x00"), from); err != nil {
		t.Fatal(err)
	}
	if st := waitStats(s, func(st TFTPStats) bool { return st.Failed == 1 }); st.Failed != 1 || st.Transfers != 0 {
		t.Errorf("stats %+v, want the transfer failed", st)
	}
}

// TestTFTPRequestErrors: a WRQ, an unknown mode and a malformed request each get an
// error packet with the RFC 1350 code; datagrams that are no request get nothing.
func TestTFTPRequestErrors(t *testing.T) {
	root, _ := tftpRoot(t)
	s, addr := startTFTP(t, root, nil)
	for _, tc := range []struct {
		pkt  string
		code uint16
	}{
		{"\x00\x02x\x00octet\x00", 2},
		{"\x00\x01undionly.kpxe\x00mail\x00", 4},
		{"\x00\x01undionly.kpxe", 4},
		{"\x00\x01undionly.kpxe\x00", 4},
	} {
		c := listenLoopback(t)
		c.WriteToUDPAddrPort([]byte(tc.pkt), addr)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 600)
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || n < 4 || binary.BigEndian.Uint16(buf) != tftpOpERROR || binary.BigEndian.Uint16(buf[2:]) != tc.code {
			t.Errorf("%q: answer %q (%v), want error code %d", tc.pkt, buf[:max(n, 0)], err, tc.code)
		}
	}
	c := listenLoopback(t)
	for _, pkt := range []string{"\x00\x04\x00\x01", "\x00\x05\x00\x00x\x00", "\x00"} {
		c.WriteToUDPAddrPort([]byte(pkt), addr)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, _, err := c.ReadFromUDPAddrPort(make([]byte, 100)); err == nil {
		t.Errorf("answered a datagram that is no request with %d bytes", n)
	}
	if st := s.Stats(); st.Errors != 5 || st.Refused != 2 {
		t.Errorf("stats %+v, want 5 errors and 2 refused", st)
	}
}

// TestTFTPNetascii: netascii turns LF into CR LF and CR into CR NUL.
func TestTFTPNetascii(t *testing.T) {
	root := t.TempDir()
	if err := writeFile(root+"/text", []byte("a\nb\rc")); err != nil {
		t.Fatal(err)
	}
	s, addr := startTFTP(t, root, nil)
	c := newScriptedTFTP(t)
	rrq := []byte("\x00\x01text\x00netascii\x00")
	c.conn.WriteToUDPAddrPort(rrq, addr)
	c.conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 600)
	n, from, err := c.conn.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[4:n]) != "a\r\nb\r\x00c" {
		t.Fatalf("got %q (%v)", buf[:max(n, 0)], err)
	}
	c.conn.WriteToUDPAddrPort([]byte{0, tftpOpACK, 0, 1}, from)
	if st := waitStats(s, func(st TFTPStats) bool { return st.Transfers == 1 }); st.Bytes != 7 {
		t.Errorf("stats %+v, want 7 bytes sent", st)
	}
}

// TestTFTPNetasciiStreamed: netascii is converted block by block, pairs split
// across block boundaries, blocks lost and sent again (lock-step and windowed),
// from the cache and from a file read with pread; what arrives is the whole
// file converted, and tsize is the converted size.
func TestTFTPNetasciiStreamed(t *testing.T) {
	root := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	text := make([]byte, 3000)
	for i := range text {
		text[i] = "ab\n\r"[rng.IntN(4)]
	}
	if err := writeFile(root+"/text", text); err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, c := range text {
		switch c {
		case '\n':
			want = append(want, '\r', '\n')
		case '\r':
			want = append(want, '\r', 0)
		default:
			want = append(want, c)
		}
	}
	for _, cached := range []bool{true, false} {
		s, addr := startTFTP(t, root, func(s *TFTPServer) {
			s.Timeout = 100 * time.Millisecond
			if !cached {
				s.cacheLimit = 1
			}
		})
		for _, opts := range [][]string{{"blksize", "8", "tsize", "0"}, {"blksize", "9", "windowsize", "4"}, {"blksize", "1468"}} {
			c := newScriptedTFTP(t)
			c.mode = "netascii"
			c.loseData = func(b uint64, n int) bool { return n == 1 && b%97 == 5 }
			got := c.get(addr, "text", opts...)
			if !bytes.Equal(got, want) {
				t.Errorf("cached %v, %v: got %d bytes, want %d converted", cached, opts, len(got), len(want))
			}
			if opts[len(opts)-2] == "tsize" && c.oack["tsize"] != strconv.Itoa(len(want)) {
				t.Errorf("tsize %q, want %d", c.oack["tsize"], len(want))
			}
		}
		if st := waitStats(s, func(st TFTPStats) bool { return st.Transfers == 3 }); st.Transfers != 3 || st.Bytes != 3*uint64(len(want)) {
			t.Errorf("cached %v: stats %+v", cached, st)
		}
	}
}

func TestParseTFTPRequest(t *testing.T) {
	r, err := parseTFTPRequest([]byte("\x00\x01a/b\x00OCTET\x00blksize\x001468\x00BlkSize\x00512\x00tsize\x000\x00pad"))
	if err != nil {
		t.Fatal(err)
	}
	if r.op != 1 || r.name != "a/b" || r.mode != "octet" || len(r.opts) != 2 || r.opts[0] != (tftpOption{"blksize", "1468"}) || r.opts[1] != (tftpOption{"tsize", "0"}) {
		t.Errorf("%+v", r)
	}
	for _, b := range []string{"", "\x00", "\x00\x03x\x00octet\x00", "\x00\x01x", "\x00\x01x\x00octet"} {
		if _, err := parseTFTPRequest([]byte(b)); err == nil {
			t.Errorf("%q parsed", b)
		}
	}
}

// FuzzParseTFTPRequest: the parser never panics, and what it accepts has the
// shape a request must have.
func FuzzParseTFTPRequest(f *testing.F) {
	f.Add([]byte("\x00\x01undionly.kpxe\x00octet\x00blksize\x001468\x00tsize\x000\x00"))
	f.Add([]byte("\x00\x02x\x00netascii\x00"))
	f.Add([]byte("\x00\x01\x00\x00\x00\x00"))
	f.Add([]byte("\x00\x01a\x00octet\x00windowsize\x0099999999999999999999999\x00timeout\x00"))
	s := &TFTPServer{}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseTFTPRequest(b)
		if err != nil {
			return
		}
		if r.op != tftpOpRRQ && r.op != tftpOpWRQ {
			t.Fatalf("opcode %d accepted", r.op)
		}
		if r.mode != strings.ToLower(r.mode) || strings.ContainsRune(r.name, 0) {
			t.Fatalf("%+v", r)
		}
		g := s.negotiate(r, 12345, 1468)
		if g.blksize < tftpMinBlksize || g.blksize > 1468 || g.window < 1 || g.window > tftpMaxWindow || g.timeout < time.Second || g.timeout > tftpMaxTimeout*time.Second {
			t.Fatalf("%+v negotiated %+v", r, g)
		}
		if g.oack != nil {
			if _, err := parseTFTPRequest(append([]byte{0, 1}, append([]byte("n\x00octet\x00"), g.oack[2:]...)...)); err != nil {
				t.Fatalf("OACK %q does not parse: %v", g.oack, err)
			}
		}
	})
}

// FuzzTFTPTransferReceive: whatever a client sends, the transfer neither panics nor
// runs past the file, and only acknowledgements of what was sent move it on.
func FuzzTFTPTransferReceive(f *testing.F) {
	f.Add([]byte("\x00\x04\x00\x00\x00\x04\x00\x01\x00\x04\x00\x01\x00\x05\x00\x00\x00"), uint16(512), uint8(1))
	f.Add([]byte("\x00\x04\x00\x02\x00\x04\xff\xff\x00\x03\x00\x01"), uint16(8), uint8(4))
	data := bytes.Repeat([]byte{7}, 5000)
	f.Fuzz(func(t *testing.T, script []byte, blksize uint16, window uint8) {
		g := tftpGrant{blksize: max(int(blksize), 8), window: max(int(window)%(tftpMaxWindow+1), 1), timeout: time.Second}
		if len(script)%2 == 0 {
			g.oack = []byte("\x00\x06blksize\x008\x00")
		}
		tr := newTFTPTransfer(tftpRequest{name: "f"}, memTFTPFile(data), int64(len(data)), g)
		tr.retries = 3
		openDiscard(t, &tr.tftpSock)
		defer tr.close()
		if err := tr.begin(0); err != nil {
			t.Fatal(err)
		}
		for i := 0; i+4 <= len(script); i += 4 {
			before := tr.acked
			done, err := tr.receive(script[i:i+4], time.Duration(i))
			if tr.acked > tr.sent || tr.sent > tr.nblocks || tr.acked < before {
				t.Fatalf("acked %d sent %d of %d", tr.acked, tr.sent, tr.nblocks)
			}
			if done != (tr.acked == tr.nblocks) {
				t.Fatalf("done %v with %d of %d acknowledged", done, tr.acked, tr.nblocks)
			}
			if done || err != nil {
				if err != nil && !errors.Is(err, errTFTPClientError) {
					t.Fatal(err)
				}
				return
			}
		}
	})
}

func writeFile(name string, b []byte) error { return os.WriteFile(name, b, 0o644) }

// openDiscard connects sock to a loopback port that reads nothing, so that what a
// transfer sends goes somewhere harmless.
func openDiscard(t *testing.T, sock *tftpSock) {
	t.Helper()
	sink := listenLoopback(t)
	if err := sock.open(netip.Addr{}, sink.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
