package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Renewal tunables.
const (
	// RenewFraction is the part of a certificate's lifetime after which the node
	// renews it; RenewJitter the spread around it, both of the lifetime.
	RenewFraction = 2.0 / 3
	RenewJitter   = 0.05
	// maxRenewJitter bounds the spread of a long-lived certificate's renewal.
	maxRenewJitter = 12 * time.Hour
	// DefaultRefusedRetry is the slow rate a refused renewal is tried again at
	// (a deleted node can only come back through bcd join --reset).
	DefaultRefusedRetry = time.Hour
	maxRenewAnswer      = pki.MaxJWSSize + 64<<10
)

// Steps of a renewal, in order, as the Renewer's Hook sees them.
const (
	RenewStepKeyWritten = "key-written" // node.key.next is on disk; nothing sent yet
	RenewStepAnswered   = "answered"    // the control plane answered and the answer verified
	RenewStepStored     = "stored"      // identity.json holds the new chain as next
	RenewStepPromoted   = "promoted"    // node.key.next is node.key; identity.json not yet rewritten
)

// RenewalRefusedError is a renewal the control plane refused: retrying soon will
// not fix it.
type RenewalRefusedError struct {
	Status   int
	Response protocol.ErrorResponse
}

func (e *RenewalRefusedError) Error() string {
	return fmt.Sprintf("the control plane refused the renewal: %s: %s", e.Response.Code, e.Response.Message)
}

// RenewalStatus is what a status socket says of the certificate and its renewal.
type RenewalStatus struct {
	// NotAfter is the current certificate's expiry.
	NotAfter time.Time
	// Next is when the next attempt is due.
	Next time.Time
	// State is "" while all is well, "refused: CODE: message" after a refusal,
	// "failing: error" after a transient failure.
	State string
}

// Renewer keeps the node certificate fresh, for bcd node and bcd site alike. At
// about two thirds of the certificate's lifetime (±5 % of it) it makes the next
// key and writes it as node.key.next (0600), asks POST {gateway}/v1/renew over
// mutual TLS with the current certificate (which proves the current key) with a
// CSR of the next key, verifies the answer as a join's, stores the new chain in
// identity.json as next, renames node.key.next to node.key and then makes the
// new chain identity.json's current one. A crash at any point leaves a pair that
// works: before the rename, identity.json's current chain and node.key; after
// it, the next chain and node.key, which LoadIdentity picks and Run finishes.
// An unfinished renewal (node.key.next on disk) is resumed at once with the same
// key, which the control plane accepts from the replaced certificate.
type Renewer struct {
	// DataDir holds node.key, node.key.next and identity.json.
	DataDir string
	// Keys makes and loads the keys; nil is PKCS8Keys.
	Keys KeyStore
	// Identity is the identity as loaded; Current returns the renewed one.
	Identity *Identity
	// GatewayURL, ServerName and ServingCAPin reach the gateway as the session
	// does; JoinSigningPin verifies the answer as a join's.
	GatewayURL, ServerName, ServingCAPin, JoinSigningPin string
	// Proxy, when set, is an HTTP proxy to reach the gateway through.
	Proxy *url.URL
	// Backoff spaces retries after a transient failure.
	Backoff Backoff
	// RefusedRetry spaces attempts after a refusal; 0 is DefaultRefusedRetry
	// (at most a third of the certificate's lifetime, at least a minute).
	RefusedRetry time.Duration
	// Logger receives what happens; nil discards it.
	Logger *slog.Logger
	// Hook, if set, is called after each step (RenewStep*): tests stop a
	// renewal there.
	Hook func(step string)

	mu     sync.Mutex
	cur    *Identity
	status RenewalStatus
}

func (r *Renewer) log() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

// Current is the identity to authenticate with now.
func (r *Renewer) Current() *Identity {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return r.Identity
	}
	return r.cur
}

// Status is the certificate's expiry and the renewal's state.
func (r *Renewer) Status() RenewalStatus {
	r.mu.Lock()
	st := r.status
	r.mu.Unlock()
	st.NotAfter = r.Current().Leaf().NotAfter
	return st
}

func (r *Renewer) setStatus(next time.Time, state string) {
	r.mu.Lock()
	r.status.Next, r.status.State = next, state
	r.mu.Unlock()
}

func (r *Renewer) hook(step string) {
	if r.Hook != nil {
		r.Hook(step)
	}
}

