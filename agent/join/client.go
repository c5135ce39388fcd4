package join

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of Client's tunables.
const (
	DefaultGiveUpAfter = 10 * time.Minute
	DefaultMaxDeferral = 5 * time.Minute
	// maxResponseSize bounds a join response: a JWS is at most pki.MaxJWSSize.
	maxResponseSize = pki.MaxJWSSize + 64<<10
	requestTimeout  = 60 * time.Second
	// maxTPMChallenges bounds the challenges one tpm join answers: one is
	// expected, a second only after a deferral.
	maxTPMChallenges = 4
)

// Request is what a join asks for.
type Request struct {
	// Role is node, site or ramdisk.
	Role string
	// Attestor is protocol.AttestorJoinToken, AttestorProvisioned,
	// AttestorDiscovery or AttestorTPM.
	Attestor string
	// Token is the join token (join-token and provisioned). It is only ever
	// sealed, never sent or logged in the clear.
	Token string
	// NodeID is the node a provisioned join claims.
	NodeID string
	// BootNonce is the discovery nonce.
	BootNonce string
	// Site is config.toml's site; a token for another site is refused.
	Site string
	// Claims describe the hardware.
	Claims protocol.Claims
	// TPM is the tpm attestor's evidence; Join fills it in with Client.TPM.
	TPM *protocol.TPMAttestation
	// Witness is the discovery join's countersignature; Join fills it in
	// with Client.Witness.
	Witness *protocol.BootWitness
	// Reclaim, when set, is the key of a node this machine was (the
	// identity bcd join --reset moved aside): each attempt carries its
	// protocol.ReclaimProof for the CSR, so that a join whose claims match
	// that node may take it over.
	Reclaim *ReclaimKey
}

// ReclaimKey is an earlier node's id and key.
type ReclaimKey struct {
	NodeID string
	Key    crypto.Signer
}

// RefusedError is a join the control plane refused and that retrying will not fix.
type RefusedError struct {
	// Status is the HTTP status.
	Status int
	// Response is the gateway's error body.
	Response protocol.ErrorResponse
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the control plane refused the join: %s: %s", e.Response.Code, e.Response.Message)
}

// Client joins through one gateway. The zero value of each tunable is the daemon's
// default; tests shorten them.
type Client struct {
	// GatewayURL is gateway_url; ServerName the name its certificate must carry.
	GatewayURL, ServerName string
	// Pins are the three pins from the install.
	Pins pki.Pins
	// EncryptionKey is the join encryption key; the caller has checked it against
	// Pins.JoinEncryption (pki.JWKMatchesPin), and Join checks again.
	EncryptionKey *ecdsa.PublicKey
	// Backoff spaces retries after a retryable error.
	Backoff agent.Backoff
	// GiveUpAfter ends retrying after this long without an answer that is not a
	// retryable error; 0 means DefaultGiveUpAfter.
	GiveUpAfter time.Duration
	// MaxDeferral caps the wait a deferral asks for; 0 means DefaultMaxDeferral.
	MaxDeferral time.Duration
	// Logger receives retries and deferrals; nil discards them.
	Logger *slog.Logger
	// Proxy, when set, is an HTTP proxy (http://host:port) the join reaches the
	// gateway through with CONNECT (the ramdisk's bcd.proxy).
	Proxy *url.URL
	// OnDeferral, if set, is called before each wait a deferral asks for, with the
	// wait and the number of deferrals so far: the ramdisk tells its console that
	// the machine waits for an operator's approval.
	OnDeferral func(wait time.Duration, deferrals int)
	// Keys makes the node key; nil is agent.PKCS8Keys.
	Keys agent.KeyStore
	// TPM proves a tpm join: required with protocol.AttestorTPM (Keys must
	// then make the node key in the same TPM). With protocol.AttestorDiscovery
	// it is optional: the ramdisk's join then carries the TPM's evidence and
	// answers the challenge of a control plane whose machine has the TPM's
	// EK enrolled.
	TPM TPMProver
	// Witness, if set, gets the site agent's countersignature of a discovery
	// join for the CSR's SHA-256 (lowercase hex), once per key.
	Witness func(ctx context.Context, csrSHA256 string) (*protocol.BootWitness, error)
}

