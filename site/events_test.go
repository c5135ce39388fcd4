package site

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/ipxe"
	"github.com/better-compute/bcd/protocol"
)

// memSink is an eventSink that keeps what it is given, or fails.
type memSink struct {
	mu      sync.Mutex
	events  []protocol.Event
	batches int // calls of Events
	fail    error
}

func (s *memSink) Event(ev protocol.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.events = append(s.events, ev)
	return nil
}

func (s *memSink) Events(evs []protocol.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.batches++
	s.events = append(s.events, evs...)
	return nil
}

func (s *memSink) all() []protocol.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]protocol.Event(nil), s.events...)
}

func booted(t *testing.T, evs []protocol.Event) []protocol.MachineBooted {
	t.Helper()
	var out []protocol.MachineBooted
	for _, ev := range evs {
		if ev.Kind != protocol.EventMachineBooted {
			continue
		}
		var mb protocol.MachineBooted
		if err := json.Unmarshal(ev.Data, &mb); err != nil {
			t.Fatal(err)
		}
		out = append(out, mb)
	}
	return out
}

// drain journals everything queued, as run does at shutdown.
func (r *reporter) drain() {
	for {
		select {
		case mb := <-r.queue:
			r.emitQueued(mb)
		default:
			return
		}
	}
}

var (
	macA = net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	macB = net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x57}
)

// TestEventsRateLimited: a machine looping through its boot costs one event per MAC
// and stage per interval, whatever the packet rate: the first serve's event at
// once, the serves after it in the count of the event the flush sends when the
// interval is over.
func TestEventsRateLimited(t *testing.T) {
	sink := &memSink{}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	r := newReporter(sink, slog.New(slog.DiscardHandler), func() time.Time { return now }, time.Second)
	r.neighbor = nil
	for range 1000 {
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macA, Arch: 7, Time: now})
		r.Observe(boot.Event{Served: boot.ServedAck, MAC: macA, Arch: 7, Time: now})
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macB, Arch: 0, Time: now})
	}
	now = now.Add(999 * time.Millisecond)
	r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macA, Arch: 7, Time: now})
	r.flush() // nothing is due yet
	now = now.Add(time.Millisecond)
	// Past the interval, but with serves waiting: into the count of the flush's event.
	r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macA, Arch: 7, Time: now})
	r.drain()
	got := booted(t, sink.all())
	var lines []string
	for _, mb := range got {
		lines = append(lines, mb.MAC+" "+mb.Stage)
	}
	want := "52:54:00:12:34:56 dhcp,52:54:00:12:34:56 pxe,52:54:00:12:34:57 dhcp"
	if strings.Join(lines, ",") != want {
		t.Errorf("events:\n%s\nwant\n%s", strings.Join(lines, ","), want)
	}
	if n := r.limited.Load(); n != 3*1000-3+2 {
		t.Errorf("limited = %d", n)
	}
	r.flush()
	r.drain()
	var counts []string
	for _, mb := range booted(t, sink.all())[3:] {
		counts = append(counts, fmt.Sprintf("%s %s ×%d", mb.MAC, mb.Stage, mb.Count))
	}
	sort.Strings(counts)
	want = "52:54:00:12:34:56 dhcp ×1001,52:54:00:12:34:56 pxe ×999,52:54:00:12:34:57 dhcp ×999"
	if strings.Join(counts, ",") != want {
		t.Errorf("flushed:\n%s\nwant\n%s", strings.Join(counts, ","), want)
	}
}

