package sim

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// TFTP as firmware speaks it (RFC 1350 with the blksize and tsize options of RFC
// 2347–2349), written here because bcd must not link the tests' TFTP library
// (internal/guard); it is a client only, one block in flight, as PXE ROMs are.

const (
	tftpRRQ   = 1
	tftpDATA  = 3
	tftpACK   = 4
	tftpERROR = 5
	tftpOACK  = 6
)

// TFTPError is an error packet from the server: firmware gives up its boot on one.
type TFTPError struct {
	Code int
	Msg  string
}

func (e *TFTPError) Error() string { return fmt.Sprintf("tftp error %d: %s", e.Code, e.Msg) }

// tftpGet fetches file from server:69 from a socket bound to ip and returns its
// size and SHA-256. Lost packets are sent again after a timeout, up to tries times
// each (firmware does the same; a server beyond capacity may rely on it).
func tftpGet(ctx context.Context, ip netip.Addr, server netip.AddrPort, file string, blksize int) (int64, [32]byte, int, error) {
	var sum [32]byte
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(ip, 0)))
	if err != nil {
		return 0, sum, 0, fmt.Errorf("tftp: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	rrq := []byte{0, tftpRRQ}
	rrq = append(rrq, file...)
	rrq = append(rrq, 0)
	rrq = append(rrq, "octet\x00blksize\x00"...)
	rrq = append(rrq, strconv.Itoa(blksize)...)
	rrq = append(rrq, "\x00tsize\x000\x00"...)

	h := sha256.New()
	var (
		peer     netip.AddrPort
		size     int64
		expect   uint16 = 1
		last            = rrq
		lastTo          = server
		retrans  int
		tries    = 0
		buf      = make([]byte, 65536)
		negBlk   = 512
		accepted = false
	)
	const timeout = time.Second
	for {
		if _, err := conn.WriteToUDPAddrPort(last, lastTo); err != nil {
			return size, sum, retrans, fmt.Errorf("tftp: %w", err)
		}
	recv:
		conn.SetReadDeadline(time.Now().Add(timeout))
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil {
				return size, sum, retrans, ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				tries++
				retrans++
				if tries > 8 {
					return size, sum, retrans, fmt.Errorf("tftp %s: no answer after %d tries (block %d)", file, tries, expect)
				}
				continue
			}
			return size, sum, retrans, fmt.Errorf("tftp: %w", err)
		}
		if peer.IsValid() && from != peer {
			goto recv // another port: not our transfer
		}
		p := buf[:n]
		if len(p) < 4 {
			goto recv
		}
		switch binary.BigEndian.Uint16(p) {
		case tftpERROR:
			return size, sum, retrans, &TFTPError{Code: int(binary.BigEndian.Uint16(p[2:])), Msg: strings.TrimRight(string(p[4:]), "\x00")}
		case tftpOACK:
			if accepted {
				goto recv
			}
			peer, accepted = from, true
			for _, kv := range pairs(p[2:]) {
				if strings.EqualFold(kv[0], "blksize") {
					negBlk, _ = strconv.Atoi(kv[1])
				}
			}
			last, lastTo, tries = []byte{0, tftpACK, 0, 0}, peer, 0
		case tftpDATA:
			if !peer.IsValid() {
				peer = from
			}
			accepted = true
			blk := binary.BigEndian.Uint16(p[2:])
			if blk != expect {
				// A duplicate: ACK it again so the server moves on.
				if _, err := conn.WriteToUDPAddrPort([]byte{0, tftpACK, byte(blk >> 8), byte(blk)}, peer); err != nil {
					return size, sum, retrans, err
				}
				goto recv
			}
			data := p[4:]
			h.Write(data)
			size += int64(len(data))
			last, lastTo, tries = []byte{0, tftpACK, byte(blk >> 8), byte(blk)}, peer, 0
			expect++
			if len(data) < negBlk {
				conn.WriteToUDPAddrPort(last, lastTo)
				copy(sum[:], h.Sum(nil))
				return size, sum, retrans, nil
			}
		default:
			goto recv
		}
	}
}

// pairs splits an OACK's NUL-separated option names and values.
func pairs(b []byte) [][2]string {
	f := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	var out [][2]string
	for i := 0; i+1 < len(f); i += 2 {
		out = append(out, [2]string{f[i], f[i+1]})
	}
	return out
}