// TPMProver is the TPM's part of a tpm join (nodekey.Host): round one's
// evidence for the node key, and the secret of the control plane's challenge.
type TPMProver interface {
	// Evidence certifies key (made in the TPM) with csrSHA256, the raw
	// digest of the CSR's DER, as qualifying data.
	Evidence(key crypto.Signer, csrSHA256 []byte) (*protocol.TPMAttestation, error)
	// Activate recovers the challenge's secret (TPM2_ActivateCredential).
	Activate(ch *protocol.TPMChallenge) ([]byte, error)
}

func (c *Client) log() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// Join makes a key (with Keys) and CSR and runs the join to its end: a verified
// identity and its key (not yet saved), a refusal, or an error after retries.
func (c *Client) Join(ctx context.Context, req Request) (*agent.Identity, *agent.NodeKey, error) {
	if err := checkRequest(req); err != nil {
		return nil, nil, err
	}
	// Only a token is sealed: a discovery join carries nothing secret, so it needs
	// no encryption key (the ramdisk has only the pin).
	if req.Token != "" {
		if err := pki.MatchPin(c.Pins.JoinEncryption, c.EncryptionKey); err != nil {
			return nil, nil, fmt.Errorf("refusing to seal the token: the join encryption key does not match join_encryption_key_pin: %w", err)
		}
	}
	tlsCfg, err := agent.PinnedTLSConfig(c.Pins.ServingCA, c.ServerName)
	if err != nil {
		return nil, nil, err
	}
	proxy, err := agent.ProxyFor(c.Proxy, c.GatewayURL)
	if err != nil {
		return nil, nil, err
	}
	client := &http.Client{
		Timeout: requestTimeout,
		Transport: &http.Transport{
			TLSClientConfig:     tlsCfg,
			TLSHandshakeTimeout: 15 * time.Second,
			DialContext:         agent.ProxyDialer(proxy, &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
		},
		// A join answers itself; a redirect would take the request somewhere
		// the pin was not meant for.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer client.CloseIdleConnections()

	key, err := agent.NewNodeKey(c.Keys)
	if err != nil {
		return nil, nil, fmt.Errorf("join: %w", err)
	}
	csrPEM, err := pki.NewCSR(key.Signer)
	if err != nil {
		return nil, nil, fmt.Errorf("join: %w", err)
	}
	blk, _ := pem.Decode(csrPEM)
	if blk == nil {
		return nil, nil, errors.New("join: the CSR does not encode")
	}
	csrSHA := pki.CSRSHA256(blk.Bytes)
	digest := sha256.Sum256(blk.Bytes)
	switch {
	case req.Attestor == protocol.AttestorTPM:
		if c.TPM == nil {
			return nil, nil, errors.New("join: the tpm attestor needs the TPM")
		}
		if req.TPM, err = c.TPM.Evidence(key.Signer, digest[:]); err != nil {
			return nil, nil, fmt.Errorf("join: %w", err)
		}
	case req.Attestor == protocol.AttestorDiscovery && c.TPM != nil:
		// A ramdisk with a TPM sends its evidence: the control plane
		// challenges it for a machine whose EK is enrolled, and admits no
		// ramdisk of such a machine without it. Without evidence the join
		// goes on: a machine without an enrolled EK needs none.
		ev, err := c.TPM.Evidence(key.Signer, digest[:])
		if err != nil {
			c.log().Warn("the TPM gives no evidence for this join; joining without it (a machine whose TPM is enrolled refuses such a ramdisk)", "error", err.Error())
			break
		}
		req.TPM = ev
		if ek, err := base64.StdEncoding.DecodeString(ev.EKPublic); err == nil {
			// The claims name the EK the evidence proves.
			req.Claims.TPMEK = string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ek}))
		}
	}
	if c.Witness != nil {
		if req.Witness, err = c.Witness(ctx, csrSHA); err != nil {
			return nil, nil, fmt.Errorf("join: %w", err)
		}
	}

	giveUp := c.GiveUpAfter
	if giveUp <= 0 {
		giveUp = DefaultGiveUpAfter
	}
	maxDefer := c.MaxDeferral
	if maxDefer <= 0 {
		maxDefer = DefaultMaxDeferral
	}
	failingSince := time.Time{}
	attempt, deferrals, challenges := 0, 0, 0
	for {
		// Sealed afresh for each attempt so its iat is current; the CSR stays
		// the same, so a deferred join picks up where it was approved.
		body, err := c.request(req, string(csrPEM), csrSHA)
		if err != nil {
			return nil, nil, err
		}
		resp, err := c.post(ctx, client, body)
		var retry *retryableError
		switch {
		case err == nil && resp.Signed == "" && resp.TPMChallenge != nil:
			// Round two of a tpm join: only the TPM with the EK and the AK
			// recovers the secret.
			if req.TPM == nil {
				return nil, nil, errors.New("refusing the join response: a TPM challenge to a join that is not tpm")
			}
			if challenges++; challenges > maxTPMChallenges {
				return nil, nil, fmt.Errorf("refusing the join response: %d TPM challenges in a row", challenges)
			}
			secret, err := c.TPM.Activate(resp.TPMChallenge)
			if err != nil {
				return nil, nil, fmt.Errorf("join: %w", err)
			}
			next := *req.TPM
			next.ChallengeID, next.Secret = resp.TPMChallenge.ID, base64.StdEncoding.EncodeToString(secret)
			req.TPM = &next
			c.log().Info("answered the control plane's TPM challenge; joining with it")
			continue
		case err == nil && resp.Signed == "" && resp.RetryAfterS > 0:
			if req.TPM != nil {
				// A deferred tpm join starts again at round one: a challenge's
				// life is short, an approval may take longer.
				first := *req.TPM
				first.ChallengeID, first.Secret = "", ""
				req.TPM = &first
				challenges = 0
			}
			failingSince, attempt = time.Time{}, 0
			d := time.Duration(resp.RetryAfterS) * time.Second
			if d > maxDefer {
				d = maxDefer
			}
			deferrals++
			c.log().Info("the control plane deferred the join; asking again with the same CSR", "retry_in", d.String())
			if c.OnDeferral != nil {
				c.OnDeferral(d, deferrals)
			}
			if !agent.Sleep(ctx, d) {
				return nil, nil, ctx.Err()
			}
			continue
		case err == nil:
			id, err := c.verify(resp, req, key.Signer.Public(), csrSHA)
			if err != nil {
				return nil, nil, fmt.Errorf("refusing the join response: %w", err)
			}
			return id, key, nil
		case req.Reclaim != nil && unknownReclaimProof(err):
			// A control plane older than reclaim_proof refuses the field; it
			// reclaims on the claims alone, so join without the proof.
			c.log().Warn("the control plane does not know reclaim_proof (it is older than this bcd); joining without the proof of the node's key",
				"node", req.Reclaim.NodeID)
			req.Reclaim = nil
			continue
		case errors.As(err, &retry):
			if failingSince.IsZero() {
				failingSince = time.Now()
			}
			if time.Since(failingSince) >= giveUp {
				return nil, nil, fmt.Errorf("giving up after %s of retries: %w", giveUp, retry.err)
			}
			d := c.Backoff.Delay(attempt)
			attempt++
			c.log().Warn("join failed; retrying", "error", retry.err.Error(), "retry_in", d.Round(time.Millisecond).String())
			if !agent.Sleep(ctx, d) {
				return nil, nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), retry.err)
			}
		default:
			return nil, nil, err
		}
	}
}

