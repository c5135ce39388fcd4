package boot

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
)

// lossyProxy relays TFTP between clients and a server on loopback and drops a share
// of the datagrams in both directions. TFTP moves each transfer to fresh ports (its
// TIDs), so the proxy mirrors them: for each client it talks to the server from a
// socket of its own, and for each server transfer port it opens a socket the client
// sees as that transfer's port.
type lossyProxy struct {
	t       testing.TB
	front   *net.UDPConn
	server  netip.AddrPort
	drop    float64
	mu      sync.Mutex
	rng     *rand.Rand
	clients map[netip.AddrPort]*net.UDPConn // client → socket facing the server
	closers []*net.UDPConn
	dropped atomic.Int64
	relayed atomic.Int64
}

func newLossyProxy(t testing.TB, server netip.AddrPort, drop float64) *lossyProxy {
	t.Helper()
	front := listenLoopback(t)
	p := &lossyProxy{t: t, front: front, server: server, drop: drop, rng: rand.New(rand.NewPCG(7, 11)), clients: map[netip.AddrPort]*net.UDPConn{}}
	t.Cleanup(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.closers {
			c.Close()
		}
	})
	p.closers = append(p.closers, front)
	go p.pump(front, func(from netip.AddrPort, b []byte) {
		p.toServer(from, server, b)
	})
	return p
}

// String is the address clients send their requests to.
func (p *lossyProxy) String() string { return p.front.LocalAddr().String() }

func listenLoopback(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *lossyProxy) lose() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.relayed.Add(1)
	if p.rng.Float64() < p.drop {
		p.dropped.Add(1)
		return true
	}
	return false
}

// toServer forwards a client's datagram to dst (the server's request port or a
// transfer port) from the client's server-facing socket.
func (p *lossyProxy) toServer(client, dst netip.AddrPort, b []byte) {
	p.mu.Lock()
	up := p.clients[client]
	if up == nil {
		var err error
		if up, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			p.mu.Unlock()
			p.t.Error(err)
			return
		}
		p.clients[client] = up
		p.closers = append(p.closers, up)
		mirrors := map[netip.AddrPort]*net.UDPConn{}
		go p.pump(up, func(from netip.AddrPort, b []byte) {
			// A datagram from a server transfer port: relay it from its mirror.
			p.mu.Lock()
			m := mirrors[from]
			if m == nil {
				var err error
				if m, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
					p.mu.Unlock()
					p.t.Error(err)
					return
				}
				mirrors[from] = m
				p.closers = append(p.closers, m)
				serverTID := from
				go p.pump(m, func(c netip.AddrPort, b []byte) { p.toServer(c, serverTID, b) })
			}
			p.mu.Unlock()
			if !p.lose() {
				m.WriteToUDPAddrPort(b, client)
			}
		})
	}
	p.mu.Unlock()
	if !p.lose() {
		up.WriteToUDPAddrPort(b, dst)
	}
}

func (p *lossyProxy) pump(c *net.UDPConn, handle func(from netip.AddrPort, b []byte)) {
	buf := make([]byte, 70000)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		handle(from, append([]byte(nil), buf[:n]...))
	}
}
