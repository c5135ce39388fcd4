package site

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/protocol"
)

// witnessFixture is the boot servers with a made-up neighbour table: the
// requests are made in process with the addresses a provisioning network
// would give them.
type witnessFixture struct {
	sink  *memSink
	bs    *bootServers
	key   *ecdsa.PrivateKey
	now   time.Time
	neigh map[netip.Addr]struct {
		mac net.HardwareAddr
		dev string
	}
}

const siteIP = "10.20.0.2"

func newWitnessFixture(t *testing.T) *witnessFixture {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	f := &witnessFixture{sink: &memSink{}, key: key, now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC),
		neigh: map[netip.Addr]struct {
			mac net.HardwareAddr
			dev string
		}{}}
	log := slog.New(slog.DiscardHandler)
	now := func() time.Time { return f.now }
	r := newReporter(f.sink, log, now, 0)
	var table boot.MemTable
	if err := table.Set(map[string]boot.Entry{macA.String(): {Mode: boot.ModeRamdisk}, macB.String(): {Mode: boot.ModeRamdisk}}); err != nil {
		t.Fatal(err)
	}
	w := newWitness(log, r, false, now, func() (string, crypto.Signer) { return "n_site", key })
	w.lookup = func(ip netip.Addr) (net.HardwareAddr, string) {
		e, ok := f.neigh[ip]
		if !ok {
			return nil, ""
		}
		return e.mac, e.dev
	}
	w.ifaceOf = func(ip netip.Addr) (string, error) {
		if ip.String() == siteIP {
			return "br0", nil
		}
		return "", errFakeNoIface
	}
	params := testParams
	params.Witness = "http://10.20.0.2:8080" + protocol.WitnessPath
	f.bs = &bootServers{log: log, events: r, params: params, witness: w}
	f.bs.base.Store(&boot.HTTPServer{URL: "http://10.20.0.2:8080", Table: &table, Params: params,
		Kernel: "http://10.20.0.2:8080/ramdisk/vmlinuz", Initrd: "http://10.20.0.2:8080/ramdisk/initrd", Observer: r})
	return f
}

var errFakeNoIface = &net.AddrError{Err: "no such interface", Addr: "test"}

func (f *witnessFixture) neighbour(ip string, mac net.HardwareAddr, dev string) {
	f.neigh[netip.MustParseAddr(ip)] = struct {
		mac net.HardwareAddr
		dev string
	}{mac, dev}
}

// do serves a request from client (ip:port) to the site's 10.20.0.2:8080.
func (f *witnessFixture) do(method, path, client string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "http://10.20.0.2:8080"+path, bytes.NewReader(body))
	req.RemoteAddr = client
	req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey,
		net.TCPAddrFromAddrPort(netip.MustParseAddrPort(siteIP+":8080"))))
	rec := httptest.NewRecorder()
	f.bs.ServeHTTP(rec, req)
	return rec
}

func (f *witnessFixture) kinds() map[string]int {
	f.sink.mu.Lock()
	defer f.sink.mu.Unlock()
	n := map[string]int{}
	for _, e := range f.sink.events {
		n[e.Kind]++
	}
	return n
}

var nonceRE = regexp.MustCompile(`bcd\.boot_nonce=(\S+)`)

// TestScriptNonceOnlyForItsNeighbour: the site hands a machine's nonce only to
// the client whose address the neighbour table maps to the machine's MAC on the
// interface the request came in on; anyone else gets 403, no nonce, and a
// boot.refused event for the machine's timeline.
func TestScriptNonceOnlyForItsNeighbour(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client string
		setup  func(f *witnessFixture)
		want   int
		reason string
	}{
		{"its own neighbour entry", "10.20.0.50:40000", func(f *witnessFixture) { f.neighbour("10.20.0.50", macA, "br0") }, 200, ""},
		{"another machine's address", "10.20.0.66:40000", func(f *witnessFixture) { f.neighbour("10.20.0.66", macB, "br0") }, 403, "not 52:54:00:12:34:56"},
		{"no neighbour entry", "10.30.0.9:40000", func(*witnessFixture) {}, 403, "no neighbour entry"},
		{"loopback", "127.0.0.1:40000", func(f *witnessFixture) { f.neighbour("127.0.0.1", macA, "lo") }, 403, "this host"},
		{"the entry on another interface", "10.20.0.50:40000", func(f *witnessFixture) { f.neighbour("10.20.0.50", macA, "eth9") }, 403, "came in on br0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWitnessFixture(t)
			tc.setup(f)
			rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", tc.client, nil)
			body := rec.Body.String()
			if rec.Code != tc.want || !strings.Contains(body, tc.reason) {
				t.Fatalf("status %d, want %d with %q: %s", rec.Code, tc.want, tc.reason, body)
			}
			k := f.kinds()
			if tc.want == 200 {
				if !nonceRE.MatchString(body) || k[protocol.EventBootNonce] != 1 || k[protocol.EventBootRefused] != 0 {
					t.Errorf("events %v, script:\n%s", k, body)
				}
				if !strings.Contains(body, "bcd.witness=http://10.20.0.2:8080/v1/witness") {
					t.Errorf("no bcd.witness in the script:\n%s", body)
				}
				return
			}
			if nonceRE.MatchString(body) || k[protocol.EventBootNonce] != 0 || k[protocol.EventBootRefused] != 1 {
				t.Errorf("a refused client: events %v, body %s", k, body)
			}
			if f.bs.witness.stats().Refused != 1 {
				t.Errorf("stats %+v", f.bs.witness.stats())
			}
		})
	}
}

