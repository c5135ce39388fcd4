package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/site"
)

func freeTCP(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// runUntilSIGTERM runs bcd args in this process until ready holds, calls
// during, then sends SIGTERM and expects exit 0; it returns the log.
func runUntilSIGTERM(t *testing.T, args []string, ready func() bool, during func()) string {
	t.Helper()
	done := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() { done <- run(args, strings.NewReader(""), &out, &errOut) }()
	for deadline := time.Now().Add(10 * time.Second); !ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
			<-done
			t.Fatalf("bcd %s not ready; log:\n%s", args[0], errOut.String())
		}
	}
	during()
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("bcd %s after SIGTERM: exit %d\n%s", args[0], code, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("bcd %s did not stop on SIGTERM", args[0])
	}
	return errOut.String()
}

// TestSiteMetricsCLI: bcd site with [metrics] listen serves /metrics (its own
// bcd_site_* beside go_* and process_*) while it runs, and closes the port when
// it exits; a port already taken fails the start naming [metrics] listen.
func TestSiteMetricsCLI(t *testing.T) {
	f := newCLIFixture(t)
	f.g.Tokens["bcjt_site_token"] = agenttest.Token{Role: protocol.RoleSite, Site: "fsn1"}
	if code, out, errOut := runBcdIn(t, "bcjt_site_token", "join", "--role", "site", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join --role site: %d %s %s", code, out, errOut)
	}
	httpAddr, metricsAddr := freeTCP(t), freeTCP(t)
	appendConfig(t, f.cfgPath, fmt.Sprintf("[boot]\nlisten = %q\nurl = \"http://%s\"\n\n[metrics]\nlisten = %q\n", httpAddr, httpAddr, metricsAddr))
	siteHooks = func(s *site.Site) {
		s.Backoff = agent.Backoff{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	}
	defer func() { siteHooks = nil }()

	var fams metricstest.Families
	log := runUntilSIGTERM(t, []string{"site", "--config", f.cfgPath}, func() bool { return f.g.Sessions() > 0 }, func() {
		fams = metricstest.Scrape(t, "http://"+metricsAddr+"/metrics")
	})
	if fams["bcd_site_bmc_operation_duration_seconds"] == nil || fams["go_goroutines"] == nil || fams["process_open_fds"] == nil {
		t.Errorf("scrape of bcd site: %s %s", fams.Names("bcd_site_"), fams.Names("go_"))
	}
	if !strings.Contains(log, `"msg":"metrics listening","url":"http://`+metricsAddr+`/metrics"`) {
		t.Errorf("no metrics line in the log:\n%s", log)
	}
	if c, err := net.DialTimeout("tcp", metricsAddr, time.Second); err == nil {
		c.Close()
		t.Error("the metrics port still listens after bcd site exited")
	}

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// The same file, with [metrics] listen on a taken port.
	b, _ := os.ReadFile(f.cfgPath)
	os.WriteFile(f.cfgPath, bytes.Replace(b, []byte(metricsAddr), []byte(taken.Addr().String()), 1), 0o600)
	code, _, stderr := runBcdIn(t, "", "site", "--config", f.cfgPath)
	if code != 1 || !strings.Contains(stderr, "bcd site: [metrics] listen: metrics: listening on "+taken.Addr().String()) {
		t.Errorf("a taken metrics port: exit %d, %q", code, stderr)
	}
}

// TestSiteMetricsBadListen: a bad [metrics] listen is a usage error naming the
// file, line and key, before anything is opened.
func TestSiteMetricsBadListen(t *testing.T) {
	f := newCLIFixture(t)
	appendConfig(t, f.cfgPath, "\n[metrics]\nlisten = \"localhost\"\n")
	code, _, stderr := runBcdIn(t, "", "site", "--config", f.cfgPath)
	if code != 2 || !strings.Contains(stderr, f.cfgPath+":") || !strings.Contains(stderr, `[metrics] listen: "localhost" is not host:port`) {
		t.Errorf("exit %d, %q", code, stderr)
	}
}

// TestNodeIgnoresMetrics: bcd node, which opens no TCP listener, runs with a
// [metrics] section (a site agent's on the same host), says it ignores it, and
// leaves the port closed.
func TestNodeIgnoresMetrics(t *testing.T) {
	f := newCLIFixture(t)
	if code, out, errOut := runBcdIn(t, "bcjt_cli_token", "join", "--config", f.cfgPath); code != 0 {
		t.Fatalf("join: %d %s %s", code, out, errOut)
	}
	addr := freeTCP(t)
	appendConfig(t, f.cfgPath, fmt.Sprintf("\n[metrics]\nlisten = %q\n", addr))
	log := runUntilSIGTERM(t, []string{"node", "--config", f.cfgPath}, func() bool { return f.g.Sessions() > 0 }, func() {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("bcd node listens on [metrics] listen %s", addr)
		}
	})
	if !strings.Contains(log, "ignoring [metrics]: bcd node serves no metrics") {
		t.Errorf("no warning about [metrics]:\n%s", log)
	}
}
