package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestMain lets the test binary be the client process the coordinator starts
// (os.Executable is the test binary under go test).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "register" {
		if err := runRegister(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "client" {
		if err := runClient(os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestRunSmoke runs the whole benchmark briefly against bcd and dnsmasq: the
// namespaces, the servers, the client process for each protocol, the report, and
// that nothing is left behind.
func TestRunSmoke(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	testenv.NeedTool(t, "dnsmasq")
	if testing.Short() {
		t.Skip("starts servers in network namespaces for a few seconds")
	}
	var stdout, stderr bytes.Buffer
	args := []string{"-peers", "dnsmasq", "-runs", "1", "-warmup", "100ms", "-duration", "300ms",
		"-inflight", "4", "-tftp-clients", "2", "-blksizes", "1468", "-http-clients", "2", "-out", t.TempDir(), "-kernel", ""}
	if err := run(args, nil, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"proxyDHCP:", "DISCOVER→OFFER", "+ REQUEST→ACK (4011)", "TFTP:", "HTTP:", "bcd-lib/dnsmasq", "µs of server CPU per answer", "ms of server CPU per MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if regexp.MustCompile(`[1-9][0-9]* unusable answers`).MatchString(out) {
		t.Errorf("a server sent answers firmware would ignore:\n%s", out)
	}
	ns, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	// Only this process's namespaces: another benchmark may be running beside it.
	if mine := "bootbench" + strconv.Itoa(os.Getpid()); strings.Contains(string(ns), mine) {
		t.Errorf("namespaces left behind (%s*):\n%s", mine, ns)
	}
}

func TestParseFlags(t *testing.T) {
	for _, bad := range [][]string{
		{"-only", "ftp"},
		{"-peers", "apache"},
		{"-runs", "0"},
		{"-inflight", "0"},
		{"-inflight", "300"},
		{"-blksizes", "256"},
		{"-tftp-clients", "x"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	o, err := parseFlags([]string{"-only", "tftp, http", "-blksizes", "512,1468"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.only, ",") != "tftp,http" || len(o.blksizes) != 2 || o.runs != 3 {
		t.Errorf("options %+v", o)
	}
}

func TestSummarize(t *testing.T) {
	rs := []result{
		{Seconds: 2, Ops: 2000, P99: 3, Retries: 1},
		{Seconds: 1, Ops: 1200, P99: 1},
		{Seconds: 1, Ops: 800, P99: 2, Errors: 2, ErrorSample: "busy"},
	}
	s := summarize(rs, result.Rate)
	if s.median != 1000 || s.min != 800 || s.max != 1200 || s.p99 != 2 || s.retries != 1 || s.errors != 2 || s.sample != "busy" {
		t.Errorf("summarize: %+v", s)
	}
	if got := cell(s, "%.0f"); got != "1000 ±20%" {
		t.Errorf("cell %q", got)
	}
	if got := ratio(s, stat{median: 800, n: 1}); got != "1.25" {
		t.Errorf("ratio %q", got)
	}
	if got := ratio(s, stat{}); got != "-" {
		t.Errorf("ratio without a peer %q", got)
	}
	if median([]float64{4, 1, 3, 2}) != 2.5 {
		t.Error("median of an even count")
	}
}

func TestPercentile(t *testing.T) {
	var a, b []time.Duration
	for i := 1; i <= 100; i++ {
		if i%2 == 0 {
			a = append(a, time.Duration(i)*time.Millisecond)
		} else {
			b = append(b, time.Duration(i)*time.Millisecond)
		}
	}
	all := sortedDurations([][]time.Duration{a, b})
	if p := percentile(all, 99); p != 99 {
		t.Errorf("p99 %v ms", p)
	}
	if p := percentile(all, 50); p != 50 {
		t.Errorf("p50 %v ms", p)
	}
	if p := percentile(nil, 99); p != 0 {
		t.Errorf("p99 of nothing %v", p)
	}
}

func TestParseStatTicks(t *testing.T) {
	// A command name with spaces and a parenthesis, as /proc shows nginx's workers.
	line := "4242 (nginx: worker) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 7 3 11 2 20 0 1 0 6636 3133440 413 0"
	got, err := parseStatTicks(line)
	if err != nil || got != 23 {
		t.Errorf("parseStatTicks = %d, %v; want 23", got, err)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 a 3 0 0"} {
		if _, err := parseStatTicks(bad); err == nil {
			t.Errorf("parseStatTicks(%q) accepted", bad)
		}
	}
	if cpu, err := treeCPU(os.Getpid()); err != nil || cpu < 0 {
		t.Errorf("treeCPU(self) = %v, %v", cpu, err)
	}
}
