package site

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/protocol"
)

// journalSink journals as the session does, without a gateway to send to.
type journalSink struct{ j *journal.Journal }

func (s journalSink) Event(ev protocol.Event) error {
	_, err := s.j.AppendEvent(ev)
	return err
}

func (s journalSink) Events(evs []protocol.Event) error {
	_, err := s.j.AppendEvents(evs)
	return err
}

// BenchmarkSiteProxyDHCP drives the site's DHCP path as bcd site wires it: the
// proxyDHCP with the site's reporter as observer journaling into a real journal, a
// boot table of 1,000 machines, logging at error (bcd site's default), on loopback
// sockets, with a number of clients in flight each waiting for its answer, the
// packets bench/ sends: BIOS and UEFI DISCOVERs, and BIOS DISCOVER then the 4011
// REQUEST. Profile with -cpuprofile.
func BenchmarkSiteProxyDHCP(b *testing.B) {
	for _, kind := range []string{"bios", "uefi", "bios+4011"} {
		for _, inflight := range []int{1, 16, 64} {
			// batch=0 is what ships (recvmmsg/sendmmsg); batch=1 one datagram a
			// syscall, as before, for a before/after within one run.
			for _, batch := range []int{0, 1} {
				b.Run(fmt.Sprintf("%s/inflight=%d/batch=%d", kind, inflight, batch), func(b *testing.B) {
					benchmarkSiteDHCP(b, kind, inflight, batch)
				})
			}
		}
	}
}

// guid is option 97 for mac: type 0, then a 16-byte UUID made from it.
func guid(mac net.HardwareAddr) []byte {
	g := make([]byte, 17)
	copy(g[1:], "bcd-bench-")
	copy(g[11:], mac)
	return g
}

func benchmarkSiteDHCP(b *testing.B, kind string, inflight, batch int) {
	const machines = 1000
	j, err := journal.Open(filepath.Join(b.TempDir(), "journal.db"), "node-1", journal.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer j.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
	r := newReporter(journalSink{j}, log, nil, 0)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { r.run(ctx) })

	var table boot.MemTable
	entries := map[string]boot.Entry{}
	macs := make([]net.HardwareAddr, machines)
	for i := range macs {
		macs[i] = net.HardwareAddr{0x52, 0x54, 0, 0xbb, byte(i >> 8), byte(i)}
		entries[macs[i].String()] = boot.Entry{Mode: boot.ModeRamdisk}
	}
	if err := table.Set(entries); err != nil {
		b.Fatal(err)
	}
	cli, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	srv := &boot.ProxyDHCP{
		ServerIP: netip.MustParseAddr("127.0.0.1"), URL: "http://127.0.0.1:8080", Table: &table,
		Observer: r, Logger: log, Addr: "127.0.0.1:0", PXEAddr: "127.0.0.1:0",
		BroadcastAddr: cli.LocalAddr().(*net.UDPAddr).AddrPort(), Batch: batch,
	}
	if err := srv.Listen(); err != nil {
		b.Fatal(err)
	}
	wg.Go(func() { _ = srv.Serve(ctx) })
	dhcpAddr, pxeAddr := srv.Addrs()

	arch, class := []byte{0, 0}, "PXEClient:Arch:00000:UNDI:002001"
	if kind == "uefi" {
		arch, class = []byte{0, 7}, "PXEClient:Arch:00007:UNDI:003000"
	}
	packet := func(mac net.HardwareAddr, mt dhcpv4.MessageType) []byte {
		mods := []dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(mt),
			dhcpv4.WithGeneric(dhcpv4.OptionClassIdentifier, []byte(class)),
			dhcpv4.WithGeneric(dhcpv4.OptionClientSystemArchitectureType, arch),
			dhcpv4.WithGeneric(dhcpv4.OptionClientNetworkInterfaceIdentifier, []byte{1, 2, 1}),
			// Type 0 and a 16-byte UUID, as a ROM sends it: any other length is
			// malformed, and dropped (this was 5 bytes once, and every packet went
			// unanswered).
			dhcpv4.WithGeneric(dhcpv4.OptionClientMachineIdentifier, guid(mac)),
		}
		if mt == dhcpv4.MessageTypeRequest {
			mods = append(mods, dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)),
				dhcpv4.WithGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{71, 4, 0x80, 0, 0, 0, 255}))
		}
		p, err := dhcpv4.New(mods...)
		if err != nil {
			b.Fatal(err)
		}
		return p.ToBytes()
	}
	discovers := make([][]byte, machines)
	requests := make([][]byte, machines)
	for i, mac := range macs {
		discovers[i] = packet(mac, dhcpv4.MessageTypeDiscover)
		requests[i] = packet(mac, dhcpv4.MessageTypeRequest)
	}

	wake := make([]chan uint32, inflight)
	for i := range wake {
		wake[i] = make(chan uint32, 4)
	}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := cli.ReadFromUDPAddrPort(buf)
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
	// exchange sends pkt to dst and waits for the answer, sending again after
	// 250 ms as bench/'s client does; it reports the retries.
	exchange := func(pkt []byte, dst netip.AddrPort, xid uint32, timer *time.Timer) (retries int64) {
		binary.BigEndian.PutUint32(pkt[4:8], xid)
		slot := xid & 0xffff
		for {
			if _, err := cli.WriteToUDPAddrPort(pkt, dst); err != nil {
				b.Error(err)
				return
			}
			timer.Reset(250 * time.Millisecond)
			for {
				select {
				case x := <-wake[slot]:
					if x != xid {
						continue
					}
					return retries
				case <-timer.C:
				}
				break
			}
			if retries++; retries == 20 {
				// Not a figure but a failure: say so rather than run for ever.
				b.Errorf("no answer from %s to xid %#x after 20 tries of 250 ms; server %+v", dst, xid, srv.Stats())
				return retries
			}
		}
	}
	var left, lost atomic.Int64
	left.Store(int64(b.N))
	var cwg sync.WaitGroup
	// Each client's latencies, the whole exchange (both rounds for bios+4011, as
	// bench/ counts it), merged for the p99 at the end.
	lat := make([][]time.Duration, inflight)
	b.ResetTimer()
	start := time.Now()
	for slot := range inflight {
		cwg.Go(func() {
			timer := time.NewTimer(time.Hour)
			d := make([]byte, 0, 1500)
			mine := make([]time.Duration, 0, b.N/inflight+1)
			for seq := uint32(1); left.Add(-1) >= 0; seq++ {
				m := (int(seq)*inflight + slot) % machines
				t0 := time.Now()
				d = append(d[:0], discovers[m]...)
				lost.Add(exchange(d, dhcpAddr, seq<<16|uint32(slot), timer))
				if kind == "bios+4011" {
					d = append(d[:0], requests[m]...)
					lost.Add(exchange(d, pxeAddr, (seq|0x8000)<<16|uint32(slot), timer))
				}
				mine = append(mine, time.Since(t0))
			}
			lat[slot] = mine
		})
	}
	cwg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) > 0 {
		b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "exchanges/s")
	b.ReportMetric(float64(lost.Load()), "retries")
	st := r.Stats()
	b.ReportMetric(float64(st.Journaled), "events")
}
