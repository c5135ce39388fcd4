package agenttest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Token is what a join token grants.
type Token struct {
	Role, Site, Pool string
	// NodeID, when set, is the node the token joins as (a provisioned node).
	NodeID string
}

// Nonce is a boot nonce the site minted for a machine: what the discovery attestor
// accepts once, from a join whose claims list MAC.
type Nonce struct {
	MAC, Site string
	// NodeID, when set, is the node the ramdisk joins as; else ramdisk_<n>.
	NodeID string
}

// Gateway is the fake. Set its hooks before the agent talks to it.
type Gateway struct {
	// URL is https://127.0.0.1:<port>.
	URL string
	// Bundle is the PKI the gateway serves and signs with.
	Bundle *pki.Bundle
	// Pins are the bundle's three pins.
	Pins pki.Pins
	// JWK is the join encryption public key as join-encryption.jwk holds it.
	JWK []byte
	// Server is the running test server.
	Server *httptest.Server

	// Tokens are the valid join tokens; each may be used once.
	Tokens map[string]Token
	// Nonces are the valid boot nonces for discovery joins; each may be used once
	// (a deferred join does not use it up).
	Nonces map[string]Nonce
	// Defer answers that many join requests with a deferral first.
	Defer int
	// Unavailable answers that many join requests with 503 UNAVAILABLE first.
	Unavailable int
	// NonceUnknown answers that many discovery joins with 401 NONCE_UNKNOWN
	// first, as serve does while the site's boot.nonce event is on its way;
	// retryable, as serve marks it, unless NonceUnknownUnflagged.
	NonceUnknown          int
	NonceUnknownUnflagged bool
	// Tamper, if set, may change a join result before it is signed.
	Tamper func(*protocol.JoinResult)
	// TamperResponse, if set, may change the whole response after signing.
	TamperResponse func(*protocol.JoinResponse)
	// OnSession, if set, drives a session after the gateway has read Hello and
	// sent Welcome (with WelcomeFor); nil acknowledges everything until the agent
	// hangs up.
	OnSession func(ctx context.Context, c *Conn)
	// WelcomeFor, if set, builds the Welcome for a Hello.
	WelcomeFor func(protocol.Hello) protocol.Welcome

	mu        sync.Mutex
	joins     []protocol.JoinRequest
	hellos    []protocol.Hello
	nextNode  int
	sessionsN int
}

// New starts a gateway on 127.0.0.1 with a new PKI bundle, closed when t ends.
func New(t testing.TB) *Gateway {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := pki.LoadBundle(dir)
	if err != nil {
		t.Fatal(err)
	}
	return NewFromBundle(t, b)
}

// NewFromBundle starts a gateway serving and signing with b.
func NewFromBundle(t testing.TB, b *pki.Bundle) *Gateway {
	t.Helper()
	cert, err := b.IssueServingCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	g := &Gateway{Bundle: b, Pins: b.Public.Pins(), JWK: b.Public.JoinEncryptionJWK, Tokens: map[string]Token{}, Nonces: map[string]Nonce{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.PathJoin, g.join)
	mux.HandleFunc("GET "+protocol.PathSession, g.session)
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    b.Public.NodeCAPool(),
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	g.Server = srv
	g.URL = srv.URL
	return g
}

// ServingCertPEM is the serving CA certificate, for a test that must trust it as a
// system root (SSL_CERT_FILE).
func (g *Gateway) ServingCertPEM() []byte { return []byte(g.Bundle.Public.ServingCAPEM) }

// Joins returns the join requests received so far.
func (g *Gateway) Joins() []protocol.JoinRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]protocol.JoinRequest(nil), g.joins...)
}

// Hellos returns the Hello frames received so far.
func (g *Gateway) Hellos() []protocol.Hello {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]protocol.Hello(nil), g.hellos...)
}

