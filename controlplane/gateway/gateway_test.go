package gateway

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/better-compute/bcd/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/controlplane/ids"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

var ctx = context.Background()

type env struct {
	t   *testing.T
	b   *pki.Bundle
	st  store.Store
	gw  *Server
	url string // https://127.0.0.1:port
}

func start(t *testing.T, mut func(*Server)) *env {
	t.Helper()
	b := cptest.NewBundle(t)
	st := cptest.NewStore(t)
	gw := &Server{
		Joiner: &join.Service{Bundle: b, Store: st, Attestors: map[string]join.Attestor{
			protocol.AttestorJoinToken:   join.NewTokenAttestor(st),
			protocol.AttestorProvisioned: join.NewProvisionedAttestor(st),
		}},
		Store:       st,
		NodeCAs:     b.Public.NodeCAPool(),
		TrustDomain: b.Public.TrustDomain,
	}
	if mut != nil {
		mut(gw)
	}
	cert, err := b.IssueServingCert([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequestClientCert,
		MinVersion:   tls.VersionTLS12,
	}}
	go srv.ServeTLS(l, "", "")
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		srv.Shutdown(c)
		if err := gw.Close(c); err != nil {
			t.Errorf("gateway close: %v", err)
		}
	})
	return &env{t: t, b: b, st: st, gw: gw, url: "https://" + l.Addr().String()}
}

// client trusts the serving CA and presents cert when given.
func (e *env) client(cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: e.b.Public.ServingCAPool(), ServerName: "127.0.0.1"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 30 * time.Second}
}

func (e *env) postJoin(req *protocol.JoinRequest) (int, []byte) {
	e.t.Helper()
	body, _ := json.Marshal(req)
	return e.postRaw(body)
}

func (e *env) postRaw(body []byte) (int, []byte) {
	e.t.Helper()
	resp, err := e.client(nil).Post(e.url+protocol.PathJoin, "application/json", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// joined joins a node over HTTP and returns the agent, its result and its
// client certificate.
func (e *env) joined(role string) (*cptest.Agent, protocol.JoinResult, tls.Certificate) {
	e.t.Helper()
	_, tok := cptest.NewToken(e.t, e.st, func(t *store.Token) { t.Role = role })
	a := cptest.NewAgent(e.t)
	status, body := e.postJoin(a.Request(e.t, e.b, role, tok, func(r *protocol.JoinRequest) { r.Claims.SystemUUID = "" }))
	if status != 200 {
		e.t.Fatalf("join: %d %s", status, body)
	}
	var resp protocol.JoinResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		e.t.Fatal(err)
	}
	res := a.Verify(e.t, e.b, &resp)
	return a, res, a.ClientCert(e.t, res)
}

type wsClient struct {
	t *testing.T
	c *websocket.Conn
}

func (e *env) dial(cert *tls.Certificate) (*wsClient, *http.Response, error) {
	c, resp, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(e.url, "https")+protocol.PathSession,
		&websocket.DialOptions{HTTPClient: e.client(cert)})
	if err != nil {
		return nil, resp, err
	}
	c.SetReadLimit(MaxFrameSize)
	e.t.Cleanup(func() { c.CloseNow() })
	return &wsClient{e.t, c}, resp, nil
}

func (c *wsClient) send(typ string, v any) {
	c.t.Helper()
	f, err := protocol.NewFrame(typ, v)
	if err != nil {
		c.t.Fatal(err)
	}
	b, _ := json.Marshal(f)
	if err := c.c.Write(ctx, websocket.MessageText, b); err != nil {
		c.t.Fatalf("send %s: %v", typ, err)
	}
}

