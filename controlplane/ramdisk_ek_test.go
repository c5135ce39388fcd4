package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	agentjoin "github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/tpm"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/internal/swtpmtest"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/ramdisk"
)

// The ramdisk of a machine with an enrolled TPM endorsement key, as bcd
// ramdisk runs it (ramdisk.Agent, its join client and its TPM host) against
// serve's gateway, with swtpm as the TPM: the machine's TPM joins after the
// credential challenge and its node keeps the proven EK; another TPM, and a
// ramdisk without one, are refused ATTESTOR_REFUSED on the machine's
// timeline.

type quietSystem struct{}

func (quietSystem) Prepare(context.Context, *slog.Logger) error { return nil }
func (quietSystem) Network(context.Context, *slog.Logger) error { return nil }

// swtpmHost is a nodekey.Host on a fresh swtpm.
func swtpmHost(t *testing.T) *nodekey.Host {
	t.Helper()
	sw := swtpmtest.Start(t, false)
	h := &nodekey.Host{OpenTPM: func() (*tpm.TPM, error) { return tpm.OpenTCP(sw.Addr()) }}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestRamdiskProvesTheEnrolledEK(t *testing.T) {
	l := newLab(t, "")
	const mac = "52:54:00:17:03:01"
	fm := l.addMachine(mac, false, nil)
	machineTPM, otherTPM := swtpmHost(t), swtpmHost(t)
	ekPEM, err := machineTPM.EKClaim()
	if err != nil {
		t.Fatal(err)
	}
	ek := join.EKSHA256(ekPEM)
	if _, err := l.op.EnrollMachineTPM(ctx, fm.id, apitype.MachineTPMSet{EKSHA256: ek}); err != nil {
		t.Fatal(err)
	}

	// The site agent mints the nonce and witnesses the joins for it.
	nonce := strings.Repeat("n", 12) + "0123456789abcdef"
	l.site.event(protocol.EventBootNonce, protocol.BootNonce{MAC: mac, Nonce: nonce, ExpiresAt: time.Now().Add(protocol.BootNonceLifetime)})
	witness := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req protocol.WitnessRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.BootNonce != nonce {
			http.Error(w, "not this nonce", http.StatusForbidden)
			return
		}
		json.NewEncoder(w).Encode(cptest.SignWitness(l.siteKey, l.siteID, nonce, req.CSRSHA256, mac, nil))
	}))
	t.Cleanup(witness.Close)
	wurl, _ := url.Parse(witness.URL)
	gw, _ := url.Parse(l.gw())

	run := func(t *testing.T, host *nodekey.Host, dataDir string) (*ramdisk.Agent, chan error, context.CancelFunc) {
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		fast := agent.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond}
		a := &ramdisk.Agent{
			Params: ramdisk.Params{GatewayURL: l.gw(), ServerName: gw.Hostname(), Site: cptest.Site, Pins: l.s.Bundle().Public.Pins(),
				BootNonce: nonce, Witness: wurl},
			DataDir: dataDir,
			System:  quietSystem{},
			Claims: func(context.Context) protocol.Claims {
				return protocol.Claims{Hostname: "ramdisk", MACs: []string{mac}, CPUs: 4}
			},
			TPM:     host,
			BootID:  func() (string, error) { return "0b2c8f3e-0000-4000-8000-000000000001", nil },
			Backoff: fast, JoinBackoff: fast,
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(rctx) }()
		return a, done, cancel
	}
	refusedRun := func(t *testing.T, host *nodekey.Host, want string) {
		_, done, cancel := run(t, host, t.TempDir())
		defer cancel()
		select {
		case err := <-done:
			var r *agentjoin.RefusedError
			if !errors.As(err, &r) || r.Response.Code != protocol.CodeAttestorRefused || !strings.Contains(err.Error(), want) {
				t.Fatalf("the ramdisk ended with %v, want ATTESTOR_REFUSED saying %q", err, want)
			}
		case <-time.After(time.Minute):
			t.Fatal("the refused ramdisk still runs")
		}
	}
	refusals := func() int {
		evs, err := l.op.MachineEvents(ctx, fm.id, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range evs.Events {
			if e.Kind == protocol.MachineEventJoinRefused && strings.Contains(string(e.Data), protocol.CodeAttestorRefused) &&
				strings.Contains(string(e.Data), ek) {
				n++
			}
		}
		return n
	}

	t.Run("another TPM", func(t *testing.T) { refusedRun(t, otherTPM, "this ramdisk's TPM has") })
	t.Run("no TPM", func(t *testing.T) { refusedRun(t, nil, "sent no TPM evidence") })
	if got := refusals(); got != 2 {
		t.Errorf("%d ATTESTOR_REFUSED refusals naming the enrolled EK on the machine's timeline, want 2", got)
	}
	t.Run("the machine's TPM", func(t *testing.T) {
		dataDir := t.TempDir()
		_, done, cancel := run(t, machineTPM, dataDir)
		defer cancel()
		var node string
		waitFor(t, "the ramdisk's node bound to the machine", func() bool {
			select {
			case err := <-done:
				t.Fatalf("the ramdisk ended: %v", err)
			default:
			}
			m, err := l.s.store.GetMachine(ctx, fm.id)
			if err != nil || m.BoundRamdisk == "" {
				return false
			}
			node = m.BoundRamdisk
			return true
		})
		n, err := l.op.GetNode(ctx, node) // as nodes show has it
		if err != nil {
			t.Fatal(err)
		}
		if n.Role != protocol.RoleRamdisk || n.ProvenEKSHA256 != ek || n.TPMEKSHA256 != "" {
			t.Errorf("ramdisk node %s: role %s, proven EK %q, reclaim EK %q; want ramdisk, %s, none", n.ID, n.Role, n.ProvenEKSHA256, n.TPMEKSHA256, ek)
		}
		cancel()
		<-done

		// bcd ramdisk restarted in the same boot: the identity's key is the
		// TPM's, loaded back through the same TPM, and the session comes back.
		waitFor(t, "the first session to end", func() bool { n, _ := l.s.store.GetNode(ctx, node); return n.SessionID == 0 })
		_, done, cancel = run(t, machineTPM, dataDir)
		defer cancel()
		waitFor(t, "the restarted ramdisk's session", func() bool {
			select {
			case err := <-done:
				t.Fatalf("the restarted ramdisk ended: %v", err)
			default:
			}
			n, _ := l.s.store.GetNode(ctx, node)
			return n.SessionID != 0
		})
		cancel()
		<-done
	})
}
