package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Sections of the report.
const (
	sectionDHCP = "proxyDHCP"
	sectionTFTP = "TFTP"
	sectionHTTP = "HTTP"
)

// benchCase is one row of the report: one load, measured against each server.
type benchCase struct {
	section, row, param string
	servers             []string // bcd first, then the peers
	load                func(*target) load
}

// buildCases lists the rows, in the order they run and print.
func buildCases(o options, l *lab) []benchCase {
	have := func(names ...string) []string {
		out := []string{serverBCD}
		for _, n := range names {
			if l.targets[n] != nil {
				out = append(out, n)
			}
		}
		return out
	}
	var cases []benchCase
	if slices.Contains(o.only, "dhcp") {
		for _, ex := range []bool{false, true} {
			row := "DISCOVER→OFFER"
			if ex {
				row = "+ REQUEST→ACK (4011)"
			}
			for _, n := range o.inflight {
				cases = append(cases, benchCase{
					section: sectionDHCP, row: row, param: fmt.Sprint(n), servers: have(serverDnsmasq),
					load: func(t *target) load {
						return load{Proto: "dhcp", Warmup: o.warmup, Duration: o.duration, Iface: t.clientIface,
							Server: t.serverIP.String(), ClientIP: t.clientIP.String(), Exchange: ex, Inflight: n, MACs: tableMACs}
					},
				})
			}
		}
	}
	if slices.Contains(o.only, "tftp") {
		for _, bs := range o.blksizes {
			for _, n := range o.tftpClients {
				cases = append(cases, benchCase{
					section: sectionTFTP, row: fmt.Sprint(bs), param: fmt.Sprint(n), servers: have(serverDnsmasq, serverTFTPHPA),
					load: func(t *target) load {
						return load{Proto: "tftp", Warmup: o.warmup, Duration: o.duration, Addr: t.serverIP.String() + ":69",
							File: tftpFile, FileSize: tftpSize, BlockSize: bs, Clients: n}
					},
				})
			}
		}
	}
	if slices.Contains(o.only, "http") {
		for _, n := range o.httpClients {
			cases = append(cases, benchCase{
				section: sectionHTTP, row: "kernel + initrd", param: fmt.Sprint(n), servers: have(serverNginx),
				load: func(t *target) load {
					base := fmt.Sprintf("http://%s:%d/ramdisk/", t.serverIP, httpPort)
					return load{Proto: "http", Warmup: o.warmup, Duration: o.duration, Clients: n,
						URLs: []string{base + "vmlinuz", base + "initrd"}}
				},
			})
		}
	}
	return cases
}

// machine is what the report says about where and when it ran.
type machine struct {
	start                 time.Time
	kernel, cpus          string
	loadBefore, loadAfter string
	peers                 []string
}