func (c *wsClient) recv() (protocol.Frame, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, b, err := c.c.Read(rctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	var f protocol.Frame
	if err := json.Unmarshal(b, &f); err != nil {
		c.t.Fatal(err)
	}
	return f, nil
}

func (c *wsClient) expect(typ string, v any) {
	c.t.Helper()
	f, err := c.recv()
	if err != nil {
		c.t.Fatalf("waiting for %s: %v", typ, err)
	}
	if f.Type != typ {
		c.t.Fatalf("got a %s frame (%s), want %s", f.Type, f.Data, typ)
	}
	if v != nil {
		if err := f.Decode(v); err != nil {
			c.t.Fatal(err)
		}
	}
}

func hello(res protocol.JoinResult) protocol.Hello {
	return protocol.Hello{ProtocolVersion: protocol.Version, NodeID: res.NodeID, Role: res.Role, DaemonVersion: "0.1.0-test", BootID: "boot-1"}
}

func (e *env) enqueue(nodeID, kind string) string {
	e.t.Helper()
	now := time.Now()
	id := ids.New(ids.PrefixCommand, now)
	if err := e.st.CreateCommand(ctx, store.Command{ID: id, NodeID: nodeID, Kind: kind, Params: []byte(`{"why":"test"}`),
		State: store.CommandPending, CreatedAt: now, UpdatedAt: now}); err != nil {
		e.t.Fatal(err)
	}
	e.gw.Notify(nodeID)
	return id
}

func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestJoinOverHTTP(t *testing.T) {
	e := start(t, nil)
	e.joined("node")
	status, body := e.postRaw([]byte(`{"protocol_version":1,"role":"node","unexpected":1}`))
	var er protocol.ErrorResponse
	json.Unmarshal(body, &er)
	if status != 400 || er.Code != protocol.CodeInvalidInput {
		t.Errorf("unknown field: %d %s", status, body)
	}
	a := cptest.NewAgent(t)
	status, body = e.postJoin(a.Request(t, e.b, "node", "bcjt_jt_00000000000000000000000000_"+strings.Repeat("a", 52), nil))
	json.Unmarshal(body, &er)
	if status != 401 || er.Code != protocol.CodeTokenUnknown || er.Retryable {
		t.Errorf("unknown token: %d %s", status, body)
	}
	resp, err := e.client(nil).Get(e.url + protocol.PathJoin)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/join: %d", resp.StatusCode)
	}
	// The store failing is retryable.
	_, tok := cptest.NewToken(t, e.st, nil)
	req := a.Request(t, e.b, "node", tok, nil)
	e.st.Close()
	status, body = e.postJoin(req)
	json.Unmarshal(body, &er)
	if status != 503 || er.Code != protocol.CodeUnavailable || !er.Retryable {
		t.Errorf("store down: %d %s", status, body)
	}
}

func TestSession(t *testing.T) {
	e := start(t, nil)
	_, res, cert := e.joined("node")
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	var w protocol.Welcome
	c.expect(protocol.FrameWelcome, &w)
	if w.NodeState != protocol.NodeAdopting || w.MinProtocolVersion != protocol.MinVersion || w.Spec == nil || time.Since(w.ServerTime) > time.Minute {
		t.Errorf("first welcome %+v", w)
	}
	e.waitFor("the node to be ready", func() bool {
		n, _ := e.st.GetNode(ctx, res.NodeID)
		return n.State == protocol.NodeReady && n.SessionID != 0 && n.DaemonVersion == "0.1.0-test"
	})

	id := e.enqueue(res.NodeID, protocol.KindNodeReboot)
	var cmd protocol.Command
	c.expect(protocol.FrameCommand, &cmd)
	if cmd.ID != id || cmd.Kind != protocol.KindNodeReboot || string(cmd.Params) != `{"why":"test"}` {
		t.Errorf("command %+v", cmd)
	}
	c.send(protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: id, State: protocol.StateRunning, Progress: &protocol.Progress{Done: 1, Total: 2}, Time: time.Now()})
	var ack protocol.Ack
	c.expect(protocol.FrameAck, &ack)
	if ack.Seq != 1 {
		t.Errorf("ack %d, want 1", ack.Seq)
	}
	got, _ := e.st.GetCommand(ctx, id)
	if got.State != protocol.StateRunning || !strings.Contains(string(got.Progress), `"done":1`) {
		t.Errorf("stored command %+v", got)
	}
	c.send(protocol.FrameEvent, protocol.Event{Seq: 2, Kind: protocol.EventLog, Time: time.Now(), Message: "rebooting soon"})
	c.expect(protocol.FrameAck, &ack)
	c.send(protocol.FrameStatus, protocol.Status{Seq: 3, CommandID: id, State: protocol.StateSucceeded, Result: json.RawMessage(`{"ok":true}`), Time: time.Now()})
	c.expect(protocol.FrameAck, &ack)
	if ack.Seq != 3 {
		t.Errorf("ack %d, want 3", ack.Seq)
	}
	if got, _ := e.st.GetCommand(ctx, id); got.State != protocol.StateSucceeded || string(got.Result) != `{"ok":true}` {
		t.Errorf("stored command %+v", got)
	}
	// A status for a command the gateway does not know is acknowledged all
	// the same, so the agent's journal drains.
	c.send(protocol.FrameStatus, protocol.Status{Seq: 4, CommandID: "cmd_unknown", State: protocol.StateFailed, Time: time.Now()})
	c.expect(protocol.FrameAck, &ack)

	c.c.Close(websocket.StatusNormalClosure, "bye")
	e.waitFor("the session to end", func() bool {
		n, _ := e.st.GetNode(ctx, res.NodeID)
		return n.SessionID == 0 && !e.gw.Connected(res.NodeID)
	})
	// The second session's Welcome says ready.
	c, _, err = e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, &w)
	if w.NodeState != protocol.NodeReady {
		t.Errorf("second welcome state %q, want ready", w.NodeState)
	}
}