// TestNonceMintingRateLimited: per MAC, then per client address.
func TestNonceMintingRateLimited(t *testing.T) {
	f := newWitnessFixture(t)
	f.neighbour("10.20.0.50", macA, "br0")
	for i := 0; i < nonceBurst; i++ {
		if rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", "10.20.0.50:40000", nil); rec.Code != 200 {
			t.Fatalf("script %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	if rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", "10.20.0.50:40000", nil); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("script %d: %d, want 429", nonceBurst, rec.Code)
	}
	f.now = f.now.Add(nonceRefill)
	if rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", "10.20.0.50:40000", nil); rec.Code != 200 {
		t.Fatalf("after %s: %d", nonceRefill, rec.Code)
	}
	if got := f.kinds()[protocol.EventBootNonce]; got != nonceBurst+1 {
		t.Errorf("%d nonces minted, want %d", got, nonceBurst+1)
	}
	if f.bs.witness.stats().RateLimited != 1 {
		t.Errorf("stats %+v", f.bs.witness.stats())
	}
}

// TestWitness: the site countersigns the join of the client that has the
// nonce's MAC now, for the newest nonce of that MAC only; a client of another
// MAC is refused and raises boot.refused.
func TestWitness(t *testing.T) {
	f := newWitnessFixture(t)
	f.neighbour("10.20.0.50", macA, "br0")
	f.neighbour("10.20.0.66", macB, "br0")
	script := func() string {
		rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", "10.20.0.50:40000", nil)
		m := nonceRE.FindStringSubmatch(rec.Body.String())
		if m == nil {
			t.Fatalf("no nonce: %d %s", rec.Code, rec.Body)
		}
		return m[1]
	}
	old := script()
	nonce := script()
	csr := strings.Repeat("ab", 32)
	ask := func(nonce, client string) *httptest.ResponseRecorder {
		body, _ := json.Marshal(protocol.WitnessRequest{BootNonce: nonce, CSRSHA256: csr})
		return f.do(http.MethodPost, protocol.WitnessPath, client, body)
	}

	rec := ask(nonce, "10.20.0.50:40001")
	if rec.Code != 200 {
		t.Fatalf("witness: %d %s", rec.Code, rec.Body)
	}
	var w protocol.BootWitness
	if err := json.Unmarshal(rec.Body.Bytes(), &w); err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(f.key.Public())
	digest := sha256.Sum256(w.Payload)
	if !bytes.Equal(w.PublicKey, pub) || !ecdsa.VerifyASN1(&f.key.PublicKey, digest[:], w.Signature) {
		t.Fatal("the witness is not signed by the site's key")
	}
	p, err := protocol.DecodeWitnessPayload(w.Payload)
	h := sha256.Sum256([]byte(nonce))
	want := protocol.WitnessPayload{NodeID: "n_site", NonceSHA256: hex.EncodeToString(h[:]), CSRSHA256: csr, MAC: macA.String(),
		IP: "10.20.0.50", Interface: "br0", Checked: true, Time: f.now}
	if err != nil || p != want {
		t.Errorf("payload %+v, want %+v (%v)", p, want, err)
	}

	for _, tc := range []struct {
		name, nonce, client, want string
	}{
		{"another machine asks", nonce, "10.20.0.66:40001", "not 52:54:00:12:34:56"},
		{"an address with no neighbour entry", nonce, "10.20.0.77:40001", "no neighbour entry"},
		{"a nonce a newer script replaced", old, "10.20.0.50:40001", "no live boot nonce"},
		{"a nonce this site never minted", strings.Repeat("x", 22), "10.20.0.50:40001", "no live boot nonce"},
	} {
		if rec := ask(tc.nonce, tc.client); rec.Code != 403 || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s: %d %s, want 403 %q", tc.name, rec.Code, rec.Body, tc.want)
		}
	}
	if k := f.kinds(); k[protocol.EventBootRefused] != 1 {
		t.Errorf("events %v, want one boot.refused (the second refusal within a minute is counted into the next)", k)
	}
	f.now = f.now.Add(refusedEventEvery)
	ask(nonce, "10.20.0.66:40001")
	f.sink.mu.Lock()
	last := f.sink.events[len(f.sink.events)-1]
	f.sink.mu.Unlock()
	var br protocol.BootRefused
	if err := json.Unmarshal(last.Data, &br); err != nil || last.Kind != protocol.EventBootRefused || br.Count != 2 ||
		br.NeighborMAC != macB.String() || br.IP != "10.20.0.66" {
		t.Errorf("last event %s %+v (%v), want boot.refused ×2 from 10.20.0.66 with %s", last.Kind, br, err, macB)
	}
	f.now = f.now.Add(protocol.BootNonceLifetime)
	if rec := ask(nonce, "10.20.0.50:40001"); rec.Code != 403 {
		t.Errorf("an expired nonce: %d", rec.Code)
	}
}

