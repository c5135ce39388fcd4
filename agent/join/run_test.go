package join

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

const goodToken = "bcjt_jt_01testtokenvalue"

type fixture struct {
	g       *agenttest.Gateway
	etc     string
	dataDir string
	out     *bytes.Buffer
	env     map[string]string
	o       Options
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	g := agenttest.New(t)
	g.Tokens[goodToken] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1", Pool: "pool_a"}
	f := &fixture{g: g, etc: t.TempDir(), dataDir: filepath.Join(t.TempDir(), "data"), out: new(bytes.Buffer), env: map[string]string{}}
	f.o = Options{
		ConfigPath:     g.WriteConfig(t, f.etc, f.dataDir),
		Getenv:         func(k string) string { return f.env[k] },
		Stdout:         f.out,
		IsRoot:         func() bool { return true },
		Claims:         func(context.Context) protocol.Claims { return protocol.Claims{Hostname: "test"} },
		Backoff:        agent.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		MaxDeferral:    10 * time.Millisecond,
		GiveUpAfter:    5 * time.Second,
		WellKnownRoots: g.RootPool(),
	}
	return f
}

func (f *fixture) run(t *testing.T) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return Run(ctx, f.o)
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *cli.ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}

func wantMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != want {
		t.Errorf("%s: mode %04o, want %04o", path, fi.Mode().Perm(), want)
	}
}

func TestJoinWritesIdentity(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if got := f.out.String(); !strings.Contains(got, "joined as node_1 (role node, site fsn1)") {
		t.Errorf("output %q", got)
	}
	wantMode(t, filepath.Join(f.dataDir, agent.KeyFile), 0o600)
	wantMode(t, filepath.Join(f.dataDir, agent.IdentityFile), 0o600)
	id, err := agent.LoadIdentity(f.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if id.NodeID != "node_1" || id.Role != "node" || id.Site != "fsn1" || id.Pool != "pool_a" || id.GatewayURL != f.g.URL {
		t.Errorf("identity = %+v", id)
	}
	joins := f.g.Joins()
	if len(joins) != 1 {
		t.Fatalf("%d join requests, want 1", len(joins))
	}
	req := joins[0]
	if req.Role != "node" || req.Attestor != protocol.AttestorJoinToken || req.Site != "fsn1" || req.Claims.Hostname != "test" {
		t.Errorf("join request = %+v", req)
	}
	body, _ := json.Marshal(req)
	if bytes.Contains(body, []byte(goodToken)) {
		t.Error("the join request carries the token in the clear")
	}
}

func TestJoinProvisioned(t *testing.T) {
	f := newFixture(t)
	f.g.Tokens["bcjt_prov"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1", NodeID: "node_prov"}
	f.env[EnvToken] = "bcjt_prov"
	f.o.NodeID = "node_prov"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if j := f.g.Joins()[0]; j.Attestor != protocol.AttestorProvisioned || j.NodeID != "node_prov" {
		t.Errorf("join request attestor %q node %q", j.Attestor, j.NodeID)
	}
	id, err := agent.LoadIdentity(f.dataDir, nil)
	if err != nil || id.NodeID != "node_prov" {
		t.Fatalf("identity %v, %v", id, err)
	}
}

// strayPin is a well-formed pin of a key nothing uses.
var strayPin = func() string {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p, _ := pki.SPKIPin(&k.PublicKey)
	return p
}()

func otherPin(t *testing.T) string {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pki.SPKIPin(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rewriteConfig(t *testing.T, path string, edit func(*config.Config)) {
	t.Helper()
	c, err := config.Load(path, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(c)
	if err := os.WriteFile(path, config.Format(c), 0o600); err != nil {
		t.Fatal(err)
	}
}

func wantRefused(t *testing.T, f *fixture, err error, substr string) {
	t.Helper()
	if exitCode(err) != 1 {
		t.Fatalf("exit %d (%v), want 1", exitCode(err), err)
	}
	t.Logf("refused: %v", err)
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("error %q does not say %q", err, substr)
	}
	if strings.Contains(err.Error(), goodToken) || strings.Contains(f.out.String(), goodToken) {
		t.Error("the token appears in the output")
	}
	if _, lerr := agent.LoadIdentity(f.dataDir, nil); !errors.Is(lerr, agent.ErrNotJoined) {
		t.Errorf("after a refused join LoadIdentity = %v, want ErrNotJoined", lerr)
	}
}

func TestWrongServingPinRefused(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	rewriteConfig(t, f.o.ConfigPath, func(c *config.Config) { c.ServingCASPKIPin = otherPin(t) })
	start := time.Now()
	err := f.run(t)
	wantRefused(t, f, err, "serving_ca_spki_pin")
	if time.Since(start) > 3*time.Second {
		t.Error("a pin mismatch was retried")
	}
	if n := len(f.g.Joins()); n != 0 {
		t.Errorf("%d join requests reached a gateway that failed the pin", n)
	}
}

func TestWrongEncryptionJWKRefused(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	jwk, err := pki.PublicJWK(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.etc, JWKFile), jwk, 0o644); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, f, f.run(t), "refusing to join")
	if n := len(f.g.Joins()); n != 0 {
		t.Errorf("%d join requests sent with a mismatched JWK", n)
	}
}

func TestMissingJWKWithoutServerRefused(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	os.Remove(filepath.Join(f.etc, JWKFile))
	wantRefused(t, f, f.run(t), JWKFile)
}

func TestMissingJWKFetchedWithServer(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	os.Remove(filepath.Join(f.etc, JWKFile))
	f.o.Server = f.g.API(t, nil).URL
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
}

func TestTamperedResponsesRefused(t *testing.T) {
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		name   string
		tamper func(*protocol.JoinResult)
		resp   func(*protocol.JoinResponse)
		want   string
	}{
		{name: "payload changed after signing", resp: func(r *protocol.JoinResponse) {
			parts := strings.Split(r.Signed, ".")
			var res protocol.JoinResult
			p, _ := decodeSegment(parts[1])
			json.Unmarshal(p, &res)
			res.NodeID = "node_evil"
			b, _ := json.Marshal(res)
			parts[1] = encodeSegment(b)
			r.Signed = strings.Join(parts, ".")
		}, want: "verify JWS"},
		{name: "signed by an unpinned key", resp: func(r *protocol.JoinResponse) {
			parts := strings.Split(r.Signed, ".")
			p, _ := decodeSegment(parts[1])
			r.Signed, _ = pki.Sign(otherKey, protocol.PurposeJoinResponse, p)
			pemKey, _ := publicPEM(&otherKey.PublicKey)
			r.SigningKey = pemKey
		}, want: "join_signing_key_pin"},
		{name: "for another CSR", tamper: func(r *protocol.JoinResult) {
			r.CSRSHA256 = strings.Repeat("0", 64)
		}, want: "another CSR"},
		{name: "wrong role", tamper: func(r *protocol.JoinResult) { r.Role = protocol.RoleSite }, want: "role"},
		{name: "wrong SPIFFE id", tamper: func(r *protocol.JoinResult) { r.NodeID = "node_other" }, want: "node certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.env[EnvToken] = goodToken
			f.g.Tamper, f.g.TamperResponse = tc.tamper, tc.resp
			wantRefused(t, f, f.run(t), tc.want)
		})
	}
}