// Run renews until ctx is done and returns its error. It first finishes a
// renewal a crash interrupted after the certificate was stored.
func (r *Renewer) Run(ctx context.Context) error {
	if r.Identity == nil || r.Identity.Key() == nil {
		return errors.New("renewal: no identity")
	}
	if id, err := FinishRenewal(r.DataDir, r.Keys); err != nil {
		r.log().Error("renewal: finishing an interrupted renewal failed", "error", err.Error())
	} else if id != nil {
		r.mu.Lock()
		r.cur = id
		r.mu.Unlock()
		r.log().Info("finished an interrupted certificate renewal", "not_after", id.Leaf().NotAfter)
	}
	next := RenewAt(r.Current(), rand.Float64()*2-1)
	if r.unfinished() {
		next = time.Now()
		r.log().Info("resuming an unfinished certificate renewal", "key", KeyNextFile)
	}
	attempt := 0
	for {
		r.setStatus(next, r.Status().State)
		if !Sleep(ctx, time.Until(next)) {
			return ctx.Err()
		}
		old := r.Current().Leaf()
		err := r.RenewOnce(ctx)
		var refused *RenewalRefusedError
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			attempt = 0
			id := r.Current()
			next = RenewAt(id, rand.Float64()*2-1)
			r.setStatus(next, "")
			r.log().Info("node certificate renewed", "old_serial", old.SerialNumber.Text(16), "serial", id.Leaf().SerialNumber.Text(16),
				"not_after", id.Leaf().NotAfter, "next_renewal", next)
		case errors.As(err, &refused):
			attempt = 0
			next = time.Now().Add(r.refusedRetry())
			state := fmt.Sprintf("refused: %s: %s", refused.Response.Code, refused.Response.Message)
			r.setStatus(next, state)
			r.log().Error("the control plane refused to renew the node certificate", "code", refused.Response.Code,
				"message", refused.Response.Message, "not_after", old.NotAfter, "retry_at", next)
		default:
			d := r.Backoff.Delay(attempt)
			attempt++
			next = time.Now().Add(d)
			r.setStatus(next, "failing: "+err.Error())
			r.log().Warn("renewing the node certificate failed; retrying", "error", err.Error(), "retry_in", d.Round(time.Millisecond).String(),
				"not_after", old.NotAfter)
		}
	}
}

func (r *Renewer) refusedRetry() time.Duration {
	if r.RefusedRetry > 0 {
		return r.RefusedRetry
	}
	d := DefaultRefusedRetry
	if third := CertLifetime(r.Current()) / 3; third < d {
		d = third
	}
	return max(d, time.Minute)
}

func (r *Renewer) unfinished() bool {
	_, err := os.Lstat(filepath.Join(r.DataDir, KeyNextFile))
	return err == nil
}

// CertLifetime is the current certificate's lifetime, counted from its issue
// (the join's or renewal's iat) when identity.json has it, else from NotBefore
// (which the control plane backdates a few minutes).
func CertLifetime(id *Identity) time.Duration {
	leaf := id.Leaf()
	start := leaf.NotBefore
	if t := id.CertIssuedAt; !t.IsZero() && !t.Before(leaf.NotBefore) && t.Before(leaf.NotAfter) {
		start = t
	}
	return leaf.NotAfter.Sub(start)
}

// RenewAt is when id's certificate is due for renewal: two thirds into its
// lifetime, moved by jitter (in [-1, 1]) times 5 % of it, at most 12 h.
func RenewAt(id *Identity, jitter float64) time.Time {
	life := CertLifetime(id)
	start := id.Leaf().NotAfter.Add(-life)
	spread := time.Duration(float64(life) * RenewJitter)
	spread = min(spread, maxRenewJitter)
	jitter = max(-1, min(1, jitter))
	return start.Add(time.Duration(float64(life)*RenewFraction) + time.Duration(jitter*float64(spread)))
}

// RenewOnce runs one renewal to its end (see Renewer). A refusal is a
// *RenewalRefusedError.
func (r *Renewer) RenewOnce(ctx context.Context) error {
	cur := r.Current()
	next, err := r.nextKey()
	if err != nil {
		return err
	}
	r.hook(RenewStepKeyWritten)
	csrPEM, err := pki.NewCSR(next.Signer)
	if err != nil {
		return fmt.Errorf("renewal: %w", err)
	}
	blk, _ := pem.Decode(csrPEM)
	if blk == nil {
		return errors.New("renewal: the CSR does not encode")
	}
	csrSHA := pki.CSRSHA256(blk.Bytes)
	resp, err := r.post(ctx, cur, csrPEM)
	if err != nil {
		return err
	}
	renewed, err := VerifyJoinResponse(resp, r.JoinSigningPin, JoinExpectation{
		CSRSHA256: csrSHA, Role: cur.Role, NodeID: cur.NodeID, Key: next.Signer.Public(),
	})
	if err != nil {
		return fmt.Errorf("refusing the renewal's answer: %w", err)
	}
	r.hook(RenewStepAnswered)

	// Store the new chain beside the current one; node.key and the current
	// chain stay a working pair until the rename.
	now := time.Now().UTC()
	stored := *cur
	stored.key, stored.chain, stored.bundle = nil, nil, nil
	stored.Next = &PendingCert{CertChain: renewed.CertChain, TrustBundle: renewed.TrustBundle, CertIssuedAt: renewed.CertIssuedAt, RenewedAt: now}
	stored.Version = identityVersion
	if err := writeIdentityFile(r.DataDir, &stored); err != nil {
		return fmt.Errorf("renewal: store the new certificate: %w", err)
	}
	r.hook(RenewStepStored)
	renewedID := promoted(&stored)
	renewedID.key = next.Signer
	id, err := finish(r.DataDir, &pending{id: renewedID, keyNext: true}, r.hook)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.cur = id
	r.mu.Unlock()
	return nil
}

