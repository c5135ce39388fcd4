package site

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of the event reporter.
const (
	// DefaultEventInterval is the shortest time between two machine.booted events
	// for the same MAC and stage: a machine stuck in a boot loop costs the journal
	// one entry per stage per interval, not one per packet.
	DefaultEventInterval = time.Second
	// eventQueue bounds the events waiting for the journal; beyond it they are
	// dropped and counted, because the boot servers must never wait.
	eventQueue = 1024
	// ipMACTTL is how long a client address stays attributed to the MAC last seen
	// with it, for the stages whose protocol carries no MAC (TFTP, kernel, initrd).
	ipMACTTL = 15 * time.Minute
	// maxTracked bounds the rate limiter's and the address map's entries; a sweep
	// of expired ones runs when either reaches it.
	maxTracked = 16384
)

// eventSink journals an event for the gateway; *agent.Session is one.
type eventSink interface {
	Event(protocol.Event) error
}

// reporter turns what the boot servers report into machine.booted events and mints
// boot nonces. Observe never blocks: it rate-limits, queues, and run journals.
type reporter struct {
	sink     eventSink
	log      *slog.Logger
	now      func() time.Time
	interval time.Duration
	// neighbor finds the MAC of an address on the boot network, or nil.
	neighbor func(netip.Addr) net.HardwareAddr

	queue   chan protocol.MachineBooted
	dropped atomic.Uint64 // queue full
	limited atomic.Uint64 // within the interval of an earlier event
	noMAC   atomic.Uint64 // no MAC known for the client address

	mu   sync.Mutex
	last map[string]time.Time // MAC+stage → last event
	ips  map[netip.Addr]ipMAC
}

type ipMAC struct {
	mac  net.HardwareAddr
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
		queue: make(chan protocol.MachineBooted, eventQueue),
		last:  map[string]time.Time{}, ips: map[netip.Addr]ipMAC{}}
}

// stages maps what a boot server served to the stage of a machine.booted event.
var stages = map[string]string{
	boot.ServedOffer:  protocol.StageDHCP,
	boot.ServedAck:    protocol.StagePXE,
	boot.ServedTFTP:   protocol.StageTFTP,
	boot.ServedBinary: protocol.StageTFTP, // the same iPXE binary, over UEFI HTTP boot
	boot.ServedScript: protocol.StageScript,
	boot.ServedKernel: protocol.StageKernel,
	boot.ServedInitrd: protocol.StageInitrd,
}

// Observe is the boot servers' boot.Observer.
func (r *reporter) Observe(ev boot.Event) {
	stage, ok := stages[ev.Served]
	if !ok {
		return
	}
	now := r.now()
	mac := ev.MAC
	r.mu.Lock()
	if len(mac) == 6 && ev.IP.IsValid() {
		r.ips[ev.IP] = ipMAC{mac: mac, seen: now}
	} else if len(mac) == 0 && ev.IP.IsValid() {
		if m, ok := r.ips[ev.IP]; ok && now.Sub(m.seen) < ipMACTTL {
			mac = m.mac
		}
	}
	var key string
	switch {
	case len(mac) == 6:
		key = mac.String() + " " + stage
	case ev.IP.IsValid():
		// run asks the neighbour table, off the server's path.
		key = ev.IP.String() + " " + stage
	default:
		r.mu.Unlock()
		r.noMAC.Add(1)
		return
	}
	if t, ok := r.last[key]; ok && now.Sub(t) < r.interval {
		r.mu.Unlock()
		r.limited.Add(1)
		return
	}
	r.last[key] = now
	if len(r.last) >= maxTracked || len(r.ips) >= maxTracked {
		r.sweepLocked(now)
	}
	r.mu.Unlock()

	mb := protocol.MachineBooted{
		Stage:      stage,
		ClientGUID: ev.GUID,
		File:       ev.File,
		Time:       ev.Time.UTC(),
	}
	if len(mac) == 6 {
		mb.MAC = mac.String()
	}
	if ev.Arch > 0 {
		mb.Arch = ev.Arch
	}
	if ev.IP.IsValid() {
		mb.IP = ev.IP.String()
	}
	if mb.Time.IsZero() {
		mb.Time = now.UTC()
	}
	select {
	case r.queue <- mb:
	default:
		if r.dropped.Add(1) == 1 {
			r.log.Warn("boot: the event queue is full; dropping machine.booted events (counted from now on)")
		}
	}
}

