package boot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// TFTP opcodes (RFC 1350, RFC 2347).
const (
	tftpOpRRQ   = 1
	tftpOpWRQ   = 2
	tftpOpDATA  = 3
	tftpOpACK   = 4
	tftpOpERROR = 5
	tftpOpOACK  = 6
)

const (
	tftpMinBlksize = 8     // RFC 2348
	tftpMaxBlksize = 65464 // RFC 2348
	// tftpMaxWindow caps RFC 7440's windowsize: a window is that many blocks in
	// flight at once, and a lost one costs sending them all again.
	tftpMaxWindow = 64
)

// tftpRequest is a parsed RRQ or WRQ.
type tftpRequest struct {
	op   uint16
	name string
	mode string // lower case
	// opts holds the options in the order the client gave them, names in lower
	// case; a repeated option keeps its first value.
	opts []tftpOption
}

type tftpOption struct{ name, value string }

// parseTFTPRequest parses a read or write request: opcode, file name, mode, then
// option name and value pairs, each a string ended by a NUL. A trailing string
// without its NUL, or a name without a value, is ignored: some clients pad.
func parseTFTPRequest(b []byte) (tftpRequest, error) {
	var r tftpRequest
	if len(b) < 2 {
		return r, errors.New("datagram shorter than an opcode")
	}
	r.op = binary.BigEndian.Uint16(b)
	if r.op != tftpOpRRQ && r.op != tftpOpWRQ {
		return r, fmt.Errorf("opcode %d starts no transfer", r.op)
	}
	fields := make([]string, 0, 8)
	rest := b[2:]
	for len(rest) > 0 {
		i := indexByte(rest, 0)
		if i < 0 {
			break
		}
		fields = append(fields, string(rest[:i]))
		rest = rest[i+1:]
	}
	if len(fields) < 2 {
		return r, errors.New("request without a file name and a mode")
	}
	r.name, r.mode = fields[0], strings.ToLower(fields[1])
	for i := 2; i+1 < len(fields); i += 2 {
		name := strings.ToLower(fields[i])
		dup := false
		for _, o := range r.opts {
			dup = dup || o.name == name
		}
		if !dup {
			r.opts = append(r.opts, tftpOption{name, fields[i+1]})
		}
	}
	return r, nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// tftpGrant is what the server accepted of a request's options.
type tftpGrant struct {
	blksize int
	window  int
	timeout time.Duration
	oack    []byte // the OACK to send before the data; nil when no option was accepted
}

// negotiate picks the options the server accepts (RFC 2347): blksize up to
// maxBlk, tsize answered with the size, timeout of 1 to 255 seconds, windowsize up
// to tftpMaxWindow. An option it does not know or whose value is out of range is
// left out of the OACK, which tells the client it was not accepted.
func (s *TFTPServer) negotiate(r tftpRequest, size int64, maxBlk int) tftpGrant {
	g := tftpGrant{blksize: 512, window: 1, timeout: s.timeout()}
	var oack []byte
	add := func(name, value string) {
		if oack == nil {
			oack = []byte{0, tftpOpOACK}
		}
		oack = append(oack, name...)
		oack = append(oack, 0)
		oack = append(oack, value...)
		oack = append(oack, 0)
	}
	for _, o := range r.opts {
		n, ok := tftpOptionInt(o.value)
		switch o.name {
		case "blksize":
			if !ok || n < tftpMinBlksize {
				continue
			}
			g.blksize = int(min(n, int64(maxBlk)))
			add("blksize", strconv.Itoa(g.blksize))
		case "tsize":
			if !ok {
				continue
			}
			add("tsize", strconv.FormatInt(size, 10))
		case "timeout":
			if !ok || n < 1 || n > 255 {
				continue
			}
			g.timeout = time.Duration(n) * time.Second
			add("timeout", strconv.FormatInt(n, 10))
		case "windowsize":
			if !ok || n < 1 || n > 65535 {
				continue
			}
			g.window = int(min(n, tftpMaxWindow))
			add("windowsize", strconv.Itoa(g.window))
		}
	}
	g.oack = oack
	return g
}

// tftpOptionInt reads an option's decimal value; values beyond what any option
// allows are clamped rather than refused, so that blksize 99999 still gets the
// largest block.
func tftpOptionInt(v string) (int64, bool) {
	if v == "" || len(v) > 20 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n < 1<<32 {
			n = n*10 + int64(c-'0')
		}
	}
	return n, true
}

// tftpErrorPacket appends an error packet for err to b.
func tftpErrorPacket(b []byte, err error) []byte {
	b = append(b, 0, tftpOpERROR, 0, 0)
	binary.BigEndian.PutUint16(b[len(b)-2:], tftpErrorCode(err))
	b = append(b, err.Error()...)
	return append(b, 0)
}

// toNetascii converts a file for a netascii transfer: LF becomes CR LF and a bare
// CR becomes CR NUL (RFC 764).
func toNetascii(b []byte) []byte {
	out := make([]byte, 0, len(b)+len(b)/16)
	for _, c := range b {
		switch c {
		case '\n':
			out = append(out, '\r', '\n')
		case '\r':
			out = append(out, '\r', 0)
		default:
			out = append(out, c)
		}
	}
	return out
}

