package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

func newPKI(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(dir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startServer starts a control plane on loopback ports chosen by the kernel.
func startServer(t testing.TB, pkiDir, dataDir string, mut func(*Server)) (*Server, *syncbuf.Buffer) {
	t.Helper()
	out := &syncbuf.Buffer{}
	s := &Server{PKIDir: pkiDir, DataDir: dataDir, APIListen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", Out: out}
	if mut != nil {
		mut(s)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		s.Shutdown(c)
	})
	return s, out
}

var (
	apiLine     = regexp.MustCompile(`(?m)^api listening on (https://127\.0\.0\.1:[1-9][0-9]*)$`)
	gatewayLine = regexp.MustCompile(`(?m)^gateway listening on (https://127\.0\.0\.1:[1-9][0-9]*)$`)
	opToken     = regexp.MustCompile(`bcop_[a-z2-7]{52}`)
)

func TestServePrintsListenersAndTheOperatorTokenOnce(t *testing.T) {
	pkiDir, data := newPKI(t), filepath.Join(t.TempDir(), "data")
	s, out := startServer(t, pkiDir, data, nil)
	text := out.String()
	if m := apiLine.FindStringSubmatch(text); m == nil || m[1] != s.APIURL() {
		t.Errorf("no api line for %s in:\n%s", s.APIURL(), text)
	}
	if !gatewayLine.MatchString(text) {
		t.Errorf("no gateway line in:\n%s", text)
	}
	if got := opToken.FindAllString(text, -1); len(got) != 1 {
		t.Fatalf("first start printed %d operator tokens:\n%s", len(got), text)
	}
	fi, err := os.Stat(data)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("data directory: %v mode %v, want 0700", err, fi.Mode().Perm())
	}
	s.Shutdown(ctx)

	_, out2 := startServer(t, pkiDir, data, nil)
	if opToken.MatchString(out2.String()) || strings.Contains(out2.String(), "operator token") {
		t.Errorf("second start printed the operator token again:\n%s", out2.String())
	}
	if !apiLine.MatchString(out2.String()) {
		t.Errorf("second start: no api line:\n%s", out2.String())
	}
}

func TestOperatorTokenFile(t *testing.T) {
	pkiDir, data := newPKI(t), filepath.Join(t.TempDir(), "data")
	file := filepath.Join(t.TempDir(), "operator-token")
	s, out := startServer(t, pkiDir, data, func(s *Server) { s.OperatorTokenFile = file })
	if opToken.MatchString(out.String()) {
		t.Errorf("the token was printed although --operator-token-file was given:\n%s", out.String())
	}
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("token file mode %o, want 0600", fi.Mode().Perm())
	}
	b, _ := os.ReadFile(file)
	tok := strings.TrimSpace(string(b))
	if !opToken.MatchString(tok) {
		t.Fatalf("token file holds %q", tok)
	}
	c, err := client.New(s.APIURL(), tok, s.Bundle().Public.ServingCAPool())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListNodes(ctx); err != nil {
		t.Errorf("the written token does not work: %v", err)
	}
	s.Shutdown(ctx)
	os.Remove(file)
	startServer(t, pkiDir, data, func(s *Server) { s.OperatorTokenFile = file })
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("second start wrote the token file again: %v", err)
	}
}

