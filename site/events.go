package site

import (
	"container/heap"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of the event reporter.
const (
	// DefaultEventInterval is the shortest time between two machine.bootedEvent events
	// for the same MAC and stage: a machine stuck in a boot loop costs the journal
	// one entry per stage per interval, not one per packet.
	DefaultEventInterval = time.Second
	// maxEventInterval bounds the backoff of a MAC and stage served without pause:
	// each event that reports serves coalesced behind an earlier one doubles the
	// interval before the next, up to this; a MAC and stage not served for this
	// long starts again at the base interval. A machine that loops through its
	// boot all day costs two events a minute per stage, not 3,600 an hour.
	maxEventInterval = 30 * time.Second
	// flushSlices is how many flushes run per base interval. Each burst's count is
	// flushed when its own interval ends, not at one tick for all: a storm's
	// events then leave in a steady stream rather than in one batch a second that
	// takes the control plane's core (and the site's) all at once.
	flushSlices = 8
	// flushChunk bounds the bursts one hold of the lock flushes, so the boot
	// servers' Observe never waits behind a long flush.
	flushChunk = 64
	// eventQueue bounds the events waiting for the journal; beyond it an event's
	// count waits in its burst for a later flush, because the boot servers must
	// never wait.
	eventQueue = 1024
	// eventBatch bounds the events journaled in one transaction.
	eventBatch = 256
	// ipMACTTL is how long a client address stays attributed to the MAC last seen
	// with it, for the stages whose protocol carries no MAC (TFTP, kernel, initrd).
	ipMACTTL = 15 * time.Minute
	// maxTracked bounds the rate limiter's and the address map's entries; a sweep
	// of expired ones runs when either reaches it.
	maxTracked = 16384
)

// eventSink journals events for the gateway; *agent.Session is one. Events stores a
// batch in one write to disk.
type eventSink interface {
	Event(protocol.Event) error
	Events([]protocol.Event) error
}

// EventStats counts what the event reporter did with what the boot servers served.
type EventStats struct {
	Journaled uint64 // machine.bootedEvent events handed to the journal
	Coalesced uint64 // serves folded into another event's Count instead of an event of their own
	Dropped   uint64 // serves whose event was lost: the journal refused it, or the tracking table overflowed
	NoMAC     uint64 // serves to an address no MAC is known for: no event
}

// reporter turns what the boot servers report into machine.bootedEvent events and mints
// boot nonces. Observe never blocks and allocates nothing on its usual path: within
// interval of the last event for a MAC and stage it only counts, and the next event
// for that MAC and stage says in Count how many serves it stands for (run flushes a
// burst's count once its interval is over, so none is lost when the storm stops).
type reporter struct {
	sink     eventSink
	log      *slog.Logger
	now      func() time.Time
	interval time.Duration
	// neighbor finds the MAC of an address on the boot network, or nil.
	neighbor func(netip.Addr) net.HardwareAddr

	queue     chan bootedEvent
	journaled atomic.Uint64
	limited   atomic.Uint64 // coalesced: within the interval of an earlier event
	dropped   atomic.Uint64
	noMAC     atomic.Uint64 // no MAC known for the client address

	mu   sync.Mutex
	last map[burstKey]*burst
	due  dueHeap // when each burst's interval ends, soonest first
	ips  map[netip.Addr]ipMAC
}

// burstKey is a MAC and stage, or an address and stage while the MAC is unknown.
type burstKey struct {
	mac   [6]byte
	ip    netip.Addr // only without a MAC
	stage uint8
}

// burst is the state of one MAC and stage.
type burst struct {
	sent    time.Time     // the last event's
	every   time.Duration // the interval after it: the base one, or more while the serves keep coming
	pending int           // serves since it, not yet reported
	latest  bootedEvent   // the last of them
}

// dueBurst is a burst whose interval ends at at; sent tells a stale entry (the
// burst sent again since, or was forgotten) from the current one.
type dueBurst struct {
	at   time.Time
	sent time.Time
	key  burstKey
}

// dueHeap is a min-heap of dueBurst by at (container/heap).
type dueHeap []dueBurst

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueBurst)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// bootedEvent is a machine.bootedEvent event before its text is made, off the servers' path.
type bootedEvent struct {
	key   burstKey
	ip    netip.Addr
	arch  int
	guid  string
	file  string
	time  time.Time
	count int
}

type ipMAC struct {
	mac  [6]byte
	seen time.Time
}

