package boot

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/ipv4"
)

// dhcpBatch is by default how many datagrams one read takes from a socket, and so how many
// replies one write sends: recvmmsg and sendmmsg. In a storm the syscalls are most
// of what a packet costs (BenchmarkSiteProxyDHCP's profile); a batch takes what is
// queued, at least one, and never waits for more, so one client in flight is
// answered as soon as before.
const dhcpBatch = 16

// batchLoop is loop with recvmmsg/sendmmsg (one datagram a call where the system
// has none): it reads up to batch datagrams, answers each in order, and sends the
// answers together.
func (s *ProxyDHCP) batchLoop(c *net.UDPConn, pxePort bool, batch int, stop int) {
	pc := ipv4.NewPacketConn(c)
	var ready *readyWaiter
	if stop >= 0 {
		restore, err := pinAndRaise(s.ThreadNice)
		defer restore()
		if err != nil && !s.niceWarned.Swap(true) {
			s.log.Warn("proxyDHCP: readers run at the process's priority", "err", err)
		}
		w, err := newReadyWaiter(c, stop)
		if err != nil {
			s.log.Warn("proxyDHCP: readers wait in the network poller", "err", err)
		}
		ready = w
	}
	in := make([]ipv4.Message, batch)
	// Room for any datagram, so that an oversized one is seen whole and rejected
	// rather than parsed truncated. The pages the kernel never writes into are
	// never touched.
	slab := make([]byte, batch*(64<<10))
	for i := range in {
		in[i].Buffers = [][]byte{slab[i*(64<<10) : (i+1)*(64<<10)]}
	}
	out := make([]ipv4.Message, batch)
	replies := make([][]byte, batch)
	addrs := make([]net.UDPAddr, batch)
	for i := range out {
		replies[i] = make([]byte, 0, 1024)
		addrs[i].IP = make(net.IP, 4)
		out[i].Buffers = [][]byte{nil}
		out[i].Addr = &addrs[i]
		out[i].OOB = s.oob
	}
	for {
		if ready != nil && !ready.wait() {
			return
		}
		n, err := pc.ReadBatch(in, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.stats.readErrors.Add(1)
			s.log.Warn("proxyDHCP: read failed", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		k := 0
		for i := range in[:n] {
			m := &in[i]
			var src netip.AddrPort
			if a, ok := m.Addr.(*net.UDPAddr); ok {
				src = a.AddrPort()
			}
			reply, dst, ok := s.handleSafe(m.Buffers[0][:m.N], replies[k][:0], pxePort, src)
			if !ok {
				continue
			}
			replies[k] = reply
			out[k].Buffers[0] = reply
			a := &addrs[k]
			ip4 := dst.Addr().Unmap().As4()
			copy(a.IP, ip4[:])
			a.Port = int(dst.Port())
			k++
		}
		s.sendBatch(pc, out[:k])
		for i := range replies[:k] {
			if cap(replies[i]) > 64<<10 {
				replies[i] = make([]byte, 0, 1024) // not a buffer grown for a long relay option
			}
		}
	}
}

// sendBatch sends ms, skipping (and counting) a reply the kernel refuses:
// sendmmsg stops at the first failure.
func (s *ProxyDHCP) sendBatch(pc *ipv4.PacketConn, ms []ipv4.Message) {
	for len(ms) > 0 {
		n, err := pc.WriteBatch(ms, 0)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.stats.sendErrors.Add(1)
			if !s.warned.Swap(true) {
				s.log.Warn("proxyDHCP: sending a reply failed (further failures are only counted)", "to", ms[0].Addr, "err", err)
			}
			n = 1
		}
		ms = ms[n:]
	}
}
