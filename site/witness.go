package site

import (
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/internal/lograte"
	"github.com/better-compute/bcd/protocol"
)

// PXE authenticates nobody: whoever can reach the boot server can ask for any
// MAC's script. The site agent is the one party that sees the provisioning
// network, so it is the witness. It hands a nonce only to a client whose source
// address the neighbour table maps to the MAC of the script, on the interface
// the request came in on, and it countersigns the ramdisk's join (POST
// protocol.WitnessPath) only for the caller that has that MAC now: the discovery
// attestor refuses a join without the minting site's signature. What it cannot
// stop is a client that also takes over the MAC on the wire (the neighbour
// table then says what the spoofer says); a TPM enrolled for the machine binds
// the ramdisk beyond that (see the README).

// Rates of nonce minting: a burst of nonceBurst per MAC and per client address,
// then one every nonceRefill. A machine fetches its script once a boot (iPXE
// retries a failed fetch a few times); more is someone asking for nonces.
const (
	nonceBurst  = 6
	nonceRefill = 10 * time.Second
	// refusedEventEvery bounds boot.refused events per MAC: the first refusal
	// goes to the machine's timeline, the rest within this interval are counted
	// into the next.
	refusedEventEvery = time.Minute
	// witnessTableMax bounds each table of the witness (nonces, rates,
	// refusal events); full, the oldest half is forgotten.
	witnessTableMax = 8192
	maxWitnessBody  = 4 << 10
)

// WitnessStats counts what the witness refused and signed.
type WitnessStats struct {
	Refused     uint64 // scripts and witnesses refused: the neighbour table disagrees, or none
	RateLimited uint64 // scripts refused for asking too often
	Witnessed   uint64 // joins countersigned
}

// witness mints boot nonces for the L2 evidence and countersigns joins.
type witness struct {
	log    *slog.Logger
	events *reporter
	// lookup is the neighbour table: MAC and interface of an address.
	lookup func(netip.Addr) (net.HardwareAddr, string)
	// ifaceOf finds the interface holding a local address.
	ifaceOf func(netip.Addr) (string, error)
	// trustAny skips the neighbour check ([boot] trust_any_neighbor).
	trustAny bool
	now      func() time.Time
	// signer is the site's node id and key now (after renewals).
	signer func() (string, crypto.Signer)
	// nonceKey, when set, authenticates the nonces minted (witnessnonce.go),
	// so that one minted before a restart is still known after it.
	nonceKey []byte

	refused, limited, witnessed atomic.Uint64
	logLimit                    lograte.Limiter

	mu      sync.Mutex
	minted  map[[32]byte]mintedNonce // live nonces by SHA-256
	latest  map[string][32]byte      // each MAC's newest nonce: the one the site vouches for
	rates   map[string]*bucket       // "mac:…" and "ip:…"
	refusal map[string]*refusedBurst // by MAC
}

type mintedNonce struct {
	mac       string
	ip        netip.Addr
	iface     string
	expiresAt time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

type refusedBurst struct {
	sent    time.Time
	pending int
}

func newWitness(log *slog.Logger, events *reporter, trustAny bool, now func() time.Time, signer func() (string, crypto.Signer)) *witness {
	return &witness{log: log, events: events, lookup: neighborEntry, ifaceOf: interfaceWith, trustAny: trustAny,
		now: now, signer: signer, logLimit: lograte.Limiter{Every: 10 * time.Second},
		minted: map[[32]byte]mintedNonce{}, latest: map[string][32]byte{}, rates: map[string]*bucket{}, refusal: map[string]*refusedBurst{}}
}

func (w *witness) stats() WitnessStats {
	return WitnessStats{Refused: w.refused.Load(), RateLimited: w.limited.Load(), Witnessed: w.witnessed.Load()}
}

// evidence is what the site sees of a request: the client's address, its
// neighbour entry's MAC, and the interface the request arrived on.
type evidence struct {
	ip     netip.Addr
	mac    net.HardwareAddr
	iface  string
	reason string // why the evidence does not stand, "" when it does
}

// observe reads the L2 evidence of r for a client claiming mac (nil: any).
func (w *witness) observe(r *http.Request, mac net.HardwareAddr) evidence {
	var ev evidence
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		ev.ip = ap.Addr().Unmap()
	}
	if w.trustAny {
		ev.mac = mac
		return ev
	}
	local := netip.Addr{}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if ap, err := netip.ParseAddrPort(la.String()); err == nil {
			local = ap.Addr().Unmap()
		}
	}
	switch {
	case !ev.ip.IsValid():
		ev.reason = "the client's address is unknown"
		return ev
	case ev.ip.IsLoopback() || ev.ip == local:
		ev.reason = "the client is this host (" + ev.ip.String() + "): no machine on the provisioning network"
		return ev
	}
	nmac, dev := w.lookup(ev.ip)
	ev.mac = nmac
	if nmac == nil {
		ev.reason = "no neighbour entry for " + ev.ip.String() + ": the client is not on a network of this site"
		return ev
	}
	ev.iface = dev
	if local.IsValid() {
		in, err := w.ifaceOf(local)
		if err == nil && dev != "" && in != dev {
			ev.reason = fmt.Sprintf("the neighbour entry of %s is on %s, the request came in on %s", ev.ip, dev, in)
			return ev
		}
		if err == nil {
			ev.iface = in
		}
	}
	if mac != nil && nmac.String() != mac.String() {
		ev.reason = fmt.Sprintf("%s is %s in the neighbour table, not %s", ev.ip, nmac, mac)
	}
	return ev
}

