package main

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/pki"
)

// TestServeMetricsListen: the better-compute serve process answers /metrics on
// --metrics-listen with its own metrics and the Go and process collectors; a bad
// address is a usage error naming the flag, a taken port fails the start.
func TestServeMetricsListen(t *testing.T) {
	pkiDir := filepath.Join(t.TempDir(), "pki")
	if _, err := pki.Init(pkiDir, pki.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd, _ := serveChild(t, "--pki", pkiDir, "--data", filepath.Join(t.TempDir(), "data"), "--listen", "127.0.0.1:0",
		"--gateway-listen", "127.0.0.1:0", "--metrics-listen", addr)
	var f metricstest.Families
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			f = metricstest.Scrape(t, "http://"+addr+"/metrics")
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on --metrics-listen %s", addr)
		}
	}
	if n := f.Get(t, "better_compute_machines", metricstest.Labels{"state": "registered"}); n != 0 {
		t.Errorf("a new store has %v registered machines", n)
	}
	if n := f.Get(t, "better_compute_sessions", metricstest.Labels{"role": "node"}); n != 0 {
		t.Errorf("%v node sessions before any node", n)
	}
	if f["go_goroutines"] == nil || f["process_cpu_seconds_total"] == nil {
		t.Errorf("no Go or process collector: %s", f.Names("go_"))
	}
	stop(t, cmd, syscall.SIGTERM)
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Error("the metrics port still listens after serve stopped")
	}

	for _, bad := range []struct{ addr, want string }{
		{"9464", `--metrics-listen: "9464" is not host:port`},
		{"127.0.0.1:0x", `--metrics-listen: "127.0.0.1:0x" has no valid port`},
		{"127.0.0.1:70000", `"127.0.0.1:70000" has no valid port`},
	} {
		code, _, errOut := runCLI(t, "", "serve", "--pki", pkiDir, "--data", t.TempDir(), "--metrics-listen", bad.addr)
		if code != 2 || !strings.Contains(errOut, bad.want) {
			t.Errorf("--metrics-listen %q: exit %d, %q; want 2 and %q", bad.addr, code, errOut, bad.want)
		}
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, _, errOut := runCLI(t, "", "serve", "--pki", pkiDir, "--data", t.TempDir(), "--listen", "127.0.0.1:0",
		"--gateway-listen", "127.0.0.1:0", "--metrics-listen", taken.Addr().String())
	if code != 1 || !strings.Contains(errOut, "--metrics-listen: metrics: listening on "+taken.Addr().String()) {
		t.Errorf("a taken metrics port: exit %d, %q", code, errOut)
	}
}
