package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// testBundle is the PKI every gateway in this package serves with. Its serving CA is
// the only system root (SSL_CERT_FILE), set before anything in the process loads the
// system roots, so that --server is verified the way a host verifies it.
var testBundle *pki.Bundle

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "bcd-cmd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if _, err := pki.Init(filepath.Join(dir, "pki"), pki.InitOptions{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if testBundle, err = pki.LoadBundle(filepath.Join(dir, "pki")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		roots := filepath.Join(dir, "roots.pem")
		if err := os.WriteFile(roots, []byte(testBundle.Public.ServingCAPEM), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		os.Setenv("SSL_CERT_FILE", roots)
		os.Unsetenv("SSL_CERT_DIR")
		os.Unsetenv(join.EnvToken)
		joinHooks = func(o *join.Options) {
			o.Backoff = agent.Backoff{Initial: time.Millisecond, Max: 5 * time.Millisecond}
			o.MaxDeferral = 10 * time.Millisecond
			o.GiveUpAfter = 5 * time.Second
		}
		return m.Run()
	}()
	os.Exit(code)
}

func runBcdIn(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestJoinRefusesPositionalArgsWithoutEchoing(t *testing.T) {
	const secret = "bcjt_jt_01SECRETSECRET"
	want := "bcd join: takes no positional arguments\nbcd join reads the join token from BCD_JOIN_TOKEN or stdin, never from arguments\n"
	for _, args := range [][]string{
		{"join", secret},
		{"join", "--config", "/nonexistent/config.toml", secret},
		{"join", secret, "--role", "site"},
	} {
		code, stdout, stderr := runBcdIn(t, "", args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if stderr != want {
			t.Errorf("%q: stderr %q, want %q", args, stderr, want)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("%q: the token appears in the output", args)
		}
	}
	// Flag mistakes do not echo it either.
	for _, args := range [][]string{
		{"join", "-x" + secret},
		{"join", "--reset=" + secret},
		{"join", "---" + secret},
	} {
		code, stdout, stderr := runBcdIn(t, "", args...)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("%q: the token appears in the output: %q", args, stdout+stderr)
		}
	}
}

type cliFixture struct {
	g       *agenttest.Gateway
	etc     string
	dataDir string
	cfgPath string
}

func newCLIFixture(t *testing.T) *cliFixture {
	g := agenttest.NewFromBundle(t, testBundle)
	g.Tokens["bcjt_cli_token"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	f := &cliFixture{g: g, etc: t.TempDir(), dataDir: filepath.Join(t.TempDir(), "data")}
	f.cfgPath = g.WriteConfig(t, f.etc, f.dataDir)
	return f
}

func TestJoinAndAlreadyJoined(t *testing.T) {
	f := newCLIFixture(t)
	code, stdout, stderr := runBcdIn(t, "bcjt_cli_token\n", "join", "--config", f.cfgPath)
	if code != 0 || !strings.Contains(stdout, "joined as ") {
		t.Fatalf("join: exit %d\n%s%s", code, stdout, stderr)
	}
	if strings.Contains(stdout+stderr, "bcjt_cli_token") {
		t.Error("the token appears in the output")
	}
	id, err := agent.LoadIdentity(f.dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runBcdIn(t, "", "join", "--config", f.cfgPath)
	if code != 0 || stdout != "already joined as "+id.NodeID+"\n" {
		t.Fatalf("second join: exit %d, %q %q", code, stdout, stderr)
	}
}

func TestJoinRefusal(t *testing.T) {
	f := newCLIFixture(t)
	t.Setenv(join.EnvToken, "bcjt_not_known_secret")
	code, stdout, stderr := runBcdIn(t, "", "join", "--config", f.cfgPath)
	if code != 1 || !strings.Contains(stderr, protocol.CodeTokenUnknown) {
		t.Fatalf("exit %d, %q %q", code, stdout, stderr)
	}
	if strings.Contains(stdout+stderr, "bcjt_not_known_secret") {
		t.Error("the token appears in the output")
	}
}

func TestJoinFromWellKnownWithSystemRoots(t *testing.T) {
	f := newCLIFixture(t)
	api := f.g.API(t, nil)
	cfgPath := filepath.Join(t.TempDir(), "bcd", "config.toml")
	t.Setenv(join.EnvToken, "bcjt_cli_token")
	code, stdout, stderr := runBcdIn(t, "", "join", "--config", cfgPath, "--data-dir", f.dataDir, "--server", api.URL,
		"--serving-ca-pin", f.g.Pins.ServingCA, "--join-signing-pin", f.g.Pins.JoinSigning, "--join-encryption-pin", f.g.Pins.JoinEncryption)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	c, err := config.Load(cfgPath, configOptions())
	if err != nil {
		t.Fatal(err)
	}
	if c.GatewayURL != f.g.URL || c.Site != "fsn1" {
		t.Errorf("config = %+v", c)
	}
	// Without the pins a host build refuses, with the spec's message.
	if !buildmode.FakeHW {
		code, _, stderr = runBcdIn(t, "", "join", "--config", filepath.Join(t.TempDir(), "config.toml"), "--server", api.URL)
		want := "joining without config.toml needs --serving-ca-pin, --join-signing-pin and --join-encryption-pin from the install"
		if code != 2 || !strings.Contains(stderr, want) {
			t.Errorf("no pins: exit %d, %q", code, stderr)
		}
	}
}

func TestJoinWellKnownRedirectRefused(t *testing.T) {
	f := newCLIFixture(t)
	api := f.g.API(t, http.RedirectHandler("https://127.0.0.1:1/", http.StatusMovedPermanently))
	t.Setenv(join.EnvToken, "bcjt_cli_token")
	code, _, stderr := runBcdIn(t, "", "join", "--config", filepath.Join(t.TempDir(), "config.toml"), "--data-dir", f.dataDir,
		"--server", api.URL, "--serving-ca-pin", f.g.Pins.ServingCA, "--join-signing-pin", f.g.Pins.JoinSigning,
		"--join-encryption-pin", f.g.Pins.JoinEncryption)
	if code != 1 || !strings.Contains(stderr, "refusing to join") || !strings.Contains(stderr, "redirect") {
		t.Errorf("exit %d, %q", code, stderr)
	}
}

func TestJoinResetCLI(t *testing.T) {
	if !buildmode.FakeHW {
		testenv.NeedRoot(t)
	}
	f := newCLIFixture(t)
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	code, stdout, _ := runBcdIn(t, "", "join", "--config", f.cfgPath, "--reset")
	if code != 2 || !strings.Contains(stdout, agent.KeyFile+" -> ") {
		t.Fatalf("dry run: exit %d, %q", code, stdout)
	}
	if _, err := agent.LoadIdentity(f.dataDir, nil); err != nil {
		t.Fatalf("the dry run moved something: %v", err)
	}
	f.g.Tokens["bcjt_second"] = agenttest.Token{Role: protocol.RoleNode, Site: "fsn1"}
	code, stdout, stderr := runBcdIn(t, "bcjt_second\n", "join", "--config", f.cfgPath, "--reset", "--yes")
	if code != 0 || !strings.Contains(stdout, "moved ") || !strings.Contains(stdout, "joined as node_2") {
		t.Fatalf("reset --yes: exit %d\n%s%s", code, stdout, stderr)
	}
}

func TestNodeCLI(t *testing.T) {
	f := newCLIFixture(t)
	// Not joined yet.
	code, _, stderr := runBcdIn(t, "", "node", "--config", f.cfgPath)
	if code != 1 || !strings.Contains(stderr, "run bcd join first") {
		t.Fatalf("node before join: exit %d, %q", code, stderr)
	}
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	// A bad config is a usage error.
	bad := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(bad, []byte("retries = 1\n"), 0o600)
	if code, _, _ := runBcdIn(t, "", "node", "--config", bad); code != 2 {
		t.Errorf("bad config: exit %d, want 2", code)
	}

	// The real thing: runs until SIGTERM, then exits 0.
	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() { done <- run([]string{"node", "--config", f.cfgPath}, strings.NewReader(""), &out, &errOut) }()
	sock := filepath.Join(f.dataDir, "bcd.sock")
	deadline := time.Now().Add(10 * time.Second)
	for f.g.Sessions() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no session; log:\n%s", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c, err := net.Dial("unix", sock); err != nil {
		t.Errorf("status socket: %v", err)
	} else {
		c.Close()
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("bcd node after SIGTERM: exit %d\n%s", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bcd node did not stop on SIGTERM")
	}
	if !strings.Contains(errOut.String(), `"msg":"bcd node started"`) {
		t.Errorf("log is not JSON lines:\n%s", errOut.String())
	}
}

func TestDoctorCLI(t *testing.T) {
	f := newCLIFixture(t)
	code, stdout, _ := runBcdIn(t, "", "doctor", "--config", f.cfgPath)
	if code != 1 || !strings.Contains(stdout, "identity: fail: not joined") {
		t.Fatalf("doctor before join: exit %d\n%s", code, stdout)
	}
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	code, stdout, _ = runBcdIn(t, "", "doctor", "--config", f.cfgPath)
	// The test certificate lives a day: identity warns, nothing fails.
	if code != 0 || !strings.Contains(stdout, "config: ok") || !strings.Contains(stdout, "gateway: ok") {
		t.Fatalf("doctor after join: exit %d\n%s", code, stdout)
	}
	if code, _, _ := runBcdIn(t, "", "doctor", "extra"); code != 2 {
		t.Errorf("doctor with an argument: exit %d, want 2", code)
	}
}
