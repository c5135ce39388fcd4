package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// TestJoinAndNodeSession is the main path of Step 2, across real processes: pki init →
// serve → tokens create → bcd join → bcd node connects → nodes list shows it ready
// with its daemon_version; the token cannot be used twice; the gateway restarted →
// the node reconnects; a corrupt journal is moved aside.
func TestJoinAndNodeSession(t *testing.T) {
	cp := newControlPlane(t)
	cp.mustBC("sites", "create", "fsn1")
	tok := cp.token("fsn1", "node")

	h := newHost(t, cp, "fsn1")
	r := bcd(t, []string{"BCD_JOIN_TOKEN=" + tok}, "", "join", "--config", h.config)
	if r.code != 0 {
		t.Fatalf("bcd join: %s\nserve log:\n%s", r, cp.log)
	}
	id := identityNodeID(t, h.data)
	for _, f := range []string{"node.key", "identity.json"} {
		fi, err := os.Stat(filepath.Join(h.data, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, fi.Mode().Perm())
		}
	}

	// Joining again is a no-op without a token, so a join unit can run on every boot.
	if r := bcd(t, nil, "", "join", "--config", h.config); r.code != 0 || !strings.Contains(r.stdout+r.stderr, "already joined as "+id) {
		t.Errorf("second bcd join: %s", r)
	}

	// The same token on another machine is refused: single use.
	h2 := newHost(t, cp, "fsn1")
	if r := bcd(t, []string{"BCD_JOIN_TOKEN=" + tok}, "", "join", "--config", h2.config); r.code != 1 || !strings.Contains(r.stderr, protocol.CodeTokenUsed) {
		t.Errorf("token reuse: %s", r)
	}
	if strings.Contains(r.stdout+r.stderr, tok) {
		t.Errorf("bcd join printed the token")
	}

	node := startAgent(t, "node", "--config", h.config)
	n := cp.waitNode(id, 60*time.Second, "ready and connected", func(n nodeRow) bool {
		return n.State == protocol.NodeReady && n.Connected
	})
	if n.DaemonVersion != "0.0.0-e2e" || n.Role != "node" || n.Site != "fsn1" {
		t.Errorf("nodes list: %+v, want role node, site fsn1, daemon_version 0.0.0-e2e", n)
	}
	if out := cp.mustBC("nodes", "list"); !strings.Contains(out, id) || !strings.Contains(out, "ready") {
		t.Errorf("nodes list table:\n%s", out)
	}

	// The gateway goes away and comes back: the node reconnects by itself.
	first := n.SessionID
	cp.stop()
	cp.start()
	cp.waitNode(id, 90*time.Second, "reconnected", func(n nodeRow) bool { return n.Connected && n.SessionID != first })

	// A journal that does not open is moved aside and the node starts a new one.
	node.stop()
	journal := filepath.Join(h.data, "journal.db")
	if err := os.WriteFile(journal, bytes.Repeat([]byte("not a bbolt file "), 512), 0o600); err != nil {
		t.Fatal(err)
	}
	cp.waitNode(id, 30*time.Second, "disconnected", func(n nodeRow) bool { return !n.Connected })
	node = startAgent(t, "node", "--config", h.config)
	cp.waitNode(id, 60*time.Second, "reconnected with a new journal", func(n nodeRow) bool { return n.Connected })
	moved, _ := filepath.Glob(journal + ".corrupt-*")
	if len(moved) != 1 {
		t.Errorf("corrupt journal not moved aside: %v\nnode log:\n%s", moved, node.log)
	}
}

// TestJoinBootstrapsFromWellKnown: a machine with only the server URL and the three
// pins joins and writes its own config.toml (0600) and join-encryption.jwk (0644); a
// wrong pin is refused before anything is written.
func TestJoinBootstrapsFromWellKnown(t *testing.T) {
	cp := newControlPlane(t)
	cp.mustBC("sites", "create", "fsn1")
	pins, err := pki.BootstrapPins(cp.pki)
	if err != nil {
		t.Fatal(err)
	}
	// bcd trusts the api with the system roots; SSL_CERT_FILE makes the test CA one.
	env := []string{"SSL_CERT_FILE=" + filepath.Join(cp.pki, "serving-ca.crt")}
	dir := t.TempDir()
	conf := filepath.Join(dir, "etc/config.toml")
	data := filepath.Join(dir, "data")

	wrong := pins.JoinSigning[:len(pins.JoinSigning)-5] + "AAAA="
	tok := cp.token("fsn1", "node")
	r := bcd(t, append(env, "BCD_JOIN_TOKEN="+tok), "", "join", "--config", conf, "--data-dir", data, "--server", "https://"+cp.api,
		"--serving-ca-pin", pins.ServingCA, "--join-signing-pin", wrong, "--join-encryption-pin", pins.JoinEncryption)
	if r.code == 0 || !strings.Contains(r.stderr, "refusing to join") {
		t.Errorf("wrong signing pin: %s", r)
	}
	if _, err := os.Stat(conf); err == nil {
		t.Errorf("config.toml written although the join was refused")
	}

	r = bcd(t, append(env, "BCD_JOIN_TOKEN="+tok), "", "join", "--config", conf, "--data-dir", data, "--server", "https://"+cp.api,
		"--serving-ca-pin", pins.ServingCA, "--join-signing-pin", pins.JoinSigning, "--join-encryption-pin", pins.JoinEncryption)
	if r.code != 0 {
		t.Fatalf("bootstrap join: %s\nserve log:\n%s", r, cp.log)
	}
	for f, mode := range map[string]os.FileMode{conf: 0o600, filepath.Join(dir, "etc/join-encryption.jwk"): 0o644} {
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, want mode %v", f, err, mode)
		}
	}
	if r := bcd(t, nil, "", "config", "check", "--config", conf); r.code != 0 {
		t.Errorf("the written config.toml does not check: %s", r)
	}
	b, _ := os.ReadFile(conf)
	if !strings.Contains(string(b), `site = "fsn1"`) || !strings.Contains(string(b), pins.ServingCA) {
		t.Errorf("written config.toml:\n%s", b)
	}
}