func TestStartRefuses(t *testing.T) {
	pkiDir := newPKI(t)
	for name, s := range map[string]*Server{
		"no pki":         {DataDir: t.TempDir()},
		"no data":        {PKIDir: pkiDir},
		"half tls":       {PKIDir: pkiDir, DataDir: t.TempDir(), TLSCertFile: "x"},
		"bad base path":  {PKIDir: pkiDir, DataDir: t.TempDir(), BasePath: "p/"},
		"http gateway":   {PKIDir: pkiDir, DataDir: t.TempDir(), GatewayURL: "http://127.0.0.1:1", APIListen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0"},
		"missing pki":    {PKIDir: filepath.Join(t.TempDir(), "nope"), DataDir: t.TempDir()},
		"downloads gone": {PKIDir: pkiDir, DataDir: t.TempDir(), DownloadsDir: filepath.Join(t.TempDir(), "nope"), APIListen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0"},
	} {
		if err := s.Start(); err == nil {
			s.Shutdown(ctx)
			t.Errorf("%s: Start succeeded", name)
		}
	}
}

// operator returns an api client with the token the first start printed.
func operator(t testing.TB, s *Server, out *syncbuf.Buffer) *client.Client {
	t.Helper()
	tok := opToken.FindString(out.String())
	c, err := client.New(s.APIURL(), tok, s.Bundle().Public.ServingCAPool())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gatewayClient is how an agent reaches the gateway: the serving CA as the
// only root, and its certificate when it has one.
func gatewayClient(s *Server, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: s.Bundle().Public.ServingCAPool()}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}
}

func postJoin(t testing.TB, hc *http.Client, gw string, req *protocol.JoinRequest) (*protocol.JoinResponse, *protocol.ErrorResponse) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := hc.Post(gw+protocol.PathJoin, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		var e protocol.ErrorResponse
		json.Unmarshal(b, &e)
		return nil, &e
	}
	var jr protocol.JoinResponse
	if err := json.Unmarshal(b, &jr); err != nil {
		t.Fatal(err)
	}
	return &jr, nil
}

func TestEndToEnd(t *testing.T) {
	pkiDir := newPKI(t)
	dl := t.TempDir()
	os.WriteFile(filepath.Join(dl, "bcd_0.1.0_linux_arm64"), []byte("bcd"), 0o755)
	s, out := startServer(t, pkiDir, filepath.Join(t.TempDir(), "data"), func(s *Server) { s.DownloadsDir = dl; s.BasePath = "/p" })
	op := operator(t, s, out)
	pub := s.Bundle().Public

	// The well-known document, over TLS to the serving CA.
	hc := gatewayClient(s, nil)
	resp, err := hc.Get(strings.TrimSuffix(s.APIURL(), "/p") + protocol.PathWellKnown)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var wk protocol.WellKnown
	if err := json.Unmarshal(body, &wk); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("well-known: %v %s", err, body)
	}
	if len(body) > 4<<10 {
		t.Errorf("well-known document is %d bytes", len(body))
	}
	if wk.Gateway == nil || wk.Gateway.URL != s.AdvertisedGatewayURL() || wk.Gateway.ServingCAPin != pub.ServingCASPKIPin ||
		wk.Join.EncryptionKeyPin != pub.JoinEncryptionKeyPin || wk.Join.SigningKeyPin != pub.JoinSigningKeyPin {
		t.Errorf("well-known %s", body)
	}
	if _, err := pki.JWKMatchesPin(wk.Join.EncryptionJWK, pub.JoinEncryptionKeyPin); err != nil {
		t.Errorf("well-known JWK: %v", err)
	}
	// The serving chain is [leaf, serving CA].
	state := resp.TLS
	if len(state.PeerCertificates) != 2 || pki.CertPin(state.PeerCertificates[1]) != pub.ServingCASPKIPin {
		t.Errorf("serving chain has %d certificates", len(state.PeerCertificates))
	}
	resp, err = hc.Get(s.APIURL() + "/downloads/bcd/0.1.0/linux-arm64")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("download: %d", resp.StatusCode)
	}

	if _, err := op.CreateSite(ctx, "fsn1"); err != nil {
		t.Fatal(err)
	}
	created, err := op.CreateToken(ctx, apitype.TokenCreate{Pool: "pool_h100", Site: "fsn1", Role: "node"})
	if err != nil {
		t.Fatal(err)
	}
	a := cptest.NewAgent(t)
	jr, er := postJoin(t, hc, s.AdvertisedGatewayURL(), a.Request(t, s.Bundle(), "node", created.Token, func(r *protocol.JoinRequest) { r.Site = "fsn1" }))
	if er != nil {
		t.Fatalf("join refused: %+v", er)
	}
	res := a.Verify(t, s.Bundle(), jr)
	if res.Pool != "pool_h100" || res.Site != "fsn1" {
		t.Errorf("join result %+v", res)
	}
	// The token is spent.
	if _, er := postJoin(t, hc, s.AdvertisedGatewayURL(), cptest.NewAgent(t).Request(t, s.Bundle(), "node", created.Token, nil)); er == nil || er.Code != protocol.CodeTokenUsed {
		t.Errorf("second use of the token: %+v", er)
	}

	cert := a.ClientCert(t, res)
	ws, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(s.AdvertisedGatewayURL(), "https")+protocol.PathSession,
		&websocket.DialOptions{HTTPClient: gatewayClient(s, &cert)})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	send := func(typ string, v any) {
		f, _ := protocol.NewFrame(typ, v)
		b, _ := json.Marshal(f)
		if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(want string, v any) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, b, err := ws.Read(rctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", want, err)
		}
		var f protocol.Frame
		json.Unmarshal(b, &f)
		if f.Type != want {
			t.Fatalf("got %s %s, want %s", f.Type, f.Data, want)
		}
		if v != nil {
			f.Decode(v)
		}
	}
	send(protocol.FrameHello, protocol.Hello{ProtocolVersion: 1, NodeID: res.NodeID, Role: "node", DaemonVersion: "0.1.0", BootID: "b1"})
	var w protocol.Welcome
	recv(protocol.FrameWelcome, &w)
	if w.NodeState != protocol.NodeAdopting {
		t.Errorf("welcome state %s", w.NodeState)
	}
	var nodes []apitype.NodeInfo
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if nodes, err = op.ListNodes(ctx); err == nil && len(nodes) == 1 && nodes[0].Connected && nodes[0].State == protocol.NodeReady {
			break
		}
	}
	if len(nodes) != 1 || !nodes[0].Connected || nodes[0].State != protocol.NodeReady || nodes[0].DaemonVersion != "0.1.0" {
		t.Fatalf("nodes %+v", nodes)
	}

	cmd, err := op.CreateCommand(ctx, res.NodeID, apitype.CommandCreate{Kind: protocol.KindNodeReboot})
	if err != nil {
		t.Fatal(err)
	}
	var c protocol.Command
	recv(protocol.FrameCommand, &c)
	if c.ID != cmd.ID || c.Kind != protocol.KindNodeReboot {
		t.Errorf("delivered %+v", c)
	}
	send(protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: c.ID, State: protocol.StateSucceeded, Time: time.Now()})
	var ack protocol.Ack
	recv(protocol.FrameAck, &ack)
	if got, err := op.GetCommand(ctx, cmd.ID); err != nil || got.State != protocol.StateSucceeded {
		t.Errorf("command after status: %+v %v", got, err)
	}

	// Deleting the node ends its session and locks it out.
	if _, err := op.DeleteNode(ctx, res.NodeID); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := ws.Read(rctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("deleted node's session: %v", err)
	}
	_, resp, err = websocket.Dial(ctx, "wss"+strings.TrimPrefix(s.AdvertisedGatewayURL(), "https")+protocol.PathSession,
		&websocket.DialOptions{HTTPClient: gatewayClient(s, &cert)})
	if err == nil || resp == nil || resp.StatusCode != 403 {
		t.Errorf("deleted node reconnecting: %v %v", err, resp)
	}
}

