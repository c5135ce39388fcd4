package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkTFTP sends a 1 MiB file to 1, 16, 64 and 256 clients at once at blksize 512
// and 1468, the sizes of an iPXE binary and of what iPXE negotiates. The clients are
// minimal lock-step TFTP clients in this process, sharing the cores with the server.
func BenchmarkTFTP(b *testing.B) {
	root := b.TempDir()
	file := make([]byte, 1<<20)
	for i := range file {
		file[i] = byte(i * 7)
	}
	if err := os.WriteFile(filepath.Join(root, "file"), file, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, blksize := range []int{512, 1468} {
		for _, clients := range []int{1, 16, 64, 256} {
			b.Run(fmt.Sprintf("blksize=%d/clients=%d", blksize, clients), func(b *testing.B) {
				s, addr := startTFTP(b, root, nil) // the defaults, as bcd site runs it
				var left atomic.Int64
				left.Store(int64(b.N))
				var wg sync.WaitGroup
				b.SetBytes(int64(len(file)))
				b.ResetTimer()
				start := time.Now()
				for range clients {
					wg.Go(func() {
						c := newRawTFTPClient(b)
						defer c.conn.Close()
						for left.Add(-1) >= 0 {
							n, err := c.get(addr, "file", blksize)
							if err != nil {
								b.Error(err)
								return
							}
							if n != len(file) {
								b.Errorf("got %d bytes", n)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)*float64(len(file))/(1<<20)/time.Since(start).Seconds(), "MiB/s")
				st := s.Stats()
				b.ReportMetric(float64(st.Retransmits), "retransmits")
				b.ReportMetric(float64(st.Waits), "waits")
			})
		}
	}
}

// rawTFTPClient is a lock-step TFTP reader with no allocation per block, so that the
// benchmark measures the server.
type rawTFTPClient struct {
	conn *net.UDPConn
	buf  []byte
	out  []byte
	oack []byte
}

// oackBlksize reads blksize from an OACK's options.
func oackBlksize(opts []byte, def int) int {
	f := bytes.Split(opts, []byte{0})
	for i := 0; i+1 < len(f); i += 2 {
		if string(f[i]) == "blksize" {
			if n, err := strconv.Atoi(string(f[i+1])); err == nil {
				return n
			}
		}
	}
	return def
}

func newRawTFTPClient(t testing.TB) *rawTFTPClient {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return &rawTFTPClient{conn: c, buf: make([]byte, 70000), out: make([]byte, 0, 600)}
}

func (c *rawTFTPClient) get(addr netip.AddrPort, name string, blksize int) (int, error) {
	rrq := append(c.out[:0], 0, 1)
	rrq = append(rrq, name...)
	rrq = append(rrq, "\x00octet\x00tsize\x000\x00"...)
	if blksize != 512 {
		rrq = append(rrq, "blksize\x00"...)
		rrq = strconv.AppendInt(rrq, int64(blksize), 10)
		rrq = append(rrq, 0)
	}
	last := rrq
	dst := addr
	var server netip.AddrPort
	var ack [4]byte
	binary.BigEndian.PutUint16(ack[:], 4)
	want := uint16(1)
	total := 0
	if _, err := c.conn.WriteToUDPAddrPort(last, dst); err != nil {
		return 0, err
	}
	for tries := 0; ; {
		c.conn.SetReadDeadline(time.Now().Add(time.Second))
		n, from, err := c.conn.ReadFromUDPAddrPort(c.buf)
		if err != nil {
			if tries++; tries > 5 {
				return total, err
			}
			c.conn.WriteToUDPAddrPort(last, dst)
			continue
		}
		if server.IsValid() && from != server || n < 4 {
			continue
		}
		server, dst = from, from
		switch binary.BigEndian.Uint16(c.buf) {
		case 6: // OACK: the server may grant a smaller block size
			c.oack = append(c.oack[:0], c.buf[2:n]...)
			blksize = oackBlksize(c.buf[2:n], 512)
			binary.BigEndian.PutUint16(ack[2:], 0)
		case 3: // DATA
			block := binary.BigEndian.Uint16(c.buf[2:])
			binary.BigEndian.PutUint16(ack[2:], block)
			if block == want {
				total += n - 4
				want++
				if n-4 < blksize {
					_, err := c.conn.WriteToUDPAddrPort(ack[:], dst)
					return total, err
				}
			}
		case 5:
			return total, errors.New("error packet: " + string(c.buf[4:n]))
		default:
			continue
		}
		last = ack[:]
		if _, err := c.conn.WriteToUDPAddrPort(last, dst); err != nil {
			return total, err
		}
	}
}