// TestEventsJournaledInBatches: the events of a storm reach the journal in
// transactions of up to eventBatch, not one each.
func TestEventsJournaledInBatches(t *testing.T) {
	sink := &memSink{}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	r := newReporter(sink, slog.New(slog.DiscardHandler), func() time.Time { return now }, time.Second)
	r.neighbor = nil
	const machines = eventBatch + 44
	for i := range machines {
		mac := net.HardwareAddr{0x52, 0x54, 0, 0, byte(i >> 8), byte(i)}
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: mac, Time: now})
	}
	r.drain()
	if n := len(booted(t, sink.all())); n != machines || sink.batches != 2 {
		t.Errorf("%d events in %d batches, want %d in 2", n, sink.batches, machines)
	}
	if st := r.Stats(); st.Journaled != machines {
		t.Errorf("journaled = %d, want %d", st.Journaled, machines)
	}
	// A refused batch counts every serve it stood for as dropped.
	sink.fail = errors.New("disk full")
	for i := range 3 {
		r.Observe(boot.Event{Served: boot.ServedAck, MAC: net.HardwareAddr{0x52, 0x54, 0, 1, 0, byte(i)}, Time: now})
	}
	r.drain()
	if st := r.Stats(); st.Dropped != 3 || st.Journaled != machines {
		t.Errorf("after a refused batch: %+v, want 3 dropped", st)
	}
}

// TestEventsAttributeByAddress: TFTP, kernel and initrd carry no MAC; they are the
// MAC's that was last seen from the same address, else the neighbour table's, and
// are not reported otherwise.
func TestEventsAttributeByAddress(t *testing.T) {
	sink := &memSink{}
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	r := newReporter(sink, slog.New(slog.DiscardHandler), func() time.Time { return now }, time.Second)
	ip := netip.MustParseAddr("10.20.0.50")
	neighbor := netip.MustParseAddr("10.20.0.51")
	r.neighbor = func(a netip.Addr) net.HardwareAddr {
		if a == neighbor {
			return macB
		}
		return nil
	}
	r.Observe(boot.Event{Served: boot.ServedKernel, IP: ip, Arch: -1, File: "/ramdisk/vmlinuz"}) // nobody known yet
	r.Observe(boot.Event{Served: boot.ServedScript, MAC: macA, IP: ip, Arch: -1, File: "/ipxe/52:54:00:12:34:56.ipxe", Mode: boot.ModeRamdisk})
	r.Observe(boot.Event{Served: boot.ServedKernel, IP: ip, Arch: -1, File: "/ramdisk/vmlinuz"})
	r.Observe(boot.Event{Served: boot.ServedInitrd, IP: ip, Arch: -1, File: "/ramdisk/initrd"})
	now = now.Add(ipMACTTL)
	r.Observe(boot.Event{Served: boot.ServedTFTP, IP: ip, Arch: -1, File: "undionly.kpxe"})       // too late
	r.Observe(boot.Event{Served: boot.ServedTFTP, IP: neighbor, Arch: -1, File: "undionly.kpxe"}) // the kernel knows it
	r.drain()
	got := booted(t, sink.all())
	if len(got) != 4 {
		t.Fatalf("events %+v", got)
	}
	if got[3].MAC != macB.String() || got[3].Stage != protocol.StageTFTP || got[3].IP != "10.20.0.51" {
		t.Errorf("neighbour-table event %+v", got[3])
	}
	for i, stage := range []string{protocol.StageScript, protocol.StageKernel, protocol.StageInitrd} {
		if got[i].Stage != stage || got[i].MAC != macA.String() || got[i].IP != "10.20.0.50" || got[i].Arch != 0 {
			t.Errorf("event %d = %+v", i, got[i])
		}
	}
	if r.noMAC.Load() != 2 {
		t.Errorf("noMAC = %d, want 2", r.noMAC.Load())
	}
}

// TestEventsQueueBounded: when the journal falls behind, Observe neither blocks a
// boot server nor loses the serve: what does not fit the queue waits in its burst
// and a later flush journals it.
func TestEventsQueueBounded(t *testing.T) {
	sink := &memSink{}
	r := newReporter(sink, slog.New(slog.DiscardHandler), nil, time.Nanosecond)
	r.neighbor = nil
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range eventQueue + 10 {
			mac := net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}
			r.Observe(boot.Event{Served: boot.ServedOffer, MAC: mac})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Observe blocked on a full queue")
	}
	if n := len(r.queue); n != eventQueue {
		t.Errorf("queued %d, want %d", n, eventQueue)
	}
	r.drainAll()
	macs := map[string]int{}
	for _, mb := range booted(t, sink.all()) {
		macs[mb.MAC]++
	}
	if len(macs) != eventQueue+10 {
		t.Errorf("events for %d MACs, want %d", len(macs), eventQueue+10)
	}
	if st := r.Stats(); st.Dropped != 0 || st.Journaled != eventQueue+10 {
		t.Errorf("stats %+v", st)
	}
}