func newReporter(sink eventSink, log *slog.Logger, now func() time.Time, interval time.Duration) *reporter {
	if now == nil {
		now = time.Now
	}
	if interval <= 0 {
		interval = DefaultEventInterval
	}
	return &reporter{sink: sink, log: log, now: now, interval: interval, neighbor: neighborMAC,
		queue: make(chan bootedEvent, eventQueue),
		last:  map[burstKey]*burst{}, ips: map[netip.Addr]ipMAC{}}
}

// runningServers are what the Stats methods of a running Site read.
type runningServers struct {
	events *reporter
	dhcp   *boot.ProxyDHCP  // nil without proxy_dhcp
	tftp   *boot.TFTPServer // nil without [boot] tftp
	boot   *bootServers     // nil without [boot]
}

// EventStats returns the counters of the site's machine.booted reporting; zero
// before Run has started it.
func (s *Site) EventStats() EventStats {
	if r := s.running.Load(); r != nil {
		return r.events.Stats()
	}
	return EventStats{}
}

// DHCPStats returns the proxyDHCP's counters, and false when it is not running.
func (s *Site) DHCPStats() (boot.DHCPStats, bool) {
	if r := s.running.Load(); r != nil && r.dhcp != nil {
		return r.dhcp.Stats(), true
	}
	return boot.DHCPStats{}, false
}

// Stats returns the reporter's counters so far.
func (r *reporter) Stats() EventStats {
	return EventStats{Journaled: r.journaled.Load(), Coalesced: r.limited.Load(), Dropped: r.dropped.Load(), NoMAC: r.noMAC.Load()}
}

// stageNames are the stages of machine.bootedEvent, by the index stageOf gives.
var stageNames = [...]string{"", protocol.StageDHCP, protocol.StagePXE, protocol.StageTFTP, protocol.StageScript, protocol.StageKernel, protocol.StageInitrd}

// stageOf maps what a boot server served to the stage of a machine.bootedEvent event;
// 0 is none.
func stageOf(served string) uint8 {
	switch served {
	case boot.ServedOffer:
		return 1
	case boot.ServedAck:
		return 2
	case boot.ServedTFTP, boot.ServedBinary: // the same iPXE binary, over UEFI HTTP boot
		return 3
	case boot.ServedScript:
		return 4
	case boot.ServedKernel:
		return 5
	case boot.ServedInitrd:
		return 6
	}
	return 0
}

// Observe is the boot servers' boot.Observer.
func (r *reporter) Observe(ev boot.Event) {
	stage := stageOf(ev.Served)
	if stage == 0 {
		return
	}
	now := r.now()
	b := bootedEvent{ip: ev.IP, arch: ev.Arch, guid: ev.GUID, file: ev.File, time: ev.Time, count: 1}
	if b.time.IsZero() {
		b.time = now
	}
	b.key.stage = stage
	hasMAC := len(ev.MAC) == 6
	if hasMAC {
		b.key.mac = [6]byte(ev.MAC)
	}
	r.mu.Lock()
	switch {
	case hasMAC && ev.IP.IsValid():
		r.ips[ev.IP] = ipMAC{mac: b.key.mac, seen: now}
	case !hasMAC && ev.IP.IsValid():
		if m, ok := r.ips[ev.IP]; ok && now.Sub(m.seen) < ipMACTTL {
			b.key.mac, hasMAC = m.mac, true
		} else {
			// run asks the neighbour table, off the server's path.
			b.key.ip = ev.IP
		}
	case !hasMAC:
		r.mu.Unlock()
		r.noMAC.Add(1)
		return
	}
	st := r.last[b.key]
	// Within the interval, or after it while serves wait for their flush: the
	// flush reports them, in its turn (flushSlice), so that a storm's bursts
	// whose intervals end together do not all leave in the same instant.
	if st != nil && (now.Sub(st.sent) < st.every || st.pending > 0) {
		st.pending++
		st.latest = b
		r.mu.Unlock()
		r.limited.Add(1)
		return
	}
	if st == nil {
		if len(r.last) >= maxTracked || len(r.ips) >= maxTracked {
			r.sweepLocked(now)
		}
		st = &burst{every: r.interval}
		r.last[b.key] = st
	}
	// After a pause as long as the longest interval the MAC and stage start again
	// at the base one.
	if now.Sub(st.sent) >= maxEventInterval {
		st.every = r.interval
	}
	st.sent = now
	r.sendLocked(st, b)
	r.mu.Unlock()
}