// Sessions counts the sessions that reached Welcome.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessionsN
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func refuse(w http.ResponseWriter, status int, code, msg string, retryable bool) {
	writeJSON(w, status, protocol.ErrorResponse{Code: code, Message: msg, Retryable: retryable})
}

func (g *Gateway) join(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, protocol.MaxJoinRequestSize))
	if err != nil {
		refuse(w, 400, protocol.CodeInvalidInput, err.Error(), false)
		return
	}
	var req protocol.JoinRequest
	if err := json.Unmarshal(body, &req); err != nil {
		refuse(w, 400, protocol.CodeInvalidInput, "body is not a join request", false)
		return
	}
	g.mu.Lock()
	g.joins = append(g.joins, req)
	deferNow := g.Defer > 0
	if deferNow {
		g.Defer--
	}
	unavailable := !deferNow && g.Unavailable > 0
	if unavailable {
		g.Unavailable--
	}
	g.mu.Unlock()
	if unavailable {
		refuse(w, 503, protocol.CodeUnavailable, "join service is starting", true)
		return
	}
	if deferNow {
		writeJSON(w, 200, protocol.JoinResponse{RetryAfterS: 1})
		return
	}
	csr, err := pki.ParseCSRPEM([]byte(req.CSR))
	if err != nil {
		refuse(w, 400, protocol.CodeInvalidInput, err.Error(), false)
		return
	}
	if req.Attestor == protocol.AttestorDiscovery {
		g.discover(w, req, csr)
		return
	}
	plain, err := pki.Open(g.Bundle.JoinEncryptionKey, req.SealedToken)
	if err != nil {
		refuse(w, 400, protocol.CodeInvalidInput, "sealed token does not open", false)
		return
	}
	var st protocol.SealedToken
	if err := json.Unmarshal(plain, &st); err != nil {
		refuse(w, 400, protocol.CodeInvalidInput, "sealed token is not JSON", false)
		return
	}
	if st.CSRSHA256 != pki.CSRSHA256(csr.Raw) {
		refuse(w, 400, protocol.CodeInvalidInput, "sealed token is for another CSR", false)
		return
	}
	g.mu.Lock()
	tok, ok := g.Tokens[st.Token]
	delete(g.Tokens, st.Token)
	nodeID := tok.NodeID
	if nodeID == "" {
		g.nextNode++
		nodeID = fmt.Sprintf("node_%d", g.nextNode)
	}
	g.mu.Unlock()
	switch {
	case !ok:
		refuse(w, 401, protocol.CodeTokenUnknown, "the join token is not known", false)
		return
	case tok.Role != req.Role:
		refuse(w, 403, protocol.CodeWrongRole, "the token is for role "+tok.Role, false)
		return
	case req.Attestor == protocol.AttestorProvisioned && req.NodeID != nodeID:
		refuse(w, 403, protocol.CodeAttestorRefused, "the token is for another node", false)
		return
	}
	g.issue(w, req, csr, nodeID, tok.Site, tok.Pool)
}

// discover is the discovery attestor: a ramdisk with a nonce the site minted for
// one of its MACs.
func (g *Gateway) discover(w http.ResponseWriter, req protocol.JoinRequest, csr *x509.CertificateRequest) {
	if req.Role != protocol.RoleRamdisk {
		refuse(w, 403, protocol.CodeWrongRole, "discovery joins role ramdisk only", false)
		return
	}
	if req.SealedToken != "" {
		refuse(w, 400, protocol.CodeInvalidInput, "a discovery join carries no token", false)
		return
	}
	g.mu.Lock()
	unknown := g.NonceUnknown > 0
	if unknown {
		g.NonceUnknown--
	}
	g.mu.Unlock()
	if unknown {
		refuse(w, 401, protocol.CodeNonceUnknown, "no site agent reported this boot nonce (yet)", !g.NonceUnknownUnflagged)
		return
	}
	g.mu.Lock()
	n, ok := g.Nonces[req.BootNonce]
	match := false
	for _, m := range req.Claims.MACs {
		match = match || m == n.MAC
	}
	if ok && match {
		delete(g.Nonces, req.BootNonce)
	}
	nodeID := n.NodeID
	if nodeID == "" {
		g.nextNode++
		nodeID = fmt.Sprintf("ramdisk_%d", g.nextNode)
	}
	g.mu.Unlock()
	if !ok || !match {
		refuse(w, 403, protocol.CodeAttestorRefused, "no boot nonce was minted for this machine", false)
		return
	}
	g.issue(w, req, csr, nodeID, n.Site, "")
}