var testParams = ipxe.Params{
	GatewayURL:        "https://gw.example.com",
	ServerName:        "gw.example.com",
	Site:              "fsn1",
	ServingCAPin:      "sha256/" + strings.Repeat("A", 43) + "=",
	JoinSigningPin:    "sha256/" + strings.Repeat("B", 43) + "=",
	JoinEncryptionPin: "sha256/" + strings.Repeat("C", 43) + "=",
}

func testBootServers(t *testing.T, sink eventSink) *httptest.Server {
	t.Helper()
	r := newReporter(sink, slog.New(slog.DiscardHandler), nil, 0)
	var table boot.MemTable
	if err := table.Set(map[string]boot.Entry{macA.String(): {Mode: boot.ModeRamdisk}, macB.String(): {Mode: boot.ModeLocal}}); err != nil {
		t.Fatal(err)
	}
	bs := &bootServers{log: slog.New(slog.DiscardHandler), events: r, params: testParams,
		witness: newWitness(slog.New(slog.DiscardHandler), r, true, time.Now, nil)}
	bs.base.Store(&boot.HTTPServer{URL: "http://10.20.0.2:8080", Table: &table, Params: testParams,
		Kernel: "http://10.20.0.2:8080/ramdisk/vmlinuz", Initrd: "http://10.20.0.2:8080/ramdisk/initrd", Observer: r})
	srv := httptest.NewServer(bs)
	t.Cleanup(srv.Close)
	return srv
}

// TestNonceJournaledBeforeTheScript: the boot.nonce event is in the journal when the
// script that carries the nonce is returned; the sink is called on the request's
// own path, so no later event can overtake it.
func TestNonceJournaledBeforeTheScript(t *testing.T) {
	sink := &memSink{}
	srv := testBootServers(t, sink)
	resp, err := http.Get(srv.URL + "/ipxe/52:54:00:12:34:56.ipxe")
	if err != nil {
		t.Fatal(err)
	}
	var body strings.Builder
	_, _ = bufCopy(&body, resp)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body.String())
	}
	evs := sink.all()
	if len(evs) != 1 || evs[0].Kind != protocol.EventBootNonce {
		t.Fatalf("journal holds %+v, want one boot.nonce", evs)
	}
	var bn protocol.BootNonce
	if err := json.Unmarshal(evs[0].Data, &bn); err != nil {
		t.Fatal(err)
	}
	if bn.MAC != macA.String() || !strings.Contains(body.String(), "bcd.boot_nonce="+bn.Nonce+" ") {
		t.Errorf("nonce event %+v does not match the script:\n%s", bn, body.String())
	}
	if d := bn.ExpiresAt.Sub(evs[0].Time); d != protocol.BootNonceLifetime {
		t.Errorf("nonce lifetime %s", d)
	}
	if len(bn.Nonce) != 22 {
		t.Errorf("nonce %d characters, want 22 (128 bits base64url)", len(bn.Nonce))
	}
}