func TestLeafForAnotherKeyRefused(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	f.g.Tamper = func(r *protocol.JoinResult) {
		_, csrPEM, _ := pki.NewKeyAndCSR()
		csr, _ := pki.ParseCSRPEM(csrPEM)
		der, _ := f.g.Bundle.IssueNodeCert(csr, r.Role, r.NodeID, time.Hour)
		r.CertChain = []string{agent.EncodeCerts(mustParse(t, der))}
	}
	wantRefused(t, f, f.run(t), "does not certify this node's key")
}

func TestDeferralRetriedWithSameCSR(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	f.g.Defer = 2
	f.g.Unavailable = 1
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	joins := f.g.Joins()
	if len(joins) != 4 {
		t.Fatalf("%d join requests, want 2 deferred, 1 unavailable, 1 answered", len(joins))
	}
	for i, j := range joins {
		if j.CSR != joins[0].CSR {
			t.Errorf("request %d has another CSR", i)
		}
	}
}

func TestRefusalIsNotRetried(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = "bcjt_unknown_secret"
	err := f.run(t)
	wantRefused(t, f, err, protocol.CodeTokenUnknown)
	if strings.Contains(err.Error(), "bcjt_unknown_secret") {
		t.Error("the refusal repeats the token")
	}
	if n := len(f.g.Joins()); n != 1 {
		t.Errorf("%d join requests, want 1", n)
	}
}

func TestNoTokenIsUsage(t *testing.T) {
	f := newFixture(t)
	err := f.run(t)
	if exitCode(err) != 2 || !errors.Is(err, ErrNoToken) && !strings.Contains(err.Error(), "no join token") {
		t.Fatalf("no token: exit %d, %v", exitCode(err), err)
	}
}