// mint is the nonce minter of one script request: the L2 check, the rates,
// then the journaled nonce.
func (w *witness) mint(r *http.Request, mac net.HardwareAddr) (string, error) {
	ev := w.observe(r, mac)
	if ev.reason != "" {
		w.refuse(mac, ev, "script")
		return "", &boot.RefusedError{Status: http.StatusForbidden,
			Message: "refusing a boot nonce for " + mac.String() + ": " + ev.reason + "; the site agent hands a machine's nonce only to that machine"}
	}
	now := w.now()
	if !w.allow("mac:"+mac.String(), now) || !w.allow("ip:"+ev.ip.String(), now) {
		w.limited.Add(1)
		if ok, n := w.logLimit.Allow(); ok {
			w.log.Warn("boot: refusing a boot nonce: asked too often", "mac", mac.String(), "ip", ev.ip.String(), "suppressed", n)
		}
		return "", &boot.RefusedError{Status: http.StatusTooManyRequests,
			Message: "refusing a boot nonce for " + mac.String() + ": asked too often; wait and PXE-boot again"}
	}
	expires := now.Add(protocol.BootNonceLifetime)
	var nonce string
	var err error
	if w.nonceKey != nil {
		nonce, err = newKeyedNonce(w.nonceKey, mac, expires)
	} else {
		nonce, err = protocol.NewBootNonce()
	}
	if err != nil {
		return "", err
	}
	if err := w.events.MintNonce(mac, ev.ip, ev.iface, nonce); err != nil {
		return "", err
	}
	h := sha256.Sum256([]byte(nonce))
	w.mu.Lock()
	if len(w.minted) >= witnessTableMax {
		w.sweep(now)
	}
	if old, ok := w.latest[mac.String()]; ok {
		// One live nonce per machine: the site vouches for the newest only.
		delete(w.minted, old)
	}
	w.minted[h] = mintedNonce{mac: mac.String(), ip: ev.ip, iface: ev.iface, expiresAt: expires}
	w.latest[mac.String()] = h
	w.mu.Unlock()
	return nonce, nil
}

// sweep forgets expired nonces, and half of the rest when that is not
// enough; w.mu is held.
func (w *witness) sweep(now time.Time) {
	for h, n := range w.minted {
		if !now.Before(n.expiresAt) {
			delete(w.minted, h)
			delete(w.latest, n.mac)
		}
	}
	for h, n := range w.minted {
		if len(w.minted) < witnessTableMax/2 {
			break
		}
		delete(w.minted, h)
		delete(w.latest, n.mac)
	}
}