// TestNonceNotJournaledIs503: a nonce the control plane would never hear of never
// reaches a machine: the script is refused with 503 and Retry-After, while a local
// script, which carries no nonce, is still served.
func TestNonceNotJournaledIs503(t *testing.T) {
	sink := &memSink{fail: errors.New("journal: disk full")}
	srv := testBootServers(t, sink)
	resp, err := http.Get(srv.URL + "/ipxe/52:54:00:12:34:56.ipxe")
	if err != nil {
		t.Fatal(err)
	}
	var body strings.Builder
	_, _ = bufCopy(&body, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || strings.Contains(body.String(), "#!ipxe") {
		t.Errorf("status %d, Retry-After %q, body %q", resp.StatusCode, resp.Header.Get("Retry-After"), body.String())
	}
	resp, err = http.Get(srv.URL + "/ipxe/52:54:00:12:34:57.ipxe")
	if err != nil {
		t.Fatal(err)
	}
	body.Reset()
	_, _ = bufCopy(&body, resp)
	if resp.StatusCode != 200 || !strings.Contains(body.String(), "sanboot") {
		t.Errorf("local script: %d %q", resp.StatusCode, body.String())
	}
}

func bufCopy(b *strings.Builder, resp *http.Response) (int64, error) {
	defer resp.Body.Close()
	return io.Copy(b, resp.Body)
}

func TestParseARP(t *testing.T) {
	table := `IP address       HW type     Flags       HW address            Mask     Device
10.20.0.50       0x1         0x0         00:00:00:00:00:00     *        br0
10.20.0.51       0x1         0x2         52:54:00:12:34:57     *        br0
10.20.0.5        0x1         0x2         52:54:00:aa:bb:cc     *        br0
`
	if mac := parseARP(strings.NewReader(table), netip.MustParseAddr("10.20.0.51")); mac.String() != macB.String() {
		t.Errorf("10.20.0.51: %v", mac)
	}
	for _, ip := range []string{"10.20.0.50", "10.20.0.52", "10.20.0.1"} {
		if mac := parseARP(strings.NewReader(table), netip.MustParseAddr(ip)); mac != nil {
			t.Errorf("%s: %v, want none", ip, mac)
		}
	}
}

func FuzzParseARP(f *testing.F) {
	f.Add("IP address HW type Flags HW address Mask Device\n10.0.0.1 0x1 0x2 52:54:00:12:34:57 * br0\n")
	f.Add("\n\n10.0.0.1 0x1 0x2 zz\n")
	f.Fuzz(func(t *testing.T, s string) {
		if mac := parseARP(strings.NewReader(s), netip.MustParseAddr("10.0.0.1")); mac != nil && len(mac) != 6 {
			t.Fatalf("MAC of %d bytes", len(mac))
		}
	})
}

// TestEventsBackOffWhileServed: a MAC and stage served without pause gets longer
// and longer intervals between its events, up to maxEventInterval, every serve
// still counted; after a pause as long as that it starts again at the base one.
func TestEventsBackOffWhileServed(t *testing.T) {
	sink := &memSink{}
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	now := start
	r := newReporter(sink, slog.New(slog.DiscardHandler), func() time.Time { return now }, time.Second)
	r.neighbor = nil
	serves := 0
	for now.Before(start.Add(2 * time.Minute)) {
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macA, Arch: 7, Time: now})
		serves++
		now = now.Add(10 * time.Millisecond)
		if now.Sub(start)%(time.Second/flushSlices) == 0 {
			r.flush()
		}
		r.drain()
	}
	var at []time.Duration
	counted := 0
	for _, mb := range booted(t, sink.all()) {
		at = append(at, mb.Time.Sub(start).Round(100*time.Millisecond))
		counted += max(mb.Count, 1)
	}
	// Each event opens an interval twice the last, from 1 s up to 30 s.
	want := []time.Duration{0, 1, 3, 7, 15, 31, 61, 91}
	if len(at) != len(want) {
		t.Fatalf("events at %v, want at %v s", at, want)
	}
	for i := range want {
		if at[i] != want[i]*time.Second {
			t.Errorf("event %d at %v, want %v", i, at[i], want[i]*time.Second)
		}
	}
	now = now.Add(maxEventInterval)
	r.flush()
	r.drain()
	for _, mb := range booted(t, sink.all())[len(at):] {
		counted += max(mb.Count, 1)
	}
	if counted != serves {
		t.Errorf("the events count %d serves, want %d", counted, serves)
	}
	// After a pause as long as the longest interval since that last event: the
	// first serve at once, the next event a base interval later.
	now = now.Add(maxEventInterval)
	n := len(sink.all())
	pause := now
	for now.Before(pause.Add(1500 * time.Millisecond)) {
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: macA, Arch: 7, Time: now})
		now = now.Add(10 * time.Millisecond)
		r.flush()
		r.drain()
	}
	after := booted(t, sink.all()[n:])
	// (An event's time is its last serve's: the second's is just before +1 s.)
	if len(after) != 2 || !after[0].Time.Equal(pause) || after[1].Time.Sub(pause) < 900*time.Millisecond || after[1].Time.Sub(pause) > time.Second {
		t.Errorf("after a pause: %+v, want events at +0 and about +1 s", after)
	}
}