// unknownReclaimProof reports whether err is a control plane's refusal of
// reclaim_proof as a field it does not know.
func unknownReclaimProof(err error) bool {
	var r *RefusedError
	return errors.As(err, &r) && r.Response.Code == protocol.CodeInvalidInput &&
		strings.Contains(r.Response.Message, `unknown field "reclaim_proof"`)
}

// checkRequest refuses a request whose attestor and credentials do not go together,
// before a key is made or anything is sent. The ramdisk role joins only through
// discovery: a boot nonce and its MACs, no token.
func checkRequest(req Request) error {
	switch req.Attestor {
	case protocol.AttestorDiscovery:
		switch {
		case req.Role != protocol.RoleRamdisk:
			return fmt.Errorf("join: the discovery attestor joins role ramdisk, not %q", req.Role)
		case req.BootNonce == "":
			return errors.New("join: the discovery attestor needs the boot nonce")
		case req.Token != "":
			return errors.New("join: the discovery attestor takes no token")
		case len(req.Claims.MACs) == 0:
			return errors.New("join: the discovery attestor needs the machine's MACs in the claims")
		}
	case protocol.AttestorTPM:
		switch {
		case req.Role != protocol.RoleNode:
			return fmt.Errorf("join: the tpm attestor joins role node, not %q", req.Role)
		case req.Token != "":
			return errors.New("join: the tpm attestor takes no token")
		}
	default:
		if req.Role == protocol.RoleRamdisk {
			return fmt.Errorf("join: role ramdisk joins with the discovery attestor, not %q", req.Attestor)
		}
	}
	return nil
}