func TestRedeliveryUntilTerminal(t *testing.T) {
	e := start(t, func(s *Server) { s.ResendDelay = 50 * time.Millisecond })
	_, res, cert := e.joined("node")
	id := e.enqueue(res.NodeID, protocol.KindDaemonUpgrade) // queued while offline
	for round := 0; round < 2; round++ {
		c, _, err := e.dial(&cert)
		if err != nil {
			t.Fatal(err)
		}
		c.send(protocol.FrameHello, hello(res))
		c.expect(protocol.FrameWelcome, nil)
		var cmd protocol.Command
		c.expect(protocol.FrameCommand, &cmd)
		if cmd.ID != id {
			t.Fatalf("round %d: command %s, want %s", round, cmd.ID, id)
		}
		if round == 1 {
			c.send(protocol.FrameStatus, protocol.Status{Seq: 9, CommandID: id, State: protocol.StateFailed, Reason: "UpdateFailed", Time: time.Now()})
			c.expect(protocol.FrameAck, nil)
		}
		c.c.Close(websocket.StatusNormalClosure, "")
		e.waitFor("the session to end", func() bool { return !e.gw.Connected(res.NodeID) })
	}
	if got, _ := e.st.GetCommand(ctx, id); got.State != protocol.StateFailed || got.Reason != "UpdateFailed" {
		t.Errorf("command %+v", got)
	}
	// A finished command is not sent again.
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	c.send(protocol.FrameEvent, protocol.Event{Seq: 10, Kind: protocol.EventLog})
	var f protocol.Frame
	if f, err = c.recv(); err != nil || f.Type != protocol.FrameAck {
		t.Errorf("after a finished command the next frame is %s %v, want the ack", f.Type, err)
	}
}

func TestSessionRefusals(t *testing.T) {
	e := start(t, nil)
	_, res, cert := e.joined("node")

	wantHTTP := func(name string, cert *tls.Certificate, status int, code string) {
		t.Helper()
		_, resp, err := e.dial(cert)
		if err == nil {
			t.Errorf("%s: the session was accepted", name)
			return
		}
		if resp == nil || resp.StatusCode != status {
			t.Errorf("%s: %v (response %v), want HTTP %d", name, err, resp, status)
			return
		}
		var er protocol.ErrorResponse
		body, _ := io.ReadAll(resp.Body)
		if json.Unmarshal(body, &er); er.Code != code {
			t.Errorf("%s: body %s, want code %s", name, body, code)
		}
	}
	wantHTTP("no certificate", nil, 401, protocol.CodeUnauthenticated)

	// A certificate for the same node id from another CA.
	other := cptest.NewBundle(t)
	a := cptest.NewAgent(t)
	csr, _ := x509.ParseCertificateRequest(a.CSRDER)
	der, err := other.IssueNodeCert(csr, "node", res.NodeID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: a.Key}
	wantHTTP("another CA", &foreign, 401, protocol.CodeUnauthenticated)

	// A certificate from this CA for a node the store does not know.
	der, _ = e.b.IssueNodeCert(csr, "node", "n_unknown", time.Hour)
	unknown := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: a.Key}
	wantHTTP("unknown node", &unknown, 403, protocol.CodeNodeRevoked)

	// A certificate of the right node that a later join replaced.
	der, _ = e.b.IssueNodeCert(csr, "node", res.NodeID, time.Hour)
	stale := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: a.Key}
	wantHTTP("replaced certificate", &stale, 403, protocol.CodeNodeRevoked)

	// A hello for another node: an error frame and close 1008.
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	h := hello(res)
	h.NodeID = "n_someone_else"
	c.send(protocol.FrameHello, h)
	var er protocol.ErrorResponse
	c.expect(protocol.FrameError, &er)
	if er.Code != protocol.CodeUnauthenticated {
		t.Errorf("hello for another node: %+v", er)
	}
	if _, err := c.recv(); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("after a bad hello: %v, want close 1008", err)
	}
	// A first frame that is not a hello.
	c, _, _ = e.dial(&cert)
	c.send(protocol.FrameStatus, protocol.Status{Seq: 1})
	c.expect(protocol.FrameError, &er)
	if er.Code != protocol.CodeInvalidInput {
		t.Errorf("status before hello: %+v", er)
	}

	// A deleted node: its open session ends and it cannot come back.
	c, _, _ = e.dial(&cert)
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	if err := e.st.DeleteNode(ctx, res.NodeID, time.Now()); err != nil {
		t.Fatal(err)
	}
	e.gw.Disconnect(res.NodeID, "node deleted")
	if _, err := c.recv(); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("deleted node's session: %v, want close 1008", err)
	}
	wantHTTP("deleted node", &cert, 403, protocol.CodeNodeRevoked)
}

