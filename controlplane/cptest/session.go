package cptest

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/protocol"
)

// HTTPClient trusts roots and presents cert when given, as an agent does.
func HTTPClient(roots *x509.CertPool, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, Proxy: nil}, Timeout: 30 * time.Second}
}

// PostJoin sends req to the gateway at gatewayURL and returns its answer or
// its refusal.
func PostJoin(t testing.TB, hc *http.Client, gatewayURL string, req *protocol.JoinRequest) (*protocol.JoinResponse, *protocol.ErrorResponse) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := hc.Post(gatewayURL+protocol.PathJoin, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var e protocol.ErrorResponse
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("join: HTTP %d %s", resp.StatusCode, b)
		}
		return nil, &e
	}
	var jr protocol.JoinResponse
	if err := json.Unmarshal(b, &jr); err != nil {
		t.Fatal(err)
	}
	return &jr, nil
}

// Session is an agent's gateway session, driven by a test.
type Session struct {
	t testing.TB
	c *websocket.Conn
	// Welcome is the gateway's answer to the Hello.
	Welcome protocol.Welcome
}

// Dial opens a session at gatewayURL with the agent's certificate from res,
// says Hello and reads the Welcome. The session closes when the test ends.
func (a *Agent) Dial(t testing.TB, gatewayURL string, roots *x509.CertPool, res protocol.JoinResult) *Session {
	t.Helper()
	return a.DialBoot(t, gatewayURL, roots, res, "boot-1")
}

// DialBoot is Dial with the boot id the Hello reports: a new one is a
// machine that rebooted.
func (a *Agent) DialBoot(t testing.TB, gatewayURL string, roots *x509.CertPool, res protocol.JoinResult, bootID string) *Session {
	t.Helper()
	cert := a.ClientCert(t, res)
	c, _, err := websocket.Dial(context.Background(), "wss"+strings.TrimPrefix(gatewayURL, "https")+protocol.PathSession,
		&websocket.DialOptions{HTTPClient: HTTPClient(roots, &cert)})
	if err != nil {
		t.Fatalf("session of %s: %v", res.NodeID, err)
	}
	c.SetReadLimit(4 << 20)
	t.Cleanup(func() { c.CloseNow() })
	s := &Session{t: t, c: c}
	s.Send(protocol.FrameHello, protocol.Hello{ProtocolVersion: protocol.Version, NodeID: res.NodeID, Role: res.Role,
		DaemonVersion: "0.0.0-test", BootID: bootID})
	s.Expect(protocol.FrameWelcome, &s.Welcome)
	return s
}

// Write writes one frame. Unlike Send it may be called from any goroutine.
func (s *Session) Write(typ string, v any) error {
	f, err := protocol.NewFrame(typ, v)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(f)
	return s.c.Write(context.Background(), websocket.MessageText, b)
}

// Read reads one frame. Unlike Next it may be called from any goroutine.
func (s *Session) Read(ctx context.Context) (protocol.Frame, error) {
	_, b, err := s.c.Read(ctx)
	if err != nil {
		return protocol.Frame{}, err
	}
	var f protocol.Frame
	return f, json.Unmarshal(b, &f)
}

// Send writes one frame, failing the test when it cannot.
func (s *Session) Send(typ string, v any) {
	s.t.Helper()
	if err := s.Write(typ, v); err != nil {
		s.t.Fatalf("send %s: %v", typ, err)
	}
}

// Next reads the next frame, failing the test after 10 s.
func (s *Session) Next() protocol.Frame {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f, err := s.Read(ctx)
	if err != nil {
		s.t.Fatalf("reading a frame: %v", err)
	}
	return f
}

// Expect reads frames until one of type typ, decodes it into v (when not
// nil), and fails the test on an error frame. Acks and specs it is not
// waiting for are skipped.
func (s *Session) Expect(typ string, v any) {
	s.t.Helper()
	for {
		f := s.Next()
		switch {
		case f.Type == typ:
			if v != nil {
				if err := f.Decode(v); err != nil {
					s.t.Fatal(err)
				}
			}
			return
		case f.Type == protocol.FrameAck || f.Type == protocol.FrameSpec:
			continue
		}
		s.t.Fatalf("got a %s frame (%s) waiting for %s", f.Type, f.Data, typ)
	}
}

// Close ends the session.
func (s *Session) Close() { s.c.Close(websocket.StatusNormalClosure, "") }