func (c *Client) request(req Request, csrPEM, csrSHA string) ([]byte, error) {
	jr := protocol.JoinRequest{
		ProtocolVersion: protocol.Version,
		CSR:             csrPEM,
		Role:            req.Role,
		Attestor:        req.Attestor,
		Claims:          req.Claims,
		NodeID:          req.NodeID,
		BootNonce:       req.BootNonce,
		Site:            req.Site,
		DaemonVersion:   version.Version,
		TPM:             req.TPM,
		Witness:         req.Witness,
	}
	if req.Reclaim != nil {
		var err error
		if jr.ReclaimProof, err = protocol.SignReclaimProof(req.Reclaim.Key, req.Reclaim.NodeID, csrSHA, time.Now()); err != nil {
			return nil, fmt.Errorf("join: %w", err)
		}
	}
	if req.Token != "" {
		plain, err := json.Marshal(protocol.SealedToken{Token: req.Token, CSRSHA256: csrSHA, IssuedAt: time.Now().Unix()})
		if err != nil {
			return nil, fmt.Errorf("join: seal the token: %w", err)
		}
		jr.SealedToken, err = pki.Seal(c.EncryptionKey, plain)
		if err != nil {
			return nil, fmt.Errorf("join: %w", err)
		}
	}
	return json.Marshal(jr)
}

type retryableError struct{ err error }

func (e *retryableError) Error() string { return e.err.Error() }
func (e *retryableError) Unwrap() error { return e.err }

// post sends one join request. Network trouble and a busy control plane are
// retryable; a certificate that fails the pin and a refusal are not.
func (c *Client) post(ctx context.Context, client *http.Client, body []byte) (*protocol.JoinResponse, error) {
	url := strings.TrimRight(c.GatewayURL, "/") + protocol.PathJoin
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(hreq)
	if err != nil {
		var te *agent.TrustError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("refusing to join through %s: %w", c.GatewayURL, te)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &retryableError{fmt.Errorf("POST %s: %w", url, err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseSize+1))
	if err != nil {
		return nil, &retryableError{fmt.Errorf("POST %s: reading the answer: %w", url, err)}
	}
	if len(data) > maxResponseSize {
		return nil, fmt.Errorf("POST %s: the answer is over %d bytes", url, maxResponseSize)
	}
	if resp.StatusCode != http.StatusOK {
		var e protocol.ErrorResponse
		parsed := json.Unmarshal(data, &e) == nil && e.Code != ""
		busy := resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusTooManyRequests ||
			resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout
		switch {
		case parsed && (e.Retryable || busy):
			return nil, &retryableError{fmt.Errorf("HTTP %d: %w", resp.StatusCode, &e)}
		case parsed:
			return nil, &RefusedError{Status: resp.StatusCode, Response: e}
		case busy || resp.StatusCode >= 500:
			return nil, &retryableError{fmt.Errorf("POST %s: HTTP %d", url, resp.StatusCode)}
		}
		return nil, fmt.Errorf("POST %s: HTTP %d without an error body (is gateway_url the gateway?)", url, resp.StatusCode)
	}
	var jr protocol.JoinResponse
	if err := json.Unmarshal(data, &jr); err != nil {
		return nil, fmt.Errorf("POST %s: the answer is not a join response: %w", url, err)
	}
	return &jr, nil
}

// verify checks the signed result under the pinned signing key and that it is ours.
func (c *Client) verify(resp *protocol.JoinResponse, req Request, pub crypto.PublicKey, csrSHA string) (*agent.Identity, error) {
	id, err := agent.VerifyJoinResponse(resp, c.Pins.JoinSigning, agent.JoinExpectation{
		CSRSHA256: csrSHA, Role: req.Role, NodeID: req.NodeID, Key: pub,
	})
	if err != nil {
		return nil, err
	}
	id.GatewayURL, id.ServerName, id.JoinedAt = c.GatewayURL, c.ServerName, time.Now().UTC()
	return id, nil
}