// sweepLocked forgets rate-limit entries past their interval and addresses past
// their TTL; if that frees nothing, it forgets everything rather than grow.
func (r *reporter) sweepLocked(now time.Time) {
	for k, t := range r.last {
		if now.Sub(t) >= r.interval {
			delete(r.last, k)
		}
	}
	for ip, m := range r.ips {
		if now.Sub(m.seen) >= ipMACTTL {
			delete(r.ips, ip)
		}
	}
	if len(r.last) >= maxTracked {
		clear(r.last)
	}
	if len(r.ips) >= maxTracked {
		clear(r.ips)
	}
}

// run journals queued events until ctx is done, then journals what is still queued.
func (r *reporter) run(ctx context.Context) {
	for {
		select {
		case mb := <-r.queue:
			r.emit(mb)
		case <-ctx.Done():
			for {
				select {
				case mb := <-r.queue:
					r.emit(mb)
				default:
					return
				}
			}
		}
	}
}

func (r *reporter) emit(mb protocol.MachineBooted) {
	if mb.MAC == "" {
		ip, err := netip.ParseAddr(mb.IP)
		var mac net.HardwareAddr
		if err == nil && r.neighbor != nil {
			mac = r.neighbor(ip)
		}
		if len(mac) != 6 {
			r.noMAC.Add(1)
			r.log.Debug("boot: served a client whose MAC is not known; no event", "stage", mb.Stage, "ip", mb.IP, "file", mb.File)
			return
		}
		mb.MAC = mac.String()
		r.mu.Lock()
		r.ips[ip] = ipMAC{mac: mac, seen: r.now()}
		r.mu.Unlock()
	}
	data, err := json.Marshal(mb)
	if err != nil {
		return
	}
	err = r.sink.Event(protocol.Event{
		Kind:    protocol.EventMachineBooted,
		Time:    mb.Time,
		Level:   "info",
		Message: mb.Stage + " " + mb.MAC,
		Data:    data,
	})
	if err != nil {
		r.log.Error("boot: cannot journal a machine.booted event", "mac", mb.MAC, "stage", mb.Stage, "error", err.Error())
	}
}

// errNonceNotJournaled makes the boot HTTP server answer 503: a nonce the control
// plane may never hear of must not reach a machine.
type errNonceNotJournaled struct{ err error }

func (e *errNonceNotJournaled) Error() string {
	return "the boot nonce could not be journaled for the control plane: " + e.err.Error()
}
func (e *errNonceNotJournaled) Unwrap() error { return e.err }

// MintNonce mints a nonce for mac and journals its boot.nonce event (sending it
// when the session is up) before returning it, so the control plane hears of every
// nonce before the script that carries it leaves. The nonce itself is never logged.
func (r *reporter) MintNonce(mac net.HardwareAddr) (string, error) {
	nonce, err := protocol.NewBootNonce()
	if err != nil {
		return "", err
	}
	now := r.now().UTC()
	bn := protocol.BootNonce{MAC: mac.String(), Nonce: nonce, ExpiresAt: now.Add(protocol.BootNonceLifetime)}
	data, err := json.Marshal(bn)
	if err != nil {
		return "", err
	}
	if err := r.sink.Event(protocol.Event{Kind: protocol.EventBootNonce, Time: now, Level: "info",
		Message: "boot nonce for " + bn.MAC, Data: data}); err != nil {
		r.log.Error("boot: cannot journal a boot nonce; refusing the ramdisk script", "mac", bn.MAC, "error", err.Error())
		return "", &errNonceNotJournaled{err}
	}
	return nonce, nil
}