// nextKey loads node.key.next, left by an unfinished renewal, or makes one and
// writes it (0600) before anything is sent.
func (r *Renewer) nextKey() (*NodeKey, error) {
	path := filepath.Join(r.DataDir, KeyNextFile)
	if key, err := loadKey(path, r.Keys); err == nil {
		return &NodeKey{Signer: key}, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		r.log().Warn("renewal: making a new next key; the one on disk does not load", "file", path, "error", err.Error())
	}
	key, err := NewNodeKey(r.Keys)
	if err != nil {
		return nil, fmt.Errorf("renewal: %w", err)
	}
	if err := pki.WriteFileAtomic(path, key.File, 0o600); err != nil {
		return nil, fmt.Errorf("renewal: write %s: %w", KeyNextFile, err)
	}
	return key, nil
}

// finish promotes p: renames node.key.next to node.key (when the key is still
// there) and rewrites identity.json with the renewed chain as the current one.
// p.id carries the renewed certificate's key.
func finish(dataDir string, p *pending, hook func(string)) (*Identity, error) {
	id := p.id
	if p.keyNext {
		if err := os.Rename(filepath.Join(dataDir, KeyNextFile), filepath.Join(dataDir, KeyFile)); err != nil {
			return nil, fmt.Errorf("renewal: promote %s: %w", KeyNextFile, err)
		}
		if err := pki.SyncDir(dataDir); err != nil {
			return nil, fmt.Errorf("renewal: promote %s: %w", KeyNextFile, err)
		}
	}
	if hook != nil {
		hook(RenewStepPromoted)
	}
	if err := id.check(); err != nil {
		return nil, fmt.Errorf("renewal: %w", err)
	}
	if err := writeIdentityFile(dataDir, id); err != nil {
		return nil, fmt.Errorf("renewal: store the renewed identity: %w", err)
	}
	return id, nil
}

// FinishRenewal completes on disk a renewal a crash interrupted after its
// certificate was stored, and returns the renewed identity; nil when there is
// none to finish.
func FinishRenewal(dataDir string, keys KeyStore) (*Identity, error) {
	data, err := readLimited(filepath.Join(dataDir, IdentityFile), MaxIdentitySize, false)
	if err != nil {
		return nil, err
	}
	id, err := DecodeIdentity(data)
	if err != nil {
		return nil, err
	}
	p := loadPending(filepath.Join(dataDir, KeyFile), filepath.Join(dataDir, KeyNextFile), id, keys)
	if p == nil {
		return nil, nil
	}
	return finish(dataDir, p, nil)
}

// post sends the renewal over mutual TLS with cur. Network trouble and a busy
// control plane are transient errors; an answer with an error body a refusal.
func (r *Renewer) post(ctx context.Context, cur *Identity, csrPEM []byte) (*protocol.JoinResponse, error) {
	tlsCfg, err := ClientTLSConfig(cur, r.ServingCAPin, r.ServerName)
	if err != nil {
		return nil, fmt.Errorf("renewal: %w", err)
	}
	proxy, err := ProxyFor(r.Proxy, r.GatewayURL)
	if err != nil {
		return nil, fmt.Errorf("renewal: %w", err)
	}
	tr := &http.Transport{
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: 15 * time.Second,
		DialContext:         ProxyDialer(proxy, &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: 60 * time.Second, Transport: tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	body, err := json.Marshal(protocol.RenewRequest{ProtocolVersion: protocol.Version, CSR: string(csrPEM), DaemonVersion: version.Version})
	if err != nil {
		return nil, err
	}
	u := strings.TrimRight(r.GatewayURL, "/") + protocol.PathRenew
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("renewal: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", u, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxRenewAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("POST %s: reading the answer: %w", u, err)
	}
	if len(data) > maxRenewAnswer {
		return nil, fmt.Errorf("POST %s: the answer is over %d bytes", u, maxRenewAnswer)
	}
	if resp.StatusCode != http.StatusOK {
		var e protocol.ErrorResponse
		parsed := json.Unmarshal(data, &e) == nil && e.Code != ""
		switch {
		case parsed && !e.Retryable && resp.StatusCode < 500 && resp.StatusCode != http.StatusTooManyRequests:
			return nil, &RenewalRefusedError{Status: resp.StatusCode, Response: e}
		case parsed:
			return nil, fmt.Errorf("POST %s: HTTP %d: %w", u, resp.StatusCode, &e)
		}
		return nil, fmt.Errorf("POST %s: HTTP %d", u, resp.StatusCode)
	}
	var jr protocol.JoinResponse
	if err := json.Unmarshal(data, &jr); err != nil {
		return nil, fmt.Errorf("POST %s: the answer is not a join response: %w", u, err)
	}
	return &jr, nil
}
