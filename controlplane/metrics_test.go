package controlplane

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/controlplane/cptest"
	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/protocol"
)

type labels = metricstest.Labels

// TestMetricsAfterDeployments: serve --metrics-listen after a real flow on
// loopback (a site agent's session, three machines PXE-booted by their BMC
// commands, their ramdisks joining with the nonce the site reported, two
// deployments provisioned and one failed by its image's digest, a ramdisk
// join with a nonce nobody minted) counts what the flow did: joins by
// attestor and code, sessions by role, machines by state, deployments by
// outcome with the image bytes, the site's events. About 3 s.
func TestMetricsAfterDeployments(t *testing.T) {
	l := newLabWith(t, labTimeouts, func(s *Server) { s.MetricsListen = "127.0.0.1:0" })
	url := l.s.MetricsURL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("MetricsURL %q", url)
	}
	ok1 := l.addMachine("52:54:00:00:10:01", false, nil)
	ok2 := l.addMachine("52:54:00:00:10:02", true, nil)
	bad := l.addMachine("52:54:00:00:10:03", false, func(fm *fakeMachine) { fm.deploy = deployDigestMismatch })
	for _, fm := range []*fakeMachine{ok1, ok2, bad} {
		l.deploy(fm)
	}
	for _, fm := range []*fakeMachine{ok1, ok2, bad} {
		l.waitEnd(fm)
	}
	// A ramdisk whose nonce no site reported.
	a := cptest.NewAgent(t)
	req := a.DiscoveryRequest("AAAAAAAAAAAAAAAAAAAAAA", "52:54:00:00:10:09")
	req.Site = cptest.Site
	if _, er := cptest.PostJoin(t, l.hc(), l.gw(), req); er == nil || er.Code != protocol.CodeNonceUnknown {
		t.Fatalf("join with an unknown nonce: %+v", er)
	}

	want := func(f metricstest.Families) []string {
		var bad []string
		check := func(name string, ls labels, want float64) {
			if got, ok := f.Sum(name, ls); !ok || got != want {
				bad = append(bad, fmt.Sprintf("%s%v = %v (present %v), want %v", name, ls, got, ok, want))
			}
		}
		check("better_compute_machines", labels{"state": "provisioned"}, 2)
		check("better_compute_machines", labels{"state": "failed"}, 1)
		check("better_compute_machines", labels{"state": "deploying"}, 0)
		check("better_compute_machines", labels{"state": "registered"}, 0)
		// The two provisioned machines' ramdisks are gone (kexec); the failed
		// one's stays up.
		check("better_compute_sessions", labels{"role": "site"}, 1)
		check("better_compute_sessions", labels{"role": "node"}, 2)
		check("better_compute_sessions", labels{"role": "ramdisk"}, 1)
		check("better_compute_joins_total", labels{"attestor": "join-token", "code": "OK"}, 1)
		check("better_compute_joins_total", labels{"attestor": "discovery", "code": "OK"}, 3)
		check("better_compute_joins_total", labels{"attestor": "provisioned", "code": "OK"}, 2)
		check("better_compute_deploy_duration_seconds", labels{"outcome": "provisioned"}, 2)
		check("better_compute_deploy_duration_seconds", labels{"outcome": "failed"}, 1)
		check("better_compute_deploy_duration_seconds", labels{"outcome": "cancelled"}, 0)
		check("better_compute_deploy_image_bytes_total", nil, 2*64<<20)
		check("better_compute_deploy_image_duration_seconds", nil, 2)
		if s, _ := f.HistogramSum("better_compute_deploy_image_duration_seconds", nil); s != 2.8 {
			bad = append(bad, fmt.Sprintf("deploy.image seconds sum %v, want 2 × 1.4", s))
		}
		// Each machine booted once: five stages and a nonce.
		check("better_compute_agent_events_total", labels{"kind": "machine.booted"}, 15)
		check("better_compute_agent_events_total", labels{"kind": "boot.nonce"}, 3)
		if n, _ := f.Sum("better_compute_joins_total", labels{"attestor": "discovery", "code": "NONCE_UNKNOWN"}); n < 1 {
			bad = append(bad, "no discovery join counted NONCE_UNKNOWN")
		}
		if n, _ := f.Sum("better_compute_join_refusals_total", nil); n < 1 {
			bad = append(bad, "the refused join is not in join_refusals_total")
		}
		if d, _ := f.HistogramSum("better_compute_deploy_duration_seconds", labels{"outcome": "provisioned"}); d <= 0 || d > 120 {
			bad = append(bad, fmt.Sprintf("provisioned deployments took %v s in all", d))
		}
		for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "promhttp_metric_handler_requests_total"} {
			if f[name] == nil {
				bad = append(bad, "no "+name)
			}
		}
		return bad
	}
	// Sessions close and the machines' count is cached for 5 s: wait for the
	// figures to settle.
	var problems []string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		f := metricstest.Scrape(t, url)
		if problems = want(f); len(problems) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flow:\n%s\nscrape has: %s", strings.Join(problems, "\n"), f.Names("better_compute_"))
		}
	}

	resp, err := http.Get(strings.TrimSuffix(url, "/metrics") + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET / on the metrics port: %s, want 404", resp.Status)
	}
}

// TestMetricsOffByDefault: without MetricsListen serve opens no metrics port.
func TestMetricsOffByDefault(t *testing.T) {
	s, out := startServer(t, newPKI(t), t.TempDir()+"/data", nil)
	if s.MetricsURL() != "" || strings.Contains(out.String(), "metrics listening") {
		t.Errorf("metrics without MetricsListen: %q\n%s", s.MetricsURL(), out.String())
	}
}