// tftpTransfer is one RRQ being answered: which blocks are out, which are
// acknowledged, and when to send again. Its methods are called by one goroutine at
// a time (the poller's).
type tftpTransfer struct {
	tftpSock // the socket connected to the client

	name    string
	remote  netip.AddrPort
	data    []byte
	blksize int
	window  int
	timeout time.Duration
	retries int

	oack    []byte // the OACK, until the client acknowledges it
	nblocks uint64 // blocks in the transfer, the last one shorter than blksize (maybe empty)
	acked   uint64 // blocks acknowledged
	sent    uint64 // blocks sent
	tries   int    // timeouts since the last progress
	// deadline is when to send again, on the poller's clock.
	deadline    time.Duration
	retransmits uint64
	pkt         []byte
}

func newTFTPTransfer(r tftpRequest, data []byte, g tftpGrant) *tftpTransfer {
	return &tftpTransfer{
		name:    r.name,
		data:    data,
		blksize: g.blksize,
		window:  g.window,
		timeout: g.timeout,
		oack:    g.oack,
		nblocks: uint64(len(data)/g.blksize) + 1,
		pkt:     make([]byte, 4+g.blksize),
	}
}

func (t *tftpTransfer) bytesAcked() int {
	return min(int(t.acked)*t.blksize, len(t.data))
}

// begin sends the first packet: the OACK, or the first window of data.
func (t *tftpTransfer) begin(now time.Duration) error {
	if t.oack != nil {
		t.deadline = now + t.timeout
		return t.write(t.oack)
	}
	return t.sendWindow(now)
}

// sendWindow sends the blocks after the last one sent, up to a window past the
// last one acknowledged.
func (t *tftpTransfer) sendWindow(now time.Duration) error {
	end := min(t.acked+uint64(t.window), t.nblocks)
	for b := t.sent + 1; b <= end; b++ {
		if err := t.sendBlock(b); err != nil {
			return err
		}
	}
	t.sent = max(t.sent, end)
	t.deadline = now + t.timeout
	return nil
}

// sendBlock sends block b (counted from 1; its number on the wire wraps at 16 bits).
func (t *tftpTransfer) sendBlock(b uint64) error {
	off := int(b-1) * t.blksize
	n := copy(t.pkt[4:], t.data[off:min(off+t.blksize, len(t.data))])
	t.pkt[0], t.pkt[1] = 0, tftpOpDATA
	binary.BigEndian.PutUint16(t.pkt[2:], uint16(b))
	return t.write(t.pkt[:4+n])
}

// errTFTPClientError is a transfer the client ended with an error packet.
var errTFTPClientError = errors.New("the client sent an error")

// errTFTPTimedOut is a transfer whose client stopped acknowledging.
var errTFTPTimedOut = errors.New("no acknowledgement")

// receive handles a datagram from the client: an ACK moves the window on, an
// ERROR ends the transfer, anything else is ignored. done says the last block is
// acknowledged.
func (t *tftpTransfer) receive(p []byte, now time.Duration) (done bool, err error) {
	if len(p) < 4 || p[0] != 0 {
		return false, nil
	}
	switch p[1] {
	case tftpOpERROR:
		msg := p[4:]
		if i := indexByte(msg, 0); i >= 0 {
			msg = msg[:i]
		}
		return false, fmt.Errorf("%w: code %d %q", errTFTPClientError, binary.BigEndian.Uint16(p[2:]), msg)
	case tftpOpACK:
	default:
		return false, nil
	}
	n := binary.BigEndian.Uint16(p[2:])
	if t.oack != nil {
		// Only ACK 0 acknowledges the OACK.
		if n != 0 {
			return false, nil
		}
		t.oack = nil
		t.tries = 0
		return false, t.sendWindow(now)
	}
	// Which of the blocks in flight n acknowledges, counting from the last one
	// acknowledged: 0 is a duplicate, which sends nothing (a lost block is sent
	// again on the timeout, never on an acknowledgement, lest every block go
	// twice from then on); beyond the blocks sent is nonsense.
	ahead := uint64(n - uint16(t.acked))
	if ahead == 0 || ahead > t.sent-t.acked {
		return false, nil
	}
	t.acked += ahead
	t.tries = 0
	if t.acked == t.nblocks {
		return true, nil
	}
	if t.acked < t.sent {
		// A windowsize client acknowledges the last block it has in order when
		// one is missing: go on from there (RFC 7440), rather than wait for the
		// timeout. Lock-step never gets here: its one block in flight is the one
		// acknowledged.
		t.retransmits += t.sent - t.acked
		t.sent = t.acked
	}
	return false, t.sendWindow(now)
}

// expire sends again what is unacknowledged, or gives up after the retries.
func (t *tftpTransfer) expire(now time.Duration) error {
	if t.tries++; t.tries > t.retries {
		return errTFTPTimedOut
	}
	t.deadline = now + t.timeout
	if t.oack != nil {
		return t.write(t.oack)
	}
	for b := t.acked + 1; b <= t.sent; b++ {
		if err := t.sendBlock(b); err != nil {
			return err
		}
		t.retransmits++
	}
	return nil
}