// sendLocked queues b, the event that opens st's interval, and notes when that
// interval ends. With the queue full it folds b back into its burst for a later
// flush: the servers never wait, and the count is kept.
func (r *reporter) sendLocked(st *burst, b bootedEvent) {
	select {
	case r.queue <- b:
		heap.Push(&r.due, dueBurst{at: st.sent.Add(st.every), sent: st.sent, key: b.key})
	default:
		st.pending += b.count
		st.latest = b
		// Due now: the next flush tries again.
		heap.Push(&r.due, dueBurst{at: st.sent, sent: st.sent, key: b.key})
	}
}

// flush queues an event for every burst whose interval is over and whose serves
// no event reported yet, a chunk of bursts per hold of the lock; it stops when the
// queue is full (the rest waits for the next flush).
func (r *reporter) flush() { r.flushUpTo(-1) }

// flushSlice is run's flush, once per slice of the interval. It flushes at most an
// even share of the bursts tracked, so that the bursts of a storm whose intervals
// all end together (a thousand machines first served within the same few
// milliseconds) leave over one interval, and from then on each burst's next
// interval ends in its own slice.
func (r *reporter) flushSlice() {
	r.mu.Lock()
	share := max(flushChunk, (len(r.last)+flushSlices-1)/flushSlices)
	r.mu.Unlock()
	r.flushUpTo(share)
}

// flushUpTo flushes up to limit due bursts, all of them when limit is negative.
func (r *reporter) flushUpTo(limit int) {
	now := r.now()
	for limit != 0 {
		chunk := flushChunk
		if limit > 0 {
			chunk = min(chunk, limit)
		}
		n, more := r.flushChunk(now, chunk)
		if limit > 0 {
			limit -= n
		}
		if !more {
			return
		}
	}
}

// flushChunk flushes up to chunk bursts that are due at now: how many, and true
// when more may be due.
func (r *reporter) flushChunk(now time.Time, chunk int) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sent := 0
	for sent < chunk {
		if len(r.due) == 0 || r.due[0].at.After(now) {
			return sent, false
		}
		d := heap.Pop(&r.due).(dueBurst)
		st := r.last[d.key]
		if st == nil || !st.sent.Equal(d.sent) || st.pending == 0 {
			continue // stale, or nothing came within the interval
		}
		b := st.latest
		b.count = st.pending
		st.every = min(2*st.every, max(r.interval, maxEventInterval))
		st.sent, st.pending = now, 0
		r.sendLocked(st, b)
		if st.pending != 0 {
			return sent, false // the queue is full
		}
		sent++
	}
	return sent, true
}

// sweepLocked forgets bursts past their interval that have nothing to report and
// addresses past their TTL; if that frees nothing, it forgets everything rather than
// grow, counting the serves not yet reported as dropped.
func (r *reporter) sweepLocked(now time.Time) {
	for k, st := range r.last {
		if st.pending == 0 && now.Sub(st.sent) >= st.every {
			delete(r.last, k)
		}
	}
	for ip, m := range r.ips {
		if now.Sub(m.seen) >= ipMACTTL {
			delete(r.ips, ip)
		}
	}
	if len(r.last) >= maxTracked {
		var lost uint64
		for _, st := range r.last {
			lost += uint64(st.pending)
		}
		r.dropped.Add(lost)
		clear(r.last)
	}
	// Entries of forgotten bursts are stale; drop them rather than keep a heap
	// larger than the table.
	if len(r.due) > 2*len(r.last)+flushChunk {
		kept := r.due[:0]
		for _, d := range r.due {
			if st := r.last[d.key]; st != nil && st.sent.Equal(d.sent) {
				kept = append(kept, d)
			}
		}
		r.due = kept
		heap.Init(&r.due)
	}
	if len(r.ips) >= maxTracked {
		clear(r.ips)
	}
}

// flushEvery is how often run flushes: a slice of the interval.
func (r *reporter) flushEvery() time.Duration {
	return max(r.interval/flushSlices, time.Millisecond)
}

// run journals queued events until ctx is done, flushing the counts of bursts as
// their intervals end, then flushes and journals what is still waiting.
func (r *reporter) run(ctx context.Context) {
	tick := time.NewTicker(r.flushEvery())
	defer tick.Stop()
	for {
		select {
		case b := <-r.queue:
			r.emitQueued(b)
		case <-tick.C:
			r.flushSlice()
		case <-ctx.Done():
			r.drainAll()
			return
		}
	}
}