func TestGatewayEnvironment(t *testing.T) {
	t.Setenv(EnvGatewayURL, "https://gw.example.test:9443")
	t.Setenv(EnvGatewayServerName, "gw.internal.test")
	s, _ := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	resp, err := gatewayClient(s, nil).Get(s.APIURL() + protocol.PathWellKnown)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var wk protocol.WellKnown
	json.NewDecoder(resp.Body).Decode(&wk)
	if wk.Gateway.URL != "https://gw.example.test:9443" || wk.Gateway.ServerName != "gw.internal.test" {
		t.Errorf("gateway section %+v", wk.Gateway)
	}
	// The serving certificate covers the advertised names, so an agent
	// checking gw.internal.test accepts it.
	leaf := resp.TLS.PeerCertificates[0]
	for _, n := range []string{"gw.internal.test", "gw.example.test", "localhost"} {
		if err := leaf.VerifyHostname(n); err != nil {
			t.Errorf("serving certificate: %v", err)
		}
	}
}

func TestOwnTLSCertificate(t *testing.T) {
	pkiDir := newPKI(t)
	b, err := pki.LoadBundle(pkiDir)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := b.IssueServingCert([]string{"cp.example.test", "127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var chain []byte
	for _, der := range cert.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, _ := pki.MarshalPKCS8PEM(cert.PrivateKey)
	os.WriteFile(filepath.Join(dir, "tls.crt"), chain, 0o644)
	os.WriteFile(filepath.Join(dir, "tls.key"), key, 0o600)
	s, _ := startServer(t, pkiDir, filepath.Join(t.TempDir(), "data"), func(s *Server) {
		s.TLSCertFile, s.TLSKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	})
	for _, u := range []string{s.APIURL() + protocol.PathWellKnown, s.GatewayAddrURL() + protocol.PathJoin} {
		resp, err := gatewayClient(s, nil).Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !resp.TLS.PeerCertificates[0].Equal(cert.Leaf) {
			t.Errorf("%s: not the --tls-cert certificate", u)
		}
	}
}

func TestGatewayIsHTTP1(t *testing.T) {
	s, _ := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(s.GatewayAddrURL(), "https://"), &tls.Config{
		RootCAs: s.Bundle().Public.ServingCAPool(), NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
		t.Errorf("the gateway negotiated %q; a WebSocket needs HTTP/1.1", p)
	}
}

func TestReclaimEndsTheOldSession(t *testing.T) {
	s, out := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	op := operator(t, s, out)
	op.CreateSite(ctx, "fsn1")
	hc := gatewayClient(s, nil)
	// The reclaim proves the old node's key (as bcd join does after --reset).
	join := func(allowReclaim bool, old *cptest.Agent, oldID string) (*cptest.Agent, protocol.JoinResult) {
		tok, err := op.CreateToken(ctx, apitype.TokenCreate{Pool: "p", Site: "fsn1", Role: "node", AllowReclaim: allowReclaim})
		if err != nil {
			t.Fatal(err)
		}
		a := cptest.NewAgent(t)
		jr, er := postJoin(t, hc, s.AdvertisedGatewayURL(), a.Request(t, s.Bundle(), "node", tok.Token, func(r *protocol.JoinRequest) {
			if old != nil {
				r.ReclaimProof = a.ReclaimProof(t, old.Key, oldID)
			}
		}))
		if er != nil {
			t.Fatalf("join: %+v", er)
		}
		return a, a.Verify(t, s.Bundle(), jr)
	}
	a1, res1 := join(false, nil, "")
	cert1 := a1.ClientCert(t, res1)
	url := "wss" + strings.TrimPrefix(s.AdvertisedGatewayURL(), "https") + protocol.PathSession
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: gatewayClient(s, &cert1)})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	f, _ := protocol.NewFrame(protocol.FrameHello, protocol.Hello{ProtocolVersion: 1, NodeID: res1.NodeID, Role: "node"})
	b, _ := json.Marshal(f)
	ws.Write(ctx, websocket.MessageText, b)
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	_, res2 := join(true, a1, res1.NodeID)
	if res2.NodeID != res1.NodeID {
		t.Fatalf("reclaim gave %s, want %s", res2.NodeID, res1.NodeID)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, err := ws.Read(rctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("the old session after a reclaim: %v, want close 1008", err)
	}
	_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: gatewayClient(s, &cert1)})
	if err == nil || resp == nil || resp.StatusCode != 403 {
		t.Errorf("the old certificate after a reclaim: %v %v, want 403", err, resp)
	}
}

// TestServeRunsTheTPMAttestor: serve's JoinService has the tpm attestor (a
// join without evidence is its refusal, not "attestor not enabled"). Its
// rounds are tested against swtpm in package join.
func TestServeRunsTheTPMAttestor(t *testing.T) {
	s, _ := startServer(t, newPKI(t), filepath.Join(t.TempDir(), "data"), nil)
	a := cptest.NewAgent(t)
	req := a.Request(t, s.Bundle(), protocol.RoleNode, "", func(r *protocol.JoinRequest) { r.Attestor = protocol.AttestorTPM })
	_, er := cptest.PostJoin(t, cptest.HTTPClient(s.Bundle().Public.ServingCAPool(), nil), s.AdvertisedGatewayURL(), req)
	if er == nil || er.Code != protocol.CodeInvalidInput || !strings.Contains(er.Message, "the tpm attestor needs the TPM's evidence") {
		t.Fatalf("tpm join without evidence: %+v", er)
	}
}
