package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// dhcpRetry is how long a client waits for an answer before asking again. It is
// short next to firmware's 4 s so that a lost packet shows in p99 without
// stalling the slot for the rest of the window.
const dhcpRetry = 250 * time.Millisecond

// dhcpLoad keeps l.Inflight PXE clients busy, each waiting for its answer before
// asking again, as machines powered on together do. Every request comes from
// another MAC of the boot table and carries its own transaction ID. DISCOVERs
// are broadcast to 255.255.255.255:67 from port 68 on l.Iface; answers are read
// wherever they come to port 68 (the servers broadcast offers, as firmware needs).
func dhcpLoad(ctx context.Context, l load) (result, error) {
	if l.Inflight < 1 || l.Inflight > 256 || l.MACs < 1 {
		return result{}, fmt.Errorf("dhcp load: inflight %d and macs %d", l.Inflight, l.MACs)
	}
	server, err := netip.ParseAddr(l.Server)
	if err != nil {
		return result{}, fmt.Errorf("dhcp load: server: %w", err)
	}
	clientIP, err := netip.ParseAddr(l.ClientIP)
	if err != nil {
		return result{}, fmt.Errorf("dhcp load: client address: %w", err)
	}
	conn, err := listenPort68(l.Iface)
	if err != nil {
		return result{}, err
	}
	defer conn.Close()

	// Answers are handed to the slot that asked: the low byte of the transaction
	// ID is the slot, the rest a sequence number, so a late answer to an earlier
	// try is recognised and dropped.
	slots := make([]chan pxeReply, l.Inflight)
	for i := range slots {
		slots[i] = make(chan pxeReply, 8)
	}
	var unusable atomic.Int64
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			buf := make([]byte, 2048)
			for {
				n, _, err := conn.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				r, ok := parsePXEReply(buf[:n])
				if !ok {
					continue
				}
				if !r.usable {
					unusable.Add(1)
				}
				if s := int(r.xid & 0xff); s < len(slots) {
					select {
					case slots[s] <- r:
					default:
					}
				}
			}
		})
	}

	var w window
	var ops, retries atomic.Int64
	lat := make([][]time.Duration, l.Inflight)
	bcast := netip.MustParseAddrPort("255.255.255.255:67")
	pxe := netip.AddrPortFrom(server, 4011)
	var workers sync.WaitGroup
	for slot := range l.Inflight {
		workers.Go(func() {
			pkt := make([]byte, 0, 512)
			timer := time.NewTimer(time.Hour)
			seq := uint32(0)
			// ask sends one request until its answer comes, and returns it.
			ask := func(msg byte, mac [6]byte, dst netip.AddrPort, item [4]byte, want byte) (pxeReply, bool) {
				for !w.stopped.Load() {
					seq++
					xid := seq<<8 | uint32(slot)
					pkt = appendPXE(pkt[:0], msg, xid, mac, clientIPFor(msg, clientIP), item, l.Firmware)
					if _, err := conn.WriteToUDPAddrPort(pkt, dst); err != nil {
						// A full socket buffer: try again as a timeout would.
						time.Sleep(time.Millisecond)
						retries.Add(1)
						continue
					}
					timer.Reset(dhcpRetry)
				wait:
					for {
						select {
						case r := <-slots[slot]:
							if r.xid == xid && r.msg == want {
								timer.Stop()
								return r, true
							}
						case <-timer.C:
							break wait
						}
					}
					retries.Add(1)
				}
				return pxeReply{}, false
			}
			for i := slot; !w.stopped.Load(); i += l.Inflight {
				mac := benchMAC(i % l.MACs)
				start := time.Now()
				offer, ok := ask(msgDiscover, mac, bcast, [4]byte{}, msgOffer)
				if !ok {
					return
				}
				if l.Exchange {
					if _, ok := ask(msgRequest, mac, pxe, offer.item, msgAck); !ok {
						return
					}
				}
				if w.open.Load() {
					lat[slot] = append(lat[slot], time.Since(start))
				}
				ops.Add(1)
			}
		})
	}
	secs, before, after, err := w.measure(ctx, l, ops.Load)
	workers.Wait()
	conn.Close()
	readers.Wait()
	if err != nil {
		return result{}, err
	}
	all := sortedDurations(lat)
	return result{
		Seconds:  secs,
		Ops:      after - before,
		P50:      percentile(all, 50),
		P99:      percentile(all, 99),
		Retries:  retries.Load(),
		Unusable: unusable.Load(),
		AllOps:   ops.Load(),
	}, nil
}

// clientIPFor is ciaddr: none in a DISCOVER (firmware has no address yet), the
// address the network's DHCP server gave in the 4011 request.
func clientIPFor(msg byte, ip netip.Addr) netip.Addr {
	if msg == msgDiscover {
		return netip.Addr{}
	}
	return ip
}

// listenPort68 opens the PXE client's socket: 0.0.0.0:68 on iface, allowed to
// broadcast, with room to queue a burst of answers.
func listenPort68(iface string) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			for _, o := range []struct {
				opt, val int
				name     string
			}{
				{syscall.SO_BROADCAST, 1, "SO_BROADCAST"},
				{syscall.SO_REUSEADDR, 1, "SO_REUSEADDR"},
				{syscall.SO_RCVBUF, 4 << 20, "SO_RCVBUF"},
				{syscall.SO_SNDBUF, 4 << 20, "SO_SNDBUF"},
			} {
				if e := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, o.opt, o.val); e != nil {
					serr = errors.Join(serr, fmt.Errorf("%s: %w", o.name, e))
				}
			}
			if e := syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, iface); e != nil {
				serr = errors.Join(serr, fmt.Errorf("SO_BINDTODEVICE %s: %w", iface, e))
			}
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:68")
	if err != nil {
		return nil, fmt.Errorf("dhcp load: port 68 on %s: %w", iface, err)
	}
	return pc.(*net.UDPConn), nil
}