// TestEventsFlushSpread: a storm's bursts leave over an interval, not all at one
// tick. A thousand machines first served within the same 10 ms, then again and
// again: their intervals all end together, and run's flushes (one per
// flushEvery) send them in shares, which keeps them apart from then on.
func TestEventsFlushSpread(t *testing.T) {
	sink := &memSink{}
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	now := start
	r := newReporter(sink, slog.New(slog.DiscardHandler), func() time.Time { return now }, time.Second)
	r.neighbor = nil
	const machines = 1000
	mac := func(i int) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0, 0, byte(i >> 8), byte(i)} }
	step := 10 * time.Millisecond / machines // every machine every 10 ms
	var perFlush []int
	next := start.Add(r.flushEvery())
	for i := 0; now.Before(start.Add(10 * time.Second)); i++ { // 1,000,000 serves
		r.Observe(boot.Event{Served: boot.ServedOffer, MAC: mac(i % machines), Time: now})
		now = now.Add(step)
		if !now.Before(next) {
			before := len(sink.all())
			r.flushSlice()
			r.drain()
			perFlush = append(perFlush, len(sink.all())-before)
			next = next.Add(r.flushEvery())
		}
	}
	// The first flush carries the first serves' own events, which leave at once.
	if most := slices.Max(perFlush[1:]); most > machines/flushSlices+1 {
		t.Errorf("a flush sent %d events at once, want at most %d (events per flush: %v)", most, machines/flushSlices+1, perFlush)
	}
	r.drainAll()
	counted := 0
	for _, mb := range booted(t, sink.all()) {
		counted += max(mb.Count, 1)
	}
	if want := int(10 * time.Second / step); counted != want {
		t.Errorf("the events count %d serves, want %d", counted, want)
	}
}

// TestFullJournalRefusesTheScript: a journal full of statuses takes no boot.nonce
// (a status never gives way to an event), so the script that would carry the
// nonce is refused 503 rather than served with one the control plane may never
// hear of; the statuses stay.
func TestFullJournalRefusesTheScript(t *testing.T) {
	j, err := journal.Open(filepath.Join(t.TempDir(), journal.FileName), "n_site", journal.Options{MaxEntries: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	for range 3 {
		if _, err := j.AppendStatus(protocol.Status{CommandID: "c", State: protocol.StateSucceeded}); err != nil {
			t.Fatal(err)
		}
	}
	srv := testBootServers(t, &agent.Session{Journal: j})
	resp, err := http.Get(srv.URL + "/ipxe/" + macA.String() + ".ipxe")
	if err != nil {
		t.Fatal(err)
	}
	var body strings.Builder
	_, _ = bufCopy(&body, resp)
	if resp.StatusCode != 503 || strings.Contains(body.String(), "#!ipxe") {
		t.Errorf("status %d, body %q; want 503 and no script", resp.StatusCode, body.String())
	}
	pending, err := j.Pending()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range pending {
		if e.Type != journal.TypeStatus {
			t.Errorf("journal holds a %s (seq %d), want only the three statuses", e.Type, e.Seq)
		}
	}
	if len(pending) != 3 {
		t.Errorf("journal holds %d entries, want the 3 statuses", len(pending))
	}
}