func TestOneSessionPerNode(t *testing.T) {
	e := start(t, nil)
	_, res, cert := e.joined("site")
	c1, _, _ := e.dial(&cert)
	c1.send(protocol.FrameHello, hello(res))
	c1.expect(protocol.FrameWelcome, nil)
	c2, _, _ := e.dial(&cert)
	c2.send(protocol.FrameHello, hello(res))
	c2.expect(protocol.FrameWelcome, nil)
	if _, err := c1.recv(); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Errorf("older session: %v, want close 1008", err)
	}
	// The newer one still works.
	c2.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog})
	c2.expect(protocol.FrameAck, nil)
	if n := e.gw.SessionCount(); n != 1 {
		t.Errorf("%d sessions, want 1", n)
	}
	n, _ := e.st.GetNode(ctx, res.NodeID)
	if n.SessionID == 0 {
		t.Error("the node has no current session in the store")
	}
}

func TestHeartbeatDropsASilentAgent(t *testing.T) {
	e := start(t, func(s *Server) { s.PingInterval = 40 * time.Millisecond; s.MissedPings = 3 })
	_, res, cert := e.joined("node")
	c, _, _ := e.dial(&cert)
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	// The agent stops reading, so it never answers a ping.
	e.waitFor("the gateway to drop the session", func() bool { return !e.gw.Connected(res.NodeID) })
	e.waitFor("the store to record it", func() bool {
		n, _ := e.st.GetNode(ctx, res.NodeID)
		return n.SessionID == 0
	})
}

func TestHeartbeatKeepsAReadingAgent(t *testing.T) {
	e := start(t, func(s *Server) { s.PingInterval = 100 * time.Millisecond; s.MissedPings = 3 })
	_, res, cert := e.joined("node")
	c, _, _ := e.dial(&cert)
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	// Reading answers pings; nothing else arrives.
	read := make(chan error, 1)
	go func() { _, _, err := c.c.Read(ctx); read <- err }()
	select {
	case err := <-read:
		t.Fatalf("the session ended: %v", err)
	case <-time.After(700 * time.Millisecond):
	}
	if !e.gw.Connected(res.NodeID) {
		t.Error("a reading agent was dropped")
	}
}

// slowSpecs builds a spec of a new revision each time, slowly, as a site's
// spec of a thousand machines is built under load.
type slowSpecs struct {
	delay time.Duration
	rev   atomic.Int64
}

func (s *slowSpecs) Spec(context.Context, store.Node) (*protocol.Spec, error) {
	time.Sleep(s.delay)
	return &protocol.Spec{Revision: s.rev.Add(1)}, nil
}