// issue answers a join that passed its attestor with a signed result.
func (g *Gateway) issue(w http.ResponseWriter, req protocol.JoinRequest, csr *x509.CertificateRequest, nodeID, site, pool string) {
	der, err := g.Bundle.IssueNodeCert(csr, req.Role, nodeID, 24*time.Hour)
	if err != nil {
		refuse(w, 500, protocol.CodeInternal, err.Error(), false)
		return
	}
	res := protocol.JoinResult{
		ProtocolVersion: protocol.Version,
		NodeID:          nodeID,
		Role:            req.Role,
		Site:            site,
		Pool:            pool,
		SPIFFEID:        pki.SPIFFEID(g.Bundle.Public.TrustDomain, req.Role, nodeID),
		CSRSHA256:       pki.CSRSHA256(csr.Raw),
		CertChain:       []string{string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))},
		TrustBundle:     []string{g.Bundle.Public.NodeCAPEM, g.Bundle.Public.ServingCAPEM},
		IssuedAt:        time.Now().Unix(),
	}
	if g.Tamper != nil {
		g.Tamper(&res)
	}
	payload, _ := json.Marshal(res)
	signed, err := pki.Sign(g.Bundle.JoinSigningKey, protocol.PurposeJoinResponse, payload)
	if err != nil {
		refuse(w, 500, protocol.CodeInternal, err.Error(), false)
		return
	}
	resp := protocol.JoinResponse{Signed: signed, SigningKey: g.Bundle.Public.JoinSigningPublicPEM}
	if g.TamperResponse != nil {
		g.TamperResponse(&resp)
	}
	writeJSON(w, 200, resp)
}

// Conn is one session as the gateway sees it.
type Conn struct {
	// Hello is the agent's first frame.
	Hello protocol.Hello
	// Peer is the node certificate the agent presented.
	Peer *x509.Certificate
	ws   *websocket.Conn
}

// Send writes a frame of type typ.
func (c *Conn) Send(ctx context.Context, typ string, v any) error {
	f, err := protocol.NewFrame(typ, v)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(f)
	return c.ws.Write(ctx, websocket.MessageText, b)
}

