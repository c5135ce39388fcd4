package boot

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// BenchmarkProxyDHCPOffer measures DISCOVER → OFFER on loopback with a number of
// clients in flight, each waiting for its offer before sending the next DISCOVER,
// as a fleet of machines powered on together does. Client and server share the
// machine's cores.
func BenchmarkProxyDHCPOffer(b *testing.B) {
	for _, inflight := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			benchmarkOffers(b, inflight, nil)
		})
	}
}

func benchmarkOffers(b *testing.B, inflight int, configure func(*ProxyDHCP)) {
	h := startProxy(b, configure)
	h.srv.Observer = nil
	tmpl := pxeRequest(b, testMAC, 7, "PXEClient:Arch:00007:UNDI:003010",
		dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))).ToBytes()
	send, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(h.dhcp))
	if err != nil {
		b.Fatal(err)
	}
	defer send.Close()
	wake := make([]chan uint32, inflight)
	for i := range wake {
		wake[i] = make(chan uint32, 4)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := h.conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n >= 8 {
				xid := binary.BigEndian.Uint32(buf[4:8])
				if slot := int(xid & 0xffff); slot < inflight {
					select {
					case wake[slot] <- xid:
					default:
					}
				}
			}
		}
	}()
	var left atomic.Int64
	left.Store(int64(b.N))
	var lost atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for slot := range inflight {
		wg.Go(func() {
			pkt := append([]byte(nil), tmpl...)
			timer := time.NewTimer(time.Hour)
			for seq := uint32(1); left.Add(-1) >= 0; seq++ {
				xid := seq<<16 | uint32(slot)
				binary.BigEndian.PutUint32(pkt[4:8], xid)
				for {
					if _, err := send.Write(pkt); err != nil {
						b.Error(err)
						return
					}
					timer.Reset(time.Second)
					got := false
					for !got {
						select {
						case x := <-wake[slot]:
							got = x == xid
							continue
						case <-timer.C:
						}
						break
					}
					if got {
						break
					}
					lost.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	h.conn.Close()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "offers/s")
	b.ReportMetric(float64(lost.Load()), "retries")
}

// BenchmarkHandleDHCP is the per-packet work alone: parse, decide, build, marshal.
func BenchmarkHandleDHCP(b *testing.B) {
	s := &ProxyDHCP{ServerIP: testServerIP, URL: testURL, Table: tableOf(b, testMAC), BroadcastAddr: h68}
	if err := s.setup(); err != nil {
		b.Fatal(err)
	}
	req := pxeRequest(b, testMAC, 7, "PXEClient:Arch:00007:UNDI:003010",
		dhcpv4.WithGeneric(dhcpv4.OptionUserClassInformation, []byte("iPXE"))).ToBytes()
	src := netip.MustParseAddrPort("0.0.0.0:68")
	out := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := s.handle(req, out, false, src); !ok {
			b.Fatal("no answer")
		}
	}
}

var h68 = netip.MustParseAddrPort("127.0.0.1:68")