// TestHeartbeatWhileTheWriterIsBusy streams events to a session whose writer
// is busy building specs (a site agent's stream of boot events while its
// machines' boot entries change), pinged often. The reader must keep storing
// and the pings must keep being answered: a reader that waited for the writer
// to take its acks deadlocked with a writer waiting in a ping for the pong only
// that reader reads, and the session stalled at every ping until it was
// dropped for missed heartbeats.
func TestHeartbeatWhileTheWriterIsBusy(t *testing.T) {
	specs := &slowSpecs{delay: 15 * time.Millisecond}
	e := start(t, func(s *Server) { s.PingInterval = 30 * time.Millisecond; s.MissedPings = 2; s.Specs = specs })
	_, res, cert := e.joined("node")
	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)

	const n = 300
	var acked atomic.Uint64
	readErr := make(chan error, 1)
	go func() {
		for {
			f, err := c.recv()
			if err != nil {
				readErr <- err
				return
			}
			if f.Type == protocol.FrameAck {
				var a protocol.Ack
				if f.Decode(&a) == nil {
					acked.Store(a.Seq)
				}
			}
		}
	}()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				e.gw.NodeSpecChanged(res.NodeID)
			}
		}
	}()
	for i := uint64(1); i <= n; i++ {
		c.send(protocol.FrameEvent, protocol.Event{Seq: i, Kind: protocol.EventLog, Time: time.Now(), Message: "booted"})
	}
	deadline := time.After(10 * time.Second)
	for acked.Load() < n {
		select {
		case err := <-readErr:
			t.Fatalf("the session ended after %d of %d events were acknowledged: %v", acked.Load(), n, err)
		case <-deadline:
			t.Fatalf("%d of %d events acknowledged after 10 s", acked.Load(), n)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if !e.gw.Connected(res.NodeID) {
		t.Error("the session was dropped")
	}
}

// priorityStore records whether each stored event's context had priority.
type priorityStore struct {
	Store
	mu   sync.Mutex
	prio map[string]bool // node → its last event's
}

func (s *priorityStore) AddEvent(ctx context.Context, e store.Event) error {
	s.mu.Lock()
	s.prio[e.NodeID] = store.HasPriority(ctx)
	s.mu.Unlock()
	return s.Store.AddEvent(ctx, e)
}

func (s *priorityStore) AddEvents(ctx context.Context, es []store.Event) error {
	s.mu.Lock()
	for _, e := range es {
		s.prio[e.NodeID] = store.HasPriority(ctx)
	}
	s.mu.Unlock()
	return s.Store.AddEvents(ctx, es)
}

// TestSiteSessionWritesHavePriority: a site agent's session writes with
// priority (its stream carries every machine of its site), a node's without.
func TestSiteSessionWritesHavePriority(t *testing.T) {
	var ps *priorityStore
	e := start(t, func(s *Server) {
		ps = &priorityStore{Store: s.Store, prio: map[string]bool{}}
		s.Store = ps
	})
	for _, role := range []string{protocol.RoleSite, protocol.RoleNode} {
		_, res, cert := e.joined(role)
		c, _, err := e.dial(&cert)
		if err != nil {
			t.Fatal(err)
		}
		c.send(protocol.FrameHello, hello(res))
		c.expect(protocol.FrameWelcome, nil)
		c.send(protocol.FrameEvent, protocol.Event{Seq: 1, Kind: protocol.EventLog, Time: time.Now(), Message: "hello"})
		for {
			f, err := c.recv()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == protocol.FrameAck {
				break
			}
		}
		ps.mu.Lock()
		prio, ok := ps.prio[res.NodeID]
		ps.mu.Unlock()
		if !ok || prio != (role == protocol.RoleSite) {
			t.Errorf("a %s's event stored with priority %v (stored %v), want %v", role, prio, ok, role == protocol.RoleSite)
		}
	}
}

func TestCloseEndsSessions(t *testing.T) {
	e := start(t, nil)
	_, res, cert := e.joined("node")
	c, _, _ := e.dial(&cert)
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	read := make(chan error, 1)
	go func() { _, err := c.recv(); read <- err }()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := e.gw.Close(cctx); err != nil {
		t.Fatal(err)
	}
	if err := <-read; websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("after Close: %v, want 1001", err)
	}
	if _, resp, err := e.dial(&cert); err == nil || resp == nil || resp.StatusCode != 503 {
		t.Errorf("session after Close: %v %v, want 503", err, resp)
	}
}

// observed records what the gateway tells its Observer.
type observed struct {
	mu       sync.Mutex
	statuses []string
	sessions []string
}

func (o *observed) StatusApplied(node, cmd string) {
	o.mu.Lock()
	o.statuses = append(o.statuses, node+" "+cmd)
	o.mu.Unlock()
}

func (o *observed) SessionChanged(node string) {
	o.mu.Lock()
	o.sessions = append(o.sessions, node)
	o.mu.Unlock()
}

func (o *observed) counts() (int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.statuses), len(o.sessions)
}

