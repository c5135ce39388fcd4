package main

import (
	"bytes"
	"fmt"
	"io"
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
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

func appendConfig(t *testing.T, path, s string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, s...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSiteConfigErrorsExit2: every configuration bcd site cannot run with is a
// usage error naming the key, before anything is opened.
func TestSiteConfigErrorsExit2(t *testing.T) {
	for _, c := range []struct{ boot, want string }{
		{"[boot]\nurl = \"http://10.20.0.2:8080\"\nproxy_dhcp = true\n", "[boot] proxy_dhcp needs server_ip and url (missing server_ip)"},
		{"[boot]\ntftp = \":69\"\ntftp_root = \"/srv/ipxe\"\n", "[boot] tftp needs server_ip and url (missing server_ip and url)"},
		{"[boot]\nlisten = \"0.0.0.0:8080\"\n", "[boot] needs url"},
		{"[boot]\nurl = \"http://10.20.0.2:8080\"\nserver_ip = \"10.20.0.2\"\ntftp = \":69\"\n", "[boot] tftp needs tftp_root"},
		{"[boot]\nurl = \"http://10.20.0.2:8080\"\nproxy_dhcp = \"yes\"\n", "[boot] proxy_dhcp must be a boolean"},
		{"[boot]\nurl = \"http://10.20.0.2:8080\"\nlisten = \"8080\"\n", "[boot] listen"},
	} {
		f := newCLIFixture(t)
		appendConfig(t, f.cfgPath, c.boot)
		code, _, stderr := runBcdIn(t, "", "site", "--config", f.cfgPath)
		if code != 2 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, f.cfgPath) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.boot, code, stderr, c.want)
		}
	}
}

// TestSiteRefusesANodeIdentity: bcd site on a data directory a node joined.
func TestSiteRefusesANodeIdentity(t *testing.T) {
	f := newCLIFixture(t)
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	code, _, stderr := runBcdIn(t, "", "site", "--config", f.cfgPath)
	if code != 1 || !strings.Contains(stderr, "holds the identity of node node_1") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

// TestSiteCLI: bcd join --role site, then bcd site with a [boot] section serves
// scripts on [boot] listen until SIGTERM, exits 0 and closes its listener.
func TestSiteCLI(t *testing.T) {
	f := newCLIFixture(t)
	f.g.Tokens["bcjt_site_token"] = agenttest.Token{Role: protocol.RoleSite, Site: "fsn1"}
	if code, out, errOut := runBcdIn(t, "bcjt_site_token", "join", "--role", "site", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join --role site: %d %s %s", code, out, errOut)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	appendConfig(t, f.cfgPath, fmt.Sprintf("[boot]\nlisten = %q\nurl = \"http://%s\"\nkernel = \"http://%s/k\"\ninitrd = \"http://%s/i\"\n", addr, addr, addr, addr))
	siteHooks = func(s *site.Site) {
		s.Backoff = agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	}
	defer func() { siteHooks = nil }()

	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() { done <- run([]string{"site", "--config", f.cfgPath}, strings.NewReader(""), &out, &errOut) }()
	deadline := time.Now().Add(10 * time.Second)
	for f.g.Sessions() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no session; log:\n%s", errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr + "/ipxe/52:54:00:12:34:56.ipxe")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "has no boot entry") {
		t.Errorf("script: %d %s", resp.StatusCode, body)
	}
	if hellos := f.g.Hellos(); len(hellos) == 0 || hellos[0].Role != protocol.RoleSite {
		t.Errorf("hellos %+v", hellos)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("bcd site after SIGTERM: exit %d\n%s", code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("bcd site did not stop on SIGTERM")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the boot HTTP server still listens after bcd site exited")
	}
	if !strings.Contains(errOut.String(), `"msg":"bcd site started"`) {
		t.Errorf("log is not JSON lines:\n%s", errOut.String())
	}
	if _, err := os.Stat(filepath.Join(f.dataDir, "journal.db")); err != nil {
		t.Errorf("journal: %v", err)
	}
}