func TestTokenFromStdin(t *testing.T) {
	f := newFixture(t)
	f.o.Stdin = strings.NewReader("  " + goodToken + "\n")
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
}

func TestAlreadyJoinedNeedsNoToken(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	f.env = map[string]string{}
	f.out.Reset()
	tokenFile := filepath.Join(t.TempDir(), "join-token")
	os.WriteFile(tokenFile, []byte("bcjt_second\n"), 0o600)
	f.o.TokenFile = tokenFile
	f.o.Stdin = errReader{t}
	if err := f.run(t); err != nil {
		t.Fatalf("second join: %v", err)
	}
	if got := f.out.String(); got != "already joined as node_1\n" {
		t.Errorf("output %q, want already joined as node_1", got)
	}
	if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the token file stays after already joined: %v", err)
	}
	if n := len(f.g.Joins()); n != 1 {
		t.Errorf("%d join requests, want 1", n)
	}
}

type errReader struct{ t *testing.T }

func (r errReader) Read([]byte) (int, error) {
	r.t.Error("standard input was read")
	return 0, errors.New("no")
}

func TestTokenFileDeletedAfterSuccess(t *testing.T) {
	f := newFixture(t)
	tokenFile := filepath.Join(t.TempDir(), "join-token")
	os.WriteFile(tokenFile, []byte(goodToken+"\n"), 0o600)
	f.o.TokenFile = tokenFile
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tokenFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the token file stays after the join: %v", err)
	}
}

func TestTokenFileKeptAfterFailure(t *testing.T) {
	f := newFixture(t)
	tokenFile := filepath.Join(t.TempDir(), "join-token")
	os.WriteFile(tokenFile, []byte("bcjt_unknown\n"), 0o600)
	f.o.TokenFile = tokenFile
	if err := f.run(t); exitCode(err) != 1 {
		t.Fatalf("exit %d: %v", exitCode(err), err)
	}
	if _, err := os.Stat(tokenFile); err != nil {
		t.Errorf("the token file went after a failed join: %v", err)
	}
}

func TestTokenFileAndEnvBothIsUsage(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	f.o.TokenFile = "/nonexistent"
	if err := f.run(t); exitCode(err) != 2 {
		t.Fatalf("exit %d: %v", exitCode(err), err)
	}
}

func TestForeignJournalMovedAside(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	os.MkdirAll(f.dataDir, 0o700)
	jpath := filepath.Join(f.dataDir, journal.FileName)
	j, err := journal.Open(jpath, "node_old", journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(jpath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old journal was not moved: %v", err)
	}
	moved, _ := filepath.Glob(jpath + ".node-node_old-*")
	if len(moved) != 1 {
		t.Errorf("moved journals: %v", moved)
	}
}

func TestResetDryRunAndMove(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	jpath := filepath.Join(f.dataDir, journal.FileName)
	j, err := journal.Open(jpath, "node_1", journal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	j.Close()
	files := []string{filepath.Join(f.dataDir, agent.KeyFile), filepath.Join(f.dataDir, agent.IdentityFile), jpath}

	// Dry run: says what it would move, moves nothing, exits 2.
	f.out.Reset()
	f.env = map[string]string{}
	f.o.Reset = true
	err = f.run(t)
	if exitCode(err) != 2 {
		t.Fatalf("dry run exit %d (%v), want 2", exitCode(err), err)
	}
	for _, p := range files {
		if !strings.Contains(f.out.String(), p+" -> "+p+".reset-") {
			t.Errorf("dry run does not mention %s:\n%s", p, f.out.String())
		}
		if _, err := os.Stat(p); err != nil {
			t.Errorf("dry run moved %s", p)
		}
	}

	// --yes moves all three, then joins; without a token the join fails and no
	// identity loads.
	f.o.Yes = true
	f.o.Now = func() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }
	err = f.run(t)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "no join token") {
		t.Fatalf("reset without a token: exit %d, %v", exitCode(err), err)
	}
	for _, p := range files {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s not moved", p)
		}
		if _, err := os.Stat(p + ".reset-20250102T030405Z"); err != nil {
			t.Errorf("%s not moved aside: %v", p, err)
		}
	}
	if _, err := agent.LoadIdentity(f.dataDir, nil); !errors.Is(err, agent.ErrNotJoined) {
		t.Errorf("after reset LoadIdentity = %v", err)
	}

	// A plain join then joins as a new node.
	f.o.Reset, f.o.Yes = false, false
	f.g.Tokens["bcjt_again"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f.env[EnvToken] = "bcjt_again"
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	if id, err := agent.LoadIdentity(f.dataDir, nil); err != nil || id.NodeID != "node_2" {
		t.Errorf("after rejoin: %v, %v", id, err)
	}
}