func describeMachine(p peerPaths) machine {
	m := machine{start: time.Now().UTC(), cpus: fmt.Sprint(runtime.NumCPU()), loadBefore: loadAverage()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	m.peers = append(m.peers, "bcd: this tree, "+runtime.Version())
	if p.dnsmasq != "" {
		m.peers = append(m.peers, firstLine(exec.Command(p.dnsmasq, "--version")))
	}
	if p.inTFTPD != "" {
		m.peers = append(m.peers, "in.tftpd "+firstLine(exec.Command(p.inTFTPD, "-V")))
	}
	if p.nginx != "" {
		m.peers = append(m.peers, firstLine(exec.Command(p.nginx, "-v")))
	}
	return m
}

func firstLine(cmd *exec.Cmd) string {
	out, _ := cmd.CombinedOutput()
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute figures: the machine is
// shared, and a busy one lowers every figure (the ratios less so).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// stat is the median of one server's runs of one case, and their spread.
type stat struct {
	median, min, max float64
	p99              float64 // DHCP: median of the runs' p99, ms
	retries, errors  int64
	unusable         int64
	sample           string
	n                int
}

func summarize(rs []result, metric func(result) float64) stat {
	var s stat
	if len(rs) == 0 {
		return s
	}
	vals := make([]float64, len(rs))
	p99s := make([]float64, len(rs))
	for i, r := range rs {
		vals[i], p99s[i] = metric(r), r.P99
		s.retries += r.Retries
		s.errors += r.Errors
		s.unusable += r.Unusable
		if s.sample == "" {
			s.sample = r.ErrorSample
		}
	}
	s.n = len(rs)
	s.median, s.p99 = median(vals), median(p99s)
	s.min, s.max = slices.Min(vals), slices.Max(vals)
	return s
}

// median of xs; for an even count, the mean of the middle two.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cell is a median with half its spread, as a percentage of it.
func cell(s stat, format string) string {
	if s.n == 0 {
		return "-"
	}
	v := fmt.Sprintf(format, s.median)
	if s.n > 1 && s.median > 0 {
		v += fmt.Sprintf(" ±%.0f%%", (s.max-s.min)/2/s.median*100)
	}
	return v
}

func ratio(a, b stat) string {
	if a.n == 0 || b.n == 0 || b.median == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a.median/b.median)
}

// writeReport prints the tables: per section, one row per case, a column per
// server, then bcd's ratio to each peer.
func writeReport(w io.Writer, m machine, o options, l *lab, cases []benchCase, res []map[string][]result) {
	fmt.Fprintf(w, "bootbench %s: Linux %s, %s CPUs shared by the servers and the clients\n", m.start.Format("2006-01-02 15:04 UTC"), m.kernel, m.cpus)
	fmt.Fprintf(w, "load average (1 5 15 min) before %s, after %s\n", m.loadBefore, m.loadAfter)
	for _, p := range m.peers {
		fmt.Fprintf(w, "  %s\n", p)
	}
	fmt.Fprintf(w, "each figure: median of %d runs of %s (after %s of warm-up), ± half the spread of the runs;\n", o.runs, o.duration, o.warmup)
	fmt.Fprintf(w, "servers alternated within each case; every server in its own network namespace, the clients in another, over veths\n")
	var notes []string
	for _, section := range []string{sectionDHCP, sectionTFTP, sectionHTTP} {
		var idx []int
		for i, c := range cases {
			if c.section == section {
				idx = append(idx, i)
			}
		}
		if len(idx) == 0 {
			continue
		}
		servers := cases[idx[0]].servers
		fmt.Fprintln(w)
		var metric func(result) float64
		unit := "%.0f"
		var head []string
		switch section {
		case sectionDHCP:
			fmt.Fprintf(w, "proxyDHCP: PXE clients (BIOS, %d MACs) answered per second, each waiting for its answer; p99 latency\n", tableMACs)
			metric, head = result.Rate, []string{"exchange", "in flight"}
		case sectionTFTP:
			fmt.Fprintf(w, "TFTP: a 1 MiB file (pin/tftp/v3 client, tsize), MiB/s received by all clients together\n")
			metric, unit, head = result.MiBps, "%.1f", []string{"blksize", "clients"}
		case sectionHTTP:
			fmt.Fprintf(w, "HTTP: each client fetches the kernel (%s) then a 30 MiB initrd, again and again; MiB/s received by all\n", l.kernel)
			metric, head = result.MiBps, []string{"files", "clients"}
		}
		var tb bytes.Buffer
		tw := tabwriter.NewWriter(&tb, 2, 8, 2, ' ', 0)
		for _, s := range servers {
			head = append(head, s)
			if section == sectionDHCP {
				head = append(head, "p99 ms")
			}
		}
		for _, s := range servers[1:] {
			head = append(head, "bcd/"+s)
		}
		fmt.Fprintln(tw, strings.Join(head, "\t"))
		for _, i := range idx {
			c := cases[i]
			row := []string{c.row, c.param}
			stats := map[string]stat{}
			for _, s := range servers {
				st := summarize(res[i][s], metric)
				stats[s] = st
				row = append(row, cell(st, unit))
				if section == sectionDHCP {
					row = append(row, fmt.Sprintf("%.2f", st.p99))
				}
				if st.errors > 0 || st.retries > 0 || st.unusable > 0 {
					notes = append(notes, fmt.Sprintf("%s %s %s, %s: %d retries, %d unusable answers, %d errors %s",
						section, c.row, c.param, s, st.retries, st.unusable, st.errors, quoteSample(st.sample)))
				}
			}
			for _, s := range servers[1:] {
				row = append(row, ratio(stats[serverBCD], stats[s]))
			}
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		tw.Flush()
		w.Write(tb.Bytes())
		writeCPUTable(w, section, servers, cases, idx, res, head[:2])
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nretries (a DHCP answer not seen within 250 ms) and errors, summed over the runs:")
		for _, n := range notes {
			fmt.Fprintln(w, "  "+n)
		}
	}
}

func quoteSample(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf("(first: %q)", s)
}

// writeCPUTable prints the servers' CPU time per answer (DHCP) or per MiB
// (TFTP, HTTP): what a busy machine does not distort, since it counts the work,
// not the turns on the cores a server got.
func writeCPUTable(w io.Writer, section string, servers []string, cases []benchCase, idx []int, res []map[string][]result, head []string) {
	metric, unit, what := result.CPUPerMiB, "%.2f", "ms of server CPU per MiB sent"
	if section == sectionDHCP {
		metric, unit, what = result.CPUPerOp, "%.1f", "µs of server CPU per answer (per exchange on the 4011 rows)"
	}
	fmt.Fprintf(w, "%s: %s, median of the runs; bcd/peer below 1: bcd spends less\n", section, what)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	head = slices.Clone(head)
	head = append(head, servers...)
	for _, s := range servers[1:] {
		head = append(head, "bcd/"+s)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, i := range idx {
		c := cases[i]
		row := []string{c.row, c.param}
		stats := map[string]stat{}
		for _, s := range servers {
			// The median only: the spread is the throughput table's.
			st := summarize(res[i][s], metric)
			stats[s] = st
			row = append(row, fmt.Sprintf(unit, st.median))
		}
		for _, s := range servers[1:] {
			row = append(row, ratio(stats[serverBCD], stats[s]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
}
