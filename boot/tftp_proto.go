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
	// tftpMaxTimeout is the longest timeout option (RFC 2349) the server
	// accepts. A client asking for more is answered without the option and gets
	// the server's timeout: a few packets asking for 255 s and never
	// acknowledging must not hold transfers for minutes each.
	tftpMaxTimeout = 5
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
// maxBlk, tsize answered with the size, timeout of 1 to tftpMaxTimeout seconds
// (RFC 2349 has the OACK echo the value asked for, so a longer one is left out
// rather than lowered), windowsize up to tftpMaxWindow. An option it does not know or whose value is out of range is
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
			if !ok || n < 1 || n > tftpMaxTimeout {
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

// tftpErrorPacket appends an error packet for err to b. The client reads only the
// fixed text of err's code: err's detail (an os.Root error such as "statat
// passwd_link: path escapes from parent", a size, a path element) tells a
// stranger on the provisioning network what is on the server, so it stays in the
// server's log.
func tftpErrorPacket(b []byte, err error) []byte {
	b = append(b, 0, tftpOpERROR, 0, 0)
	binary.BigEndian.PutUint16(b[len(b)-2:], tftpErrorCode(err))
	b = append(b, tftpClientMessage(err)...)
	return append(b, 0)
}

// tftpClientMessage is the text an error packet carries for err: one of the
// fixed texts of errTFTPNotFound, errTFTPAccess, errTFTPReadOnly and
// errTFTPIllegal, whatever err wraps them with.
func tftpClientMessage(err error) string {
	for _, known := range []error{errTFTPReadOnly, errTFTPNotFound, errTFTPAccess, errTFTPIllegal} {
		if errors.Is(err, known) {
			return known.Error()
		}
	}
	return "transfer failed"
}

// tftpAsciiPos is where a netascii block starts in the file: the offset of the
// next byte to convert, and the second byte of a CR LF or CR NUL pair that the
// previous block had no room for (-1: none).
type tftpAsciiPos struct {
	src   int64
	carry int16
}

// fillNetascii converts the file from pos into out (LF becomes CR LF and a bare
// CR becomes CR NUL, RFC 764) until out is full or the file ends, and says how
// much it wrote and where the next block starts. Nothing is kept of the
// converted file: a block sent again is converted again from its start.
func (f *tftpFile) fillNetascii(out, scratch []byte, pos tftpAsciiPos) (int, tftpAsciiPos, error) {
	n := 0
	if pos.carry >= 0 && len(out) > 0 {
		out[0] = byte(pos.carry)
		n, pos.carry = 1, -1
	}
	for n < len(out) && pos.src < f.size {
		// Each byte of the file makes one or two on the wire: what is left of
		// out is enough of the file to read.
		src, err := f.view(pos.src, int(min(int64(len(out)-n), f.size-pos.src)), scratch)
		if err != nil {
			return n, pos, err
		}
		for _, c := range src {
			if n == len(out) {
				break
			}
			pos.src++
			var second int16 = -1
			switch c {
			case '\n':
				out[n], second = '\r', '\n'
			case '\r':
				out[n], second = '\r', 0
			default:
				out[n] = c
			}
			n++
			if second >= 0 {
				if n < len(out) {
					out[n] = byte(second)
					n++
				} else {
					pos.carry = second
				}
			}
		}
	}
	return n, pos, nil
}

// netasciiSize is the size of the file once converted to netascii; it reads the
// file through once, keeping nothing.
func (f *tftpFile) netasciiSize(scratch []byte) (int64, error) {
	f.asciiOnce.Do(func() {
		size := f.size
		for off := int64(0); off < f.size; {
			b, err := f.view(off, int(min(int64(len(scratch)), f.size-off)), scratch)
			if err != nil {
				f.asciiErr = err
				return
			}
			for _, c := range b {
				if c == '\n' || c == '\r' {
					size++
				}
			}
			off += int64(len(b))
		}
		f.asciiSize = size
	})
	return f.asciiSize, f.asciiErr
}

// tftpTransfer is one RRQ being answered: which blocks are out, which are
// acknowledged, and when to send again. Its methods are called by one goroutine at
// a time (the poller's). It holds no copy of the file: each block is read from
// the shared cached contents or with pread at its offset into the poller's one
// send buffer, so a transfer costs a few hundred bytes and a socket.
type tftpTransfer struct {
	tftpSock // the socket connected to the client

	name    string
	remote  netip.AddrPort
	file    *tftpFile
	ascii   bool
	size    int64 // bytes on the wire: the file's, or its netascii conversion's
	blksize int
	window  int
	timeout time.Duration
	retries int
	// life bounds the whole transfer, however steadily the client acknowledges.
	life time.Duration

	oack    []byte // the OACK, until the client acknowledges it
	nblocks uint64 // blocks in the transfer, the last one shorter than blksize (maybe empty)
	acked   uint64 // blocks acknowledged
	sent    uint64 // blocks sent
	tries   int    // timeouts since the last progress
	heard   bool   // the client acknowledged something: it is no spoofed source
	// deadline is when to send again, end when to give up, on the poller's clock.
	deadline    time.Duration
	end         time.Duration
	retransmits uint64
	// pkt and scratch are the send buffer and a read buffer; on Linux the
	// poller's, shared by all its transfers.
	pkt, scratch []byte
	// apos is, for netascii, where blocks acked+1 to sent+1 start in the file,
	// block b at b mod len(apos).
	apos []tftpAsciiPos
}

// The first packet of a transfer (its OACK or first block) is sent at most
// tftpFirstRetries times more, tftpFirstTimeout apart at most, before the client
// has acknowledged anything: a request from a spoofed source, which never will,
// holds its socket for about three seconds.
const (
	tftpFirstTimeout = time.Second
	tftpFirstRetries = 2
)

func newTFTPTransfer(r tftpRequest, f *tftpFile, size int64, g tftpGrant) *tftpTransfer {
	t := &tftpTransfer{
		name:    r.name,
		file:    f,
		ascii:   r.mode == "netascii",
		size:    size,
		blksize: g.blksize,
		window:  g.window,
		timeout: g.timeout,
		oack:    g.oack,
		nblocks: uint64(size/int64(g.blksize)) + 1,
		life:    tftpDefaultLife,
	}
	if t.ascii {
		t.apos = make([]tftpAsciiPos, g.window+1)
		t.apos[1%len(t.apos)] = tftpAsciiPos{carry: -1}
	}
	return t
}

func (t *tftpTransfer) bytesAcked() int64 {
	return min(int64(t.acked)*int64(t.blksize), t.size)
}

// wait is how long to wait for the next acknowledgement, and tries how many
// times to send again: fewer and sooner until the client has been heard from.
func (t *tftpTransfer) wait() (time.Duration, int) {
	if !t.heard {
		return min(t.timeout, tftpFirstTimeout), min(t.retries, tftpFirstRetries)
	}
	return t.timeout, t.retries
}

func (t *tftpTransfer) setDeadline(now time.Duration) {
	d, _ := t.wait()
	t.deadline = min(now+d, t.end)
}

// begin sends the first packet: the OACK, or the first window of data.
func (t *tftpTransfer) begin(now time.Duration) error {
	t.end = now + t.life
	if t.pkt == nil {
		t.pkt, t.scratch = make([]byte, 4+t.blksize), make([]byte, t.blksize)
	}
	if t.oack != nil {
		t.setDeadline(now)
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
	t.setDeadline(now)
	return nil
}

// errTFTPFileChanged is a transfer whose file came up short of the size it
// announced: it was truncated while being sent.
var errTFTPFileChanged = errors.New("the file changed while being sent")

// sendBlock sends block b (counted from 1; its number on the wire wraps at 16 bits).
func (t *tftpTransfer) sendBlock(b uint64) error {
	off := int64(b-1) * int64(t.blksize)
	want := int(min(int64(t.blksize), t.size-off))
	out := t.pkt[4 : 4+want]
	if t.ascii {
		pos := t.apos[b%uint64(len(t.apos))]
		n, next, err := t.file.fillNetascii(out, t.scratch, pos)
		if err != nil {
			return err
		}
		if n != want {
			return errTFTPFileChanged
		}
		t.apos[(b+1)%uint64(len(t.apos))] = next
	} else if err := t.file.readAt(out, off); err != nil {
		return err
	}
	t.pkt[0], t.pkt[1] = 0, tftpOpDATA
	binary.BigEndian.PutUint16(t.pkt[2:], uint16(b))
	return t.write(t.pkt[:4+want])
}

// errTFTPClientError is a transfer the client ended with an error packet.
var errTFTPClientError = errors.New("the client sent an error")

// errTFTPTimedOut is a transfer whose client stopped acknowledging.
var errTFTPTimedOut = errors.New("no acknowledgement")

// errTFTPTooLong is a transfer that outlived its bound (TransferTimeout).
var errTFTPTooLong = errors.New("the transfer took longer than allowed")

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
		t.heard = true
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
	t.heard = true
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

// expire sends again what is unacknowledged, or gives up after the retries or
// past the transfer's life.
func (t *tftpTransfer) expire(now time.Duration) error {
	if now >= t.end {
		return errTFTPTooLong
	}
	if _, retries := t.wait(); t.tries >= retries {
		return errTFTPTimedOut
	}
	t.tries++
	t.setDeadline(now)
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