// drainAll journals everything queued and every burst's waiting count.
func (r *reporter) drainAll() {
	for {
		r.mu.Lock()
		for i := range r.due {
			r.due[i].at = time.Time{} // every burst's interval is over
		}
		r.mu.Unlock()
		r.flush()
		select {
		case b := <-r.queue:
			r.emitQueued(b)
		default:
			return
		}
	}
}

// emitQueued journals b and whatever else is queued behind it, up to eventBatch,
// in one transaction.
func (r *reporter) emitQueued(b bootedEvent) {
	batch := make([]bootedEvent, 0, 16)
	batch = append(batch, b)
	for len(batch) < eventBatch {
		select {
		case b := <-r.queue:
			batch = append(batch, b)
			continue
		default:
		}
		break
	}
	r.emit(batch...)
}

// emit journals the machine.bootedEvent events of bs in one transaction.
func (r *reporter) emit(bs ...bootedEvent) {
	evs := make([]protocol.Event, 0, len(bs))
	count := 0
	for _, b := range bs {
		if ev, ok := r.event(b); ok {
			evs = append(evs, ev)
			count += b.count
		}
	}
	if len(evs) == 0 {
		return
	}
	if err := r.sink.Events(evs); err != nil {
		r.dropped.Add(uint64(count))
		r.log.Error("boot: cannot journal machine.bootedEvent events", "events", len(evs), "first", evs[0].Message, "error", err.Error())
		return
	}
	r.journaled.Add(uint64(len(evs)))
}

// event makes b's machine.bootedEvent event; false when there is none to send (no
// MAC is known for the address).
func (r *reporter) event(b bootedEvent) (protocol.Event, bool) {
	mb := protocol.MachineBooted{
		Stage:      stageNames[b.key.stage],
		ClientGUID: b.guid,
		File:       b.file,
		Time:       b.time.UTC(),
	}
	if b.count > 1 {
		mb.Count = b.count
	}
	if b.arch > 0 {
		mb.Arch = b.arch
	}
	if b.ip.IsValid() {
		mb.IP = b.ip.String()
	}
	if b.key.ip.IsValid() {
		var mac net.HardwareAddr
		if r.neighbor != nil {
			mac = r.neighbor(b.key.ip)
		}
		if len(mac) != 6 {
			r.noMAC.Add(uint64(b.count))
			r.log.Debug("boot: served a client whose MAC is not known; no event", "stage", mb.Stage, "ip", mb.IP, "file", mb.File)
			return protocol.Event{}, false
		}
		mb.MAC = mac.String()
		r.mu.Lock()
		r.ips[b.key.ip] = ipMAC{mac: [6]byte(mac), seen: r.now()}
		r.mu.Unlock()
	} else {
		mb.MAC = net.HardwareAddr(b.key.mac[:]).String()
	}
	data, err := json.Marshal(mb)
	if err != nil {
		return protocol.Event{}, false
	}
	msg := mb.Stage + " " + mb.MAC
	if mb.Count > 1 {
		msg += " ×" + strconv.Itoa(mb.Count)
	}
	return protocol.Event{
		Kind:    protocol.EventMachineBooted,
		Time:    mb.Time,
		Level:   "info",
		Message: msg,
		Data:    data,
	}, true
}

// errNonceNotJournaled makes the boot HTTP server answer 503: a nonce the control
// plane may never hear of must not reach a machine.
type errNonceNotJournaled struct{ err error }

func (e *errNonceNotJournaled) Error() string {
	return "the boot nonce could not be journaled for the control plane: " + e.err.Error()
}
func (e *errNonceNotJournaled) Unwrap() error { return e.err }

// MintNonce journals the boot.nonce event of nonce, minted for mac seen at ip
// on iface (sending it when the session is up), before it returns, so
// the control plane hears of every nonce before the script that carries it
// leaves. The nonce itself is never logged.
func (r *reporter) MintNonce(mac net.HardwareAddr, ip netip.Addr, iface, nonce string) error {
	now := r.now().UTC()
	bn := protocol.BootNonce{MAC: mac.String(), Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime), Interface: iface}
	if ip.IsValid() {
		bn.IP = ip.String()
	}
	data, err := json.Marshal(bn)
	if err != nil {
		return err
	}
	if err := r.sink.Event(protocol.Event{Kind: protocol.EventBootNonce, Time: now, Level: "info",
		Message: "boot nonce for " + bn.MAC, Data: data}); err != nil {
		r.log.Error("boot: cannot journal a boot nonce; refusing the ramdisk script", "mac", bn.MAC, "error", err.Error())
		return &errNonceNotJournaled{err}
	}
	return nil
}
