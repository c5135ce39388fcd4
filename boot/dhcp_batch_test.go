package boot

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// TestProxyDHCPBurst: a burst queued on the socket before the server reads it, PXE
// DISCOVERs mixed with junk and with packets it must not answer, gets one OFFER per
// DISCOVER, each to its own transaction, with recvmmsg/sendmmsg batches (the
// default) and one datagram a syscall alike.
func TestProxyDHCPBurst(t *testing.T) {
	for _, batch := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			const n = 200
			macs := make([]net.HardwareAddr, n)
			for i := range macs {
				macs[i] = net.HardwareAddr{0x52, 0x54, 0, 0xcc, byte(i >> 8), byte(i)}
			}
			h := startProxy(t, func(s *ProxyDHCP) {
				s.Batch = batch
				s.Workers = 1
				s.Table = tableOf(t, macs...)
			})
			// 200 answers at once overflow a default receive buffer.
			if err := h.conn.SetReadBuffer(4 << 20); err != nil {
				t.Fatal(err)
			}
			unknown := pxeRequest(t, net.HardwareAddr{0x52, 0x54, 0, 0xdd, 0, 1}, 0, "PXEClient:Arch:00000:UNDI:002001").ToBytes()
			want := map[uint32]bool{}
			for i, mac := range macs {
				p := pxeRequest(t, mac, 7, "PXEClient:Arch:00007:UNDI:003000").ToBytes()
				xid := uint32(0x10000 + i)
				binary.BigEndian.PutUint32(p[4:8], xid)
				want[xid] = true
				for _, b := range [][]byte{p, []byte("not DHCP"), unknown} {
					if _, err := h.conn.WriteToUDPAddrPort(b, h.dhcp); err != nil {
						t.Fatal(err)
					}
				}
			}
			got := map[uint32]int{}
			buf := make([]byte, 1500)
			h.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			for len(got) < n {
				k, err := h.conn.Read(buf)
				if err != nil {
					t.Fatalf("%d of %d OFFERs: %v; server %+v", len(got), n, err, h.srv.Stats())
				}
				p, err := dhcpv4.FromBytes(buf[:k])
				if err != nil {
					t.Fatal(err)
				}
				xid := binary.BigEndian.Uint32(p.TransactionID[:])
				if !want[xid] {
					t.Fatalf("an answer to xid %#x, which was not a known DISCOVER", xid)
				}
				if p.MessageType() != dhcpv4.MessageTypeOffer || p.BootFileName != "ipxe.efi" {
					t.Fatalf("xid %#x: %s file %q", xid, p.MessageType(), p.BootFileName)
				}
				got[xid]++
			}
			h.conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			if k, err := h.conn.Read(buf); err == nil {
				t.Fatalf("an extra answer of %d bytes", k)
			}
			for xid, c := range got {
				if c != 1 {
					t.Errorf("xid %#x answered %d times", xid, c)
				}
			}
			st := h.srv.Stats()
			if st.Offers != n || st.Malformed != n || st.IgnoredByReason[IgnoredNoEntry] != n || st.SendErrors != 0 {
				t.Errorf("stats %+v", st)
			}
			if ev := h.events.all(); len(ev) != n {
				t.Errorf("%d events, want %d", len(ev), n)
			}
		})
	}
}