// Read returns the next frame.
func (c *Conn) Read(ctx context.Context) (protocol.Frame, error) {
	_, data, err := c.ws.Read(ctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	var f protocol.Frame
	err = json.Unmarshal(data, &f)
	return f, err
}

// Seq returns the seq of a Status or Event frame.
func Seq(f protocol.Frame) uint64 {
	var v struct {
		Seq uint64 `json:"seq"`
	}
	_ = json.Unmarshal(f.Data, &v)
	return v.Seq
}

// Close ends the session from the gateway's side.
func (c *Conn) Close() { c.ws.Close(websocket.StatusGoingAway, "gateway going away") }

func (g *Gateway) session(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		refuse(w, 401, protocol.CodeUnauthenticated, "a session needs the node certificate", false)
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer ws.CloseNow()
	ctx := r.Context()
	c := &Conn{ws: ws, Peer: r.TLS.PeerCertificates[0]}
	f, err := c.Read(ctx)
	if err != nil || f.Type != protocol.FrameHello {
		return
	}
	if err := f.Decode(&c.Hello); err != nil {
		return
	}
	welcome := protocol.Welcome{ServerTime: time.Now().UTC(), MinProtocolVersion: protocol.MinVersion, NodeState: protocol.NodeReady}
	if g.WelcomeFor != nil {
		welcome = g.WelcomeFor(c.Hello)
	}
	g.mu.Lock()
	g.hellos = append(g.hellos, c.Hello)
	g.sessionsN++
	g.mu.Unlock()
	if err := c.Send(ctx, protocol.FrameWelcome, welcome); err != nil {
		return
	}
	if g.OnSession != nil {
		g.OnSession(ctx, c)
		return
	}
	AckAll(ctx, c, nil)
}

// AckAll acknowledges every Status and Event until the connection ends, passing
// each frame to seen when it is set.
func AckAll(ctx context.Context, c *Conn, seen func(protocol.Frame)) {
	for {
		f, err := c.Read(ctx)
		if err != nil {
			return
		}
		if seen != nil {
			seen(f)
		}
		if f.Type == protocol.FrameStatus || f.Type == protocol.FrameEvent {
			if err := c.Send(ctx, protocol.FrameAck, protocol.Ack{Seq: Seq(f)}); err != nil {
				return
			}
		}
	}
}

// WriteConfig writes a config.toml for this gateway into dir and the JWK beside it,
// and returns the config path.
func (g *Gateway) WriteConfig(t testing.TB, dir, dataDir string) string {
	t.Helper()
	cfg := fmt.Sprintf("gateway_url = %q\nsite = \"fsn1\"\n%sdata_dir = %q\nsocket_path = %q\n",
		g.URL, g.Pins.ConfigLines(), dataDir, filepath.Join(dataDir, "bcd.sock"))
	path := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "join-encryption.jwk"), g.JWK, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// WellKnown is the document a control plane publishes for this gateway.
func (g *Gateway) WellKnown() protocol.WellKnown {
	return protocol.WellKnown{
		Gateway: &protocol.WellKnownGateway{URL: g.URL, ServingCAPin: g.Pins.ServingCA},
		Join: protocol.WellKnownJoin{
			EncryptionJWK:    json.RawMessage(g.JWK),
			EncryptionKeyPin: g.Pins.JoinEncryption,
			SigningKeyPin:    g.Pins.JoinSigning,
		},
	}
}

// API starts an api server on 127.0.0.1 with a certificate from the gateway's
// serving CA. h answers every request; nil serves WellKnown at the well-known path.
func (g *Gateway) API(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	cert, err := g.Bundle.IssueServingCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if h == nil {
		doc := g.WellKnown()
		mux := http.NewServeMux()
		mux.HandleFunc("GET "+protocol.PathWellKnown, func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 200, doc)
		})
		h = mux
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// RootPool trusts the serving CA, as SSL_CERT_FILE would.
func (g *Gateway) RootPool() *x509.CertPool { return g.Bundle.Public.ServingCAPool() }

// Identity issues a node certificate from the gateway's node CA and stores it with
// its key in dataDir, as a join would, and returns it loaded.
func (g *Gateway) Identity(t testing.TB, dataDir, role, nodeID string) *agent.Identity {
	t.Helper()
	key, csrPEM, err := pki.NewKeyAndCSR()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.ParseCSRPEM(csrPEM)
	if err != nil {
		t.Fatal(err)
	}
	der, err := g.Bundle.IssueNodeCert(csr, role, nodeID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	id := &agent.Identity{
		NodeID:      nodeID,
		Role:        role,
		Site:        "fsn1",
		SPIFFEID:    pki.SPIFFEID(g.Bundle.Public.TrustDomain, role, nodeID),
		CertChain:   string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		TrustBundle: g.Bundle.Public.NodeCAPEM + g.Bundle.Public.ServingCAPEM,
		GatewayURL:  g.URL,
		JoinedAt:    time.Now().UTC(),
	}
	file, err := pki.MarshalPKCS8PEM(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.SaveIdentity(dataDir, id, &agent.NodeKey{Signer: key, File: file}); err != nil {
		t.Fatal(err)
	}
	loaded, err := agent.LoadIdentity(dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return loaded
}
