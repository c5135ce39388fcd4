package retention

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/syncbuf"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

// TestScriptFloodIsPruned: a flood of script GETs to a real bcd site's boot
// HTTP server (trust_any_neighbor, since the client is loopback): the site's
// witness mints nonces for a burst and then one per 10 s per MAC and client
// (429 for the rest), its journal and session carry those to a gateway which
// stores them as serve does (machines.Events, then the node's events), and
// with the pruner's rounds the store stays within the bound, the timeline
// keeps its start, and the nonce of the last script served is stored.
func TestScriptFloodIsPruned(t *testing.T) {
	gets := 3000
	if testing.Short() {
		gets = 1000
	}
	const perKind, burst = 50, 500
	st, dir := openStore(t)
	m := cptest.NewMachine(t, st, nil)
	policy := store.Retention{PerKind: perKind, MaxTotal: 10_000, NoncesPerMAC: 4}
	p := &Pruner{Store: st, Policy: policy}

	g := agenttest.New(t)
	dataDir := filepath.Join(t.TempDir(), "data")
	g.Identity(t, dataDir, protocol.RoleSite, "n_site")
	node := store.Node{ID: "n_site", Role: protocol.RoleSite, Site: cptest.Site}
	evs := &machines.Events{Store: st}
	var ingestMu sync.Mutex
	var stored int
	var ingestErr error
	g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
		if c.Hello.Role != protocol.RoleSite {
			agenttest.AckAll(ctx, c, nil)
			return
		}
		// What the gateway's session does with each event before its ack.
		agenttest.AckAll(ctx, c, func(f protocol.Frame) {
			if f.Type != protocol.FrameEvent {
				return
			}
			var ev protocol.Event
			err := f.Decode(&ev)
			if err == nil {
				var out []protocol.Event
				if out, err = evs.Events(ctx, node, []protocol.Event{ev}); err == nil {
					e := out[0]
					err = st.AddEvents(ctx, []store.Event{{NodeID: node.ID, Seq: e.Seq, Kind: e.Kind, Time: e.Time,
						Message: e.Message, Data: e.Data, ReceivedAt: time.Now()}})
				}
			}
			ingestMu.Lock()
			if err != nil && ingestErr == nil {
				ingestErr = err
			}
			if e := ev; e.Kind == protocol.EventBootNonce {
				stored++
			}
			ingestMu.Unlock()
		})
	}
	spec := protocol.Spec{Revision: 1, Sections: map[string]json.RawMessage{}}
	entries, _ := json.Marshal(protocol.BootSection{Entries: []protocol.BootEntry{{MAC: cptest.MAC, Mode: protocol.BootRamdisk}}})
	spec.Sections[protocol.SectionBoot] = entries
	g.WelcomeFor = func(protocol.Hello) protocol.Welcome {
		return protocol.Welcome{ServerTime: time.Now().UTC(), MinProtocolVersion: protocol.MinVersion, NodeState: protocol.NodeReady, Spec: &spec}
	}
	cfgPath := g.WriteConfig(t, t.TempDir(), dataDir)
	root := t.TempDir()
	for _, name := range []string{"vmlinuz", "initrd"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	httpAddr := ln.Addr().String()
	ln.Close()
	fh, err := os.OpenFile(cfgPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Every server on loopback: the TFTP server on a port of its own, no proxyDHCP.
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tftpAddr := udp.LocalAddr().String()
	udp.Close()
	fmt.Fprintf(fh, "[boot]\nlisten = %q\nurl = \"http://%s\"\nramdisk_dir = %q\nserver_ip = \"127.0.0.1\"\nproxy_dhcp = false\ntftp = %q\ntftp_root = %q\ntrust_any_neighbor = true\n",
		httpAddr, httpAddr, root, tftpAddr, root)
	fh.Close()
	cfg, err := config.Load(cfgPath, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	log := &syncbuf.Buffer{}
	s := &site.Site{Config: cfg, Logger: slog.New(slog.NewTextHandler(log, nil)),
		BootID:  func() (string, error) { return "boot-1", nil },
		Claims:  func(context.Context) protocol.Claims { return protocol.Claims{Hostname: "site-host"} },
		Backoff: agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// script returns the script, or "" when the witness refused it as asked
	// too often (429).
	script := func() string {
		resp, err := http.Get("http://" + httpAddr + "/ipxe/" + cptest.MAC + ".ipxe")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case 200:
			return string(b)
		case http.StatusTooManyRequests:
			return ""
		}
		t.Fatalf("script: %d %s", resp.StatusCode, b)
		return ""
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, log.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUntil("the boot table", func() bool {
		resp, err := http.Get("http://" + httpAddr + "/ipxe/" + cptest.MAC + ".ipxe")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return strings.Contains(string(b), "bcd.boot_nonce=")
	})
	// The probe's nonce is the timeline's first; the timeline's times are when
	// the gateway stored each, so the flood starts once it has.
	waitUntil("the probe's nonce stored", func() bool {
		ingestMu.Lock()
		defer ingestMu.Unlock()
		return stored >= 1
	})
	var last string
	served := 1 // the probe's
	floodStart := time.Now()
	for i := 0; i < gets; i++ {
		if sc := script(); sc != "" {
			last, served = sc, served+1
		}
		if i%burst == burst-1 {
			if _, err := p.Round(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	floodEnd := time.Now()
	// The witness's rate: a burst of 6, then one per 10 s (site/witness.go).
	if max := 6 + int(floodEnd.Sub(floodStart)/(10*time.Second)) + 1; served > max {
		t.Errorf("%d of %d scripts carried a nonce in %s, want at most %d (the witness's rate)", served, gets+1, floodEnd.Sub(floodStart), max)
	}
	if last == "" {
		t.Fatal("no script of the flood carried a nonce")
	}
	waitUntil("the gateway to store every nonce", func() bool {
		ingestMu.Lock()
		defer ingestMu.Unlock()
		return stored >= served
	})
	ingestMu.Lock()
	if ingestErr != nil {
		t.Fatal(ingestErr)
	}
	ingestMu.Unlock()
	if _, err := p.Round(ctx); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]int{"events": perKind + 1, "machine_events": perKind + 1, "boot_nonces": 4} {
		q := `SELECT COUNT(*) FROM ` + table
		if table != "boot_nonces" {
			q += ` WHERE kind = '` + protocol.EventBootNonce + `'`
		}
		if got := count(t, dir, q); got > want {
			t.Errorf("%s holds %d boot nonce rows after %d script GETs, want at most %d", table, got, gets, want)
		}
	}
	tl, err := st.MachineEvents(ctx, m.ID, 10*perKind)
	if err != nil {
		t.Fatal(err)
	}
	var nonces []store.MachineEvent
	for _, e := range tl {
		if e.Kind == protocol.EventBootNonce {
			nonces = append(nonces, e)
		}
	}
	switch {
	case len(tl) == 0 || tl[0].Kind != protocol.MachineEventAdded:
		t.Errorf("the timeline lost its start: %+v", tl)
	case len(nonces) != min(served, perKind+1):
		t.Errorf("%d boot.nonce entries on the timeline, want %d", len(nonces), min(served, perKind+1))
	case !nonces[0].Time.Before(floodStart):
		t.Errorf("the timeline's boot.nonce entries start at %s, want the probe's, before the flood (%s)", nonces[0].Time, floodStart)
	}
	// The nonce the last script carries is the MAC's newest, and it is stored.
	i := strings.Index(last, "bcd.boot_nonce=")
	nonce := strings.Fields(last[i+len("bcd.boot_nonce="):])[0]
	if _, err := st.GetBootNonce(ctx, sha256Hash(nonce)); err != nil {
		t.Errorf("the last script's nonce: %v", err)
	}
}

func sha256Hash(s string) token.Hash { return sha256.Sum256([]byte(s)) }