// allow takes a token from key's bucket.
func (w *witness) allow(key string, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.rates[key]
	if !ok {
		if len(w.rates) >= witnessTableMax {
			clear(w.rates)
		}
		b = &bucket{tokens: nonceBurst, at: now}
		w.rates[key] = b
	}
	b.tokens = min(nonceBurst, b.tokens+now.Sub(b.at).Seconds()/nonceRefill.Seconds())
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// refuse counts a refusal, logs it (rate-limited) and puts it on the
// machine's timeline through a boot.refused event, at most one per MAC per
// refusedEventEvery with the count of the rest.
func (w *witness) refuse(mac net.HardwareAddr, ev evidence, what string) {
	w.refused.Add(1)
	if ok, n := w.logLimit.Allow(); ok {
		w.log.Warn("boot: refused a "+what+": the client's L2 evidence does not fit the MAC it claims (spoofing?)",
			"mac", mac.String(), "ip", ev.ip.String(), "reason", ev.reason, "suppressed", n)
	}
	now := w.now()
	w.mu.Lock()
	rb, ok := w.refusal[mac.String()]
	if !ok {
		if len(w.refusal) >= witnessTableMax {
			clear(w.refusal)
		}
		rb = &refusedBurst{}
		w.refusal[mac.String()] = rb
	}
	rb.pending++
	if !rb.sent.IsZero() && now.Sub(rb.sent) < refusedEventEvery {
		w.mu.Unlock()
		return
	}
	count := rb.pending
	rb.sent, rb.pending = now, 0
	w.mu.Unlock()
	br := protocol.BootRefused{MAC: mac.String(), IP: ev.ip.String(), Interface: ev.iface,
		Reason: what + " refused: " + ev.reason, Count: count, Time: now.UTC()}
	if ev.mac != nil {
		br.NeighborMAC = ev.mac.String()
	}
	data, _ := json.Marshal(br)
	msg := "refused a " + what + " for " + br.MAC + " to " + br.IP + ": " + ev.reason
	if count > 1 {
		msg += " ×" + strconv.Itoa(count)
	}
	if err := w.events.sink.Event(protocol.Event{Kind: protocol.EventBootRefused, Time: now.UTC(), Level: "warn", Message: msg, Data: data}); err != nil {
		w.log.Error("boot: cannot journal a boot.refused event", "mac", br.MAC, "error", err.Error())
	}
}

// ServeHTTP is POST protocol.WitnessPath: the ramdisk's join countersigned, for
// the caller whose neighbour entry is the MAC the site minted its nonce for.
func (w *witness) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.Header().Set("Allow", http.MethodPost)
		http.Error(rw, "POST a witness request", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxWitnessBody+1))
	var req protocol.WitnessRequest
	switch {
	case err != nil:
		http.Error(rw, "reading the witness request: "+err.Error(), http.StatusBadRequest)
		return
	case len(body) > maxWitnessBody:
		http.Error(rw, "the witness request is over 4 KiB", http.StatusRequestEntityTooLarge)
		return
	case json.Unmarshal(body, &req) != nil:
		http.Error(rw, "the witness request is not JSON {boot_nonce, csr_sha256}", http.StatusBadRequest)
		return
	case !protocol.ValidBootNonce(req.BootNonce):
		http.Error(rw, "boot_nonce is not a boot nonce", http.StatusBadRequest)
		return
	case !validSHA256Hex(req.CSRSHA256):
		http.Error(rw, "csr_sha256 is not 64 lowercase hex digits", http.StatusBadRequest)
		return
	}
	h := sha256.Sum256([]byte(req.BootNonce))
	now := w.now()
	w.mu.Lock()
	n, ok := w.minted[h]
	if !ok && w.nonceKey != nil {
		// Minted before this process started (or forgotten when the table
		// was full): its tag says it is ours and for which MAC. It is that
		// MAC's live one unless a newer was minted since.
		if mac, exp, valid := openKeyedNonce(w.nonceKey, req.BootNonce); valid {
			if _, newer := w.latest[mac.String()]; !newer {
				n, ok = mintedNonce{mac: mac.String(), expiresAt: exp}, true
				w.minted[h] = n
				w.latest[n.mac] = h
			}
		}
	}
	if ok && (!now.Before(n.expiresAt) || w.latest[n.mac] != h) {
		ok = false
	}
	w.mu.Unlock()
	if !ok {
		http.Error(rw, "this site agent has no live boot nonce like it: it minted it for another boot, it expired, a newer script replaced it or the agent restarted; PXE-boot again", http.StatusForbidden)
		return
	}
	mac, _ := net.ParseMAC(n.mac)
	ev := w.observe(r, mac)
	if ev.reason != "" {
		w.refuse(mac, ev, "witness")
		http.Error(rw, "refusing to witness a join for "+n.mac+": "+ev.reason, http.StatusForbidden)
		return
	}
	nodeID, key := w.signer()
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		http.Error(rw, "the site's node key: "+err.Error(), http.StatusInternalServerError)
		return
	}
	payload, _ := json.Marshal(protocol.WitnessPayload{NodeID: nodeID, NonceSHA256: hex.EncodeToString(h[:]), CSRSHA256: req.CSRSHA256,
		MAC: n.mac, IP: ev.ip.String(), Interface: ev.iface, Checked: !w.trustAny, Time: now.UTC()})
	digest := sha256.Sum256(payload)
	sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		w.log.Error("boot: cannot sign a witness", "error", err.Error())
		http.Error(rw, "the site agent cannot sign right now; retry", http.StatusServiceUnavailable)
		return
	}
	w.witnessed.Add(1)
	w.log.Info("boot: witnessed a ramdisk's join", "mac", n.mac, "ip", ev.ip.String(), "interface", ev.iface)
	out, _ := json.Marshal(protocol.BootWitness{Payload: payload, Signature: sig, PublicKey: pub})
	rw.Header().Set("Content-Type", "application/json")
	rw.Header().Set("Cache-Control", "no-store")
	_, _ = rw.Write(out)
}

func validSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