func TestResetNeedsRoot(t *testing.T) {
	f := newFixture(t)
	f.o.Reset, f.o.Yes = true, true
	f.o.IsRoot = func() bool { return false }
	err := f.run(t)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "run it as root") {
		t.Fatalf("non-root reset: exit %d, %v", exitCode(err), err)
	}
	f.o.FakeHW = true // a development build lets anyone reset
	f.o.Yes = false
	if err := f.run(t); exitCode(err) != 2 {
		t.Fatalf("fakehw dry run: exit %d, %v", exitCode(err), err)
	}
}

func TestIdentityThatDoesNotLoadIsNotOverwritten(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pemKey, _ := pki.MarshalPKCS8PEM(k)
	os.WriteFile(filepath.Join(f.dataDir, agent.KeyFile), pemKey, 0o600)
	err := f.run(t)
	if exitCode(err) != 1 || !strings.HasSuffix(err.Error(), ResetHint) {
		t.Fatalf("exit %d, %v", exitCode(err), err)
	}
}

func TestJoinHandsTheIdentityToTheNode(t *testing.T) {
	testenv.NeedRoot(t)
	u, err := user.Lookup("nobody")
	if err != nil {
		testenv.Skip(t, "no user nobody: "+err.Error())
	}
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	rewriteConfig(t, f.o.ConfigPath, func(c *config.Config) { c.Helper = &config.Helper{User: "nobody"} })
	f.o.IsRoot = func() bool { return os.Geteuid() == 0 }
	handedOver := func(when string) {
		t.Helper()
		for _, name := range []string{agent.KeyFile, agent.IdentityFile} {
			fi, err := os.Lstat(filepath.Join(f.dataDir, name))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if strconv.Itoa(int(st.Uid)) != u.Uid || strconv.Itoa(int(st.Gid)) != u.Gid {
				t.Errorf("%s: %s owned by %d:%d, want %s:%s", when, name, st.Uid, st.Gid, u.Uid, u.Gid)
			}
		}
	}
	// A new join.
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	handedOver("after a new join")
	// An already joined machine whose files are root's (a join from before
	// [helper] was added, or an operator's chown): the rerun hands them over.
	for _, name := range []string{agent.KeyFile, agent.IdentityFile} {
		if err := os.Lchown(filepath.Join(f.dataDir, name), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	f.out.Reset()
	if err := f.run(t); err != nil || !strings.Contains(f.out.String(), "already joined as ") {
		t.Fatalf("the second join: %v, %q, want already joined", err, f.out.String())
	}
	handedOver("after an already joined run")
}

// The bootstrap from the well-known document.

func bootstrapFixture(t *testing.T) *fixture {
	f := newFixture(t)
	os.Remove(f.o.ConfigPath)
	os.Remove(filepath.Join(f.etc, JWKFile))
	f.o.ConfigPath = filepath.Join(f.etc, "bcd", "config.toml")
	f.o.DataDir = f.dataDir
	f.o.Pins = f.g.Pins
	f.env[EnvToken] = goodToken
	return f
}

func TestBootstrapWritesConfig(t *testing.T) {
	f := bootstrapFixture(t)
	f.o.Server = f.g.API(t, nil).URL
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
	wantMode(t, f.o.ConfigPath, 0o600)
	jwkPath := filepath.Join(filepath.Dir(f.o.ConfigPath), JWKFile)
	wantMode(t, jwkPath, 0o644)
	c, err := config.Load(f.o.ConfigPath, config.ParseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.GatewayURL != f.g.URL || c.Site != "fsn1" || c.ServingCASPKIPin != f.g.Pins.ServingCA ||
		c.JoinSigningKeyPin != f.g.Pins.JoinSigning || c.JoinEncryptionKeyPin != f.g.Pins.JoinEncryption || c.DataDir != f.dataDir {
		t.Errorf("config = %+v", c)
	}
	jwk, _ := os.ReadFile(jwkPath)
	if _, err := pki.JWKMatchesPin(jwk, c.JoinEncryptionKeyPin); err != nil {
		t.Error(err)
	}
	// A second run finds config.toml and the identity: already joined.
	f.out.Reset()
	f.env = map[string]string{}
	if err := f.run(t); err != nil || !strings.Contains(f.out.String(), "already joined as node_1") {
		t.Fatalf("rerun: %v, %q", err, f.out.String())
	}
}

func TestBootstrapNeedsThreePins(t *testing.T) {
	f := bootstrapFixture(t)
	f.o.Server = f.g.API(t, nil).URL
	f.o.Pins.JoinSigning = ""
	err := f.run(t)
	want := "joining without config.toml needs --serving-ca-pin, --join-signing-pin and --join-encryption-pin from the install"
	if exitCode(err) != 2 || !strings.Contains(err.Error(), want) {
		t.Fatalf("exit %d, %v", exitCode(err), err)
	}
	// A fakehw build takes them from the document.
	f.o.FakeHW = true
	f.o.Pins = pki.Pins{}
	if err := f.run(t); err != nil {
		t.Fatalf("fakehw without pins: %v", err)
	}
}

func TestBootstrapRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(g *agenttest.Gateway) http.Handler
		pins    func(p *pki.Pins)
		want    string
	}{
		{name: "published pin differs", pins: func(p *pki.Pins) { p.ServingCA = strayPin }, want: "refusing to join"},
		{name: "missing gateway.url", handler: func(g *agenttest.Gateway) http.Handler {
			doc := g.WellKnown()
			doc.Gateway = nil
			return jsonHandler(doc)
		}, want: "install /etc/bcd/config.toml instead"},
		{name: "redirect", handler: func(g *agenttest.Gateway) http.Handler {
			return http.RedirectHandler("https://127.0.0.1:1/elsewhere", http.StatusFound)
		}, want: "redirect"},
		{name: "over 64 KiB", handler: func(g *agenttest.Gateway) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write([]byte(`{"pad":"`))
				w.Write(bytes.Repeat([]byte("a"), 70<<10))
				w.Write([]byte(`"}`))
			})
		}, want: "limit"},
		{name: "jwk for another key", handler: func(g *agenttest.Gateway) http.Handler {
			doc := g.WellKnown()
			k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			doc.Join.EncryptionJWK, _ = pki.PublicJWK(&k.PublicKey)
			return jsonHandler(doc)
		}, want: "refusing to join"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := bootstrapFixture(t)
			var h http.Handler
			if tc.handler != nil {
				h = tc.handler(f.g)
			}
			f.o.Server = f.g.API(t, h).URL
			if tc.pins != nil {
				tc.pins(&f.o.Pins)
			}
			wantRefused(t, f, f.run(t), tc.want)
			if _, err := os.Stat(f.o.ConfigPath); !errors.Is(err, os.ErrNotExist) {
				t.Error("a refused bootstrap wrote config.toml")
			}
		})
	}
}