// TestJoinRefusals: a token on the command line is refused without being echoed; a
// token file that others can read is refused before it is read; a gateway whose TLS
// does not chain to the pinned CA is refused; and an answer tampered with on the way
// (by a man in the middle holding a valid serving certificate) is refused.
func TestJoinRefusals(t *testing.T) {
	cp := newControlPlane(t)
	cp.mustBC("sites", "create", "fsn1")
	h := newHost(t, cp, "fsn1")

	const secret = "bcjt_jt_0123456789abcdefghijklmnop_SECRETSECRET"
	r := bcd(t, nil, "", "join", "--config", h.config, secret)
	want := "bcd join: takes no positional arguments\nbcd join reads the join token from BCD_JOIN_TOKEN or stdin, never from arguments\n"
	if r.code != 2 || r.stderr != want {
		t.Errorf("positional token: %s\nwant stderr %q", r, want)
	}
	if strings.Contains(r.stdout+r.stderr, "SECRET") {
		t.Errorf("the token was echoed")
	}

	tok := cp.token("fsn1", "node")
	tf := filepath.Join(h.dir, "join-token")
	os.WriteFile(tf, []byte(tok+"\n"), 0o644)
	os.Chmod(tf, 0o644)
	if r := bcd(t, nil, "", "join", "--config", h.config, "--token-file", tf); r.code == 0 || strings.Contains(r.stdout+r.stderr, tok) {
		t.Errorf("0644 token file: %s", r)
	}
	if _, err := os.Stat(filepath.Join(h.data, "identity.json")); err == nil {
		t.Fatal("joined with a token file others can read")
	}

	// A man in the middle with a certificate from the serving CA (a compromised
	// gateway host) relays the join and flips one byte of the signed answer.
	bundle, err := pki.LoadBundle(cp.pki)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := bundle.IssueServingCert([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse("https://" + cp.gw)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: bundle.Public.ServingCAPool()}}
	proxy.ModifyResponse = func(resp *http.Response) error {
		body, _ := io.ReadAll(resp.Body)
		var jr protocol.JoinResponse
		if json.Unmarshal(body, &jr) == nil && jr.Signed != "" {
			parts := strings.Split(jr.Signed, ".")
			payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
			payload = bytes.Replace(payload, []byte(`"role":"node"`), []byte(`"role":"site"`), 1)
			parts[1] = base64.RawURLEncoding.EncodeToString(payload)
			jr.Signed = strings.Join(parts, ".")
			body, _ = json.Marshal(jr)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		resp.ContentLength = int64(len(body))
		resp.Header.Del("Content-Length")
		return nil
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: proxy}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })

	mitm := newHost(t, cp, "fsn1")
	rewriteGateway(t, mitm.config, cp.gw, l.Addr().(*net.TCPAddr).String())
	r = bcd(t, []string{"BCD_JOIN_TOKEN=" + tok}, "", "join", "--config", mitm.config)
	if r.code != 1 {
		t.Errorf("tampered join response accepted: %s", r)
	}
	if _, err := os.Stat(filepath.Join(mitm.data, "identity.json")); err == nil {
		t.Error("identity written from a tampered answer")
	}

	// A gateway whose certificate is not from the pinned CA is refused outright.
	other, err := pki.Init(filepath.Join(t.TempDir(), "other"), pki.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wrongPin := newHost(t, cp, "fsn1")
	b, _ := os.ReadFile(wrongPin.config)
	b = bytes.Replace(b, []byte(bundle.Public.Pins().ServingCA), []byte(other.Pins().ServingCA), 1)
	os.WriteFile(wrongPin.config, b, 0o600)
	if r := bcd(t, []string{"BCD_JOIN_TOKEN=" + tok}, "", "join", "--config", wrongPin.config); r.code != 1 {
		t.Errorf("wrong serving CA pin: %s", r)
	}
}

func rewriteGateway(t *testing.T, config, from, to string) {
	t.Helper()
	b, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(config, bytes.Replace(b, []byte(from), []byte(to), 1), 0o600)
}
