package metrics_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/internal/metrics/cpmetrics"
	"github.com/better-compute/bcd/internal/metrics/metricstest"
	"github.com/better-compute/bcd/internal/metrics/sitemetrics"
	"github.com/better-compute/bcd/site"
)

type noMachines struct{}

type noGateway struct{}

func (noGateway) SessionsByRole() map[string]int { return nil }
func (noGateway) JoinRefusals() uint64           { return 0 }

func (noMachines) CountMachinesByState(context.Context) (map[string]int, error) { return nil, nil }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported is every series name bcd site and serve export: each metric's
// name, and a histogram's _bucket, _sum and _count.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	cs := append([]prometheus.Collector{sitemetrics.New(&site.Site{})},
		cpmetrics.New(noGateway{}, noMachines{}).Collectors()...)
	names := map[string]bool{}
	for _, c := range cs {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				names[m[1]+suffix] = true
			}
		}
	}
	return names
}

// TestDashboard: deploy/grafana/bcd.json is a Grafana dashboard whose every
// panel queries metrics bcd site or serve export, and it has the storm's
// panels.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana/bcd.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("bcd.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("bcd.json has no title, uid or panels: %+v", d)
	}
	names := exported(t)
	ident := regexp.MustCompile(`\b(bcd_site_|better_compute_)[a-z0-9_]+\b`)
	used := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			ms := ident.FindAllString(tg.Expr, -1)
			if len(ms) == 0 {
				t.Errorf("panel %q: %q names no bcd metric", p.Title, tg.Expr)
			}
			for _, m := range ms {
				used[m] = true
				if !names[m] {
					t.Errorf("panel %q: %q names %s, which nothing exports", p.Title, tg.Expr, m)
				}
			}
		}
	}
	for _, storm := range []string{"bcd_site_dhcp_answers_total", "bcd_site_tftp_waits_total", "bcd_site_http_bytes_total",
		"bcd_site_events_coalesced_total", "better_compute_machines", "better_compute_sessions"} {
		if !used[storm] {
			t.Errorf("no panel shows %s", storm)
		}
	}
}

// TestCached: the query runs once per TTL however often it is scraped, and a
// failed one reports nothing and is tried again at the next scrape.
func TestCached(t *testing.T) {
	desc := prometheus.NewDesc("test_machines", "h", nil, nil)
	now := time.Unix(1000, 0)
	calls, fail := 0, false
	c := &metrics.Cached{Descs: []*prometheus.Desc{desc}, TTL: 5 * time.Second, Now: func() time.Time { return now },
		Query: func(context.Context) ([]prometheus.Metric, error) {
			calls++
			if fail {
				return nil, errors.New("store down")
			}
			return []prometheus.Metric{prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(calls))}, nil
		}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	value := func() (float64, error) {
		fams, err := reg.Gather()
		if len(fams) == 0 {
			return -1, err
		}
		return fams[0].GetMetric()[0].GetGauge().GetValue(), err
	}
	for range 3 {
		if v, err := value(); v != 1 || err != nil {
			t.Fatalf("within the TTL: %v %v", v, err)
		}
	}
	now = now.Add(5 * time.Second)
	fail = true
	if v, err := value(); v != -1 || err == nil || !strings.Contains(err.Error(), "store down") {
		t.Errorf("failed query: %v %v, want no value and the error", v, err)
	}
	fail = false
	if v, err := value(); v != 3 || err != nil || calls != 3 {
		t.Errorf("after a failure: %v %v (%d queries)", v, err, calls)
	}
}

// TestServer: /metrics answers, anything else is 404, Close frees the port;
// a bad address is refused with what is wrong.
func TestServer(t *testing.T) {
	srv, err := metrics.Listen("127.0.0.1:0", metrics.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(t.Context()) }()
	if f := metricstest.Scrape(t, srv.URL()); f["go_goroutines"] == nil || f["process_start_time_seconds"] == nil {
		t.Errorf("no Go or process collector: %s", f.Names("go_"))
	}
	for _, path := range []string{"/", "/metricsx", "/debug/pprof/"} {
		resp, err := http.Get("http://" + srv.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s", path, resp.Status)
		}
	}
	srv.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after Close: %v", err)
	}
	if _, err := http.Get(srv.URL()); err == nil {
		t.Error("still answering after Close")
	}
	for addr, want := range map[string]string{
		"9464":            `"9464" is not host:port`,
		"127.0.0.1:0":     `"127.0.0.1:0" has no valid port`,
		"127.0.0.1:65536": `has no valid port`,
		"a b:9464":        `"a b" is neither an IP address nor a host name`,
	} {
		if err := metrics.CheckAddr(addr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckAddr(%q) = %v, want %q", addr, err, want)
		}
	}
	if err := metrics.CheckAddr(":9464"); err != nil {
		t.Errorf("CheckAddr(:9464): %v", err)
	}
}