func TestConfigWinsOverPinFlags(t *testing.T) {
	f := newFixture(t)
	f.env[EnvToken] = goodToken
	f.o.Pins.ServingCA = otherPin(t)
	wantRefused(t, f, f.run(t), "the configuration wins")
	f.o.Pins.ServingCA = f.g.Pins.ServingCA // the same pin is fine
	if err := f.run(t); err != nil {
		t.Fatal(err)
	}
}

func jsonHandler(v any) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	})
}

func decodeSegment(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
func encodeSegment(b []byte) string          { return base64.RawURLEncoding.EncodeToString(b) }

func publicPEM(pub *ecdsa.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), nil
}

func mustParse(t *testing.T, der []byte) []*x509.Certificate {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return []*x509.Certificate{c}
}

func TestTokenFileOnReadOnlyMountWarns(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=0700"); err != nil {
		testenv.Skip(t, "cannot mount a tmpfs: "+err.Error())
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	tokenFile := filepath.Join(dir, "join-token")
	if err := os.WriteFile(tokenFile, []byte(goodToken+"\n"), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		testenv.Skip(t, "cannot remount read-only: "+err.Error())
	}
	f := newFixture(t)
	var logs bytes.Buffer
	f.o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	f.o.TokenFile = tokenFile
	if err := f.run(t); err != nil {
		t.Fatalf("join with a token on a read-only mount: %v", err)
	}
	if !strings.Contains(logs.String(), "read-only") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), goodToken) {
		t.Error("the token appears in the log")
	}
	if _, err := os.Stat(tokenFile); err != nil {
		t.Errorf("the token file: %v", err)
	}
}