// TestWitnessAfterARestart: a site agent restarted between a machine's script
// and its join (a new process: no table of live nonces) still witnesses that
// join, by the nonce's tag under <data_dir>/witness.key; it does not for a
// nonce of another key, a tampered one, an expired one, or one that a script
// minted since the restart replaced. Without the key every machine of a storm
// in that window was refused until it PXE-booted again.
func TestWitnessAfterARestart(t *testing.T) {
	dir := t.TempDir()
	key, err := loadWitnessKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	again, err := loadWitnessKey(dir)
	if err != nil || !bytes.Equal(again, key) {
		t.Fatalf("the key read back differs (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, WitnessKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("witness.key: %v %v", fi, err)
	}
	start := func(k []byte) *witnessFixture {
		f := newWitnessFixture(t)
		f.bs.witness.nonceKey = k
		f.neighbour("10.20.0.50", macA, "br0")
		return f
	}
	script := func(f *witnessFixture) string {
		rec := f.do(http.MethodGet, "/ipxe/"+macA.String()+".ipxe", "10.20.0.50:40000", nil)
		m := nonceRE.FindStringSubmatch(rec.Body.String())
		if m == nil {
			t.Fatalf("no nonce: %d %s", rec.Code, rec.Body)
		}
		return m[1]
	}
	ask := func(f *witnessFixture, nonce string) int {
		body, _ := json.Marshal(protocol.WitnessRequest{BootNonce: nonce, CSRSHA256: strings.Repeat("ab", 32)})
		return f.do(http.MethodPost, protocol.WitnessPath, "10.20.0.50:40001", body).Code
	}

	before := start(key)
	nonce := script(before)
	if !protocol.ValidBootNonce(nonce) {
		t.Fatalf("nonce %q is not a valid boot nonce", nonce)
	}
	if got := ask(start(key), nonce); got != 200 {
		t.Errorf("after a restart: %d, want 200", got)
	}
	other := make([]byte, len(key))
	if got := ask(start(other), nonce); got != 403 {
		t.Errorf("a site agent with another key: %d, want 403", got)
	}
	raw := []byte(nonce)
	raw[len(raw)-2] ^= 1
	if got := ask(start(key), string(raw)); got != 403 {
		t.Errorf("a tampered nonce: %d, want 403", got)
	}
	late := start(key)
	late.now = late.now.Add(protocol.BootNonceLifetime + time.Second)
	if got := ask(late, nonce); got != 403 {
		t.Errorf("an expired nonce: %d, want 403", got)
	}
	replaced := start(key)
	script(replaced)
	if got := ask(replaced, nonce); got != 403 {
		t.Errorf("a nonce a newer script replaced after the restart: %d, want 403", got)
	}
	if err := os.WriteFile(filepath.Join(dir, WitnessKeyFile), []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadWitnessKey(dir); err == nil || !strings.Contains(err.Error(), "want 32") {
		t.Errorf("a short key file: %v", err)
	}
}