// TestResendAfterReconnect: on a new session, a command the agent reported
// RUNNING is not sent again (its journal reports the rest: a deploy is not
// run twice); one sent before without an answer is held for ResendDelay, so
// a terminal status the agent replays meanwhile keeps it from being sent,
// and one still unanswered after it is sent.
func TestResendAfterReconnect(t *testing.T) {
	const delay = 400 * time.Millisecond
	obs := &observed{}
	e := start(t, func(s *Server) { s.ResendDelay = delay; s.Observer = obs })
	_, res, cert := e.joined("node")
	running := e.enqueue(res.NodeID, protocol.KindDaemonUpgrade)
	replayed := e.enqueue(res.NodeID, protocol.KindNodeReboot)
	unanswered := e.enqueue(res.NodeID, protocol.KindNodeReboot)

	c, _, err := e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	var got []string
	for range 3 {
		var cmd protocol.Command
		c.expect(protocol.FrameCommand, &cmd)
		got = append(got, cmd.ID)
	}
	sort.Strings(got)
	want := []string{running, replayed, unanswered}
	sort.Strings(want)
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("first session got %v", got)
	}
	c.send(protocol.FrameStatus, protocol.Status{Seq: 1, CommandID: running, State: protocol.StateRunning, Time: time.Now()})
	c.expect(protocol.FrameAck, nil)
	c.c.Close(websocket.StatusNormalClosure, "")
	e.waitFor("the session to end", func() bool { return !e.gw.Connected(res.NodeID) })

	c, _, err = e.dial(&cert)
	if err != nil {
		t.Fatal(err)
	}
	c.send(protocol.FrameHello, hello(res))
	c.expect(protocol.FrameWelcome, nil)
	welcomed := time.Now()
	// The journal's replay: the reboot finished while the agent was away.
	c.send(protocol.FrameStatus, protocol.Status{Seq: 2, CommandID: replayed, State: protocol.StateSucceeded, Time: time.Now()})
	c.expect(protocol.FrameAck, nil)
	var cmd protocol.Command
	c.expect(protocol.FrameCommand, &cmd)
	if cmd.ID != unanswered || time.Since(welcomed) < delay-50*time.Millisecond {
		t.Errorf("second session got %s after %v, want %s after %v", cmd.ID, time.Since(welcomed), unanswered, delay)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*delay)
	defer cancel()
	if _, b, err := c.c.Read(rctx); err == nil {
		t.Errorf("another frame: %s", b)
	}
	if st, n := obs.counts(); st != 2 || n < 3 {
		t.Errorf("observer: %d statuses, %d session changes", st, n)
	}
}

// TestJoinRefusalsCountedAndLoggedAtABoundedRate: a join needs no credential to
// send, so 1,000 refused joins (500 with an unknown token, refused by the real
// JoinService, and 500 malformed) are all counted, but the log gets at most one
// "join refused" line a second, each saying how many it left out; before, every
// refusal was an INFO line.
func TestJoinRefusalsCountedAndLoggedAtABoundedRate(t *testing.T) {
	var logged syncbuf.Buffer
	e := start(t, func(s *Server) { s.Logger = slog.New(slog.NewTextHandler(&logged, nil)) })
	a := cptest.NewAgent(t)
	unknown, _ := json.Marshal(a.Request(t, e.b, "node", "bcjt_jt_00000000000000000000000000_"+strings.Repeat("a", 52), nil))
	malformed := []byte(`{"protocol_version":1,"role":"node","unexpected":1}`)
	c := e.client(nil)
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 8 {
		wg.Go(func() {
			for i := range 125 {
				body := unknown
				if (w*125+i)%2 == 1 {
					body = malformed
				}
				resp, err := c.Post(e.url+protocol.PathJoin, "application/json", bytes.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 400 && resp.StatusCode != 401 {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of the 1,000 joins were not refused with 400 or 401", n)
	}
	if got := e.gw.JoinRefusals(); got != 1000 {
		t.Errorf("JoinRefusals = %d, want 1000", got)
	}
	var lines, reported int
	for _, l := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		if !strings.Contains(l, `msg="join refused"`) {
			continue
		}
		lines++
		var n int
		if _, err := fmt.Sscanf(l[strings.Index(l, "suppressed="):], "suppressed=%d", &n); err != nil {
			t.Fatalf("no suppressed count in %q", l)
		}
		reported += n
	}
	// One line a second at most: the first, then one per second elapsed.
	if limit := 1 + int(elapsed/time.Second); lines < 1 || lines > limit {
		t.Errorf("%d join refused lines in %v, want 1 to %d", lines, elapsed, limit)
	}
	// The lines and the refusals they left out account for every refusal but
	// those after the last line, which the next line would report.
	if lines+reported > 1000 {
		t.Errorf("%d lines + %d suppressed > 1,000 refusals", lines, reported)
	}
	if !strings.Contains(logged.String(), "refused_total=") {
		t.Errorf("no refused_total in the log:\n%s", logged.String())
	}
}
