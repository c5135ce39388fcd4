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
	section string
	keys    []string // the row's first columns: what the load is
	servers []string // bcd's (the site agent, the library), then the peers
	load    func(*target) load
}

// bcdServerNames are the bcd servers of this run, the headline first.
func (l *lab) bcdServerNames() []string {
	var out []string
	for _, n := range []string{serverSite, serverLib} {
		if l.targets[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

// buildCases lists the rows, in the order they run and print.
func buildCases(o options, l *lab) []benchCase {
	have := func(names ...string) []string {
		out := l.bcdServerNames()
		for _, n := range names {
			if l.targets[n] != nil {
				out = append(out, n)
			}
		}
		return out
	}
	// The shipped site knows the registered machines only; the library its own table.
	macs := tableMACs
	if l.targets[serverSite] != nil {
		macs = o.machines
	}
	var cases []benchCase
	if slices.Contains(o.only, "dhcp") {
		for _, fw := range []firmware{fwBIOS, fwUEFI} {
			for _, ex := range []bool{false, true} {
				row := "DISCOVER→OFFER"
				if ex {
					row = "+ REQUEST→ACK (4011)"
				}
				for _, n := range o.inflight {
					cases = append(cases, benchCase{
						section: sectionDHCP, keys: []string{fw.Name, row, fmt.Sprint(n)}, servers: have(serverDnsmasq),
						load: func(t *target) load {
							return load{Proto: "dhcp", Warmup: o.warmup, Duration: o.duration, Iface: t.clientIface,
								Server: t.serverIP.String(), ClientIP: t.clientIP.String(), Exchange: ex, Inflight: n, MACs: macs, Firmware: fw}
						},
					})
				}
			}
		}
	}
	if slices.Contains(o.only, "tftp") {
		for _, bs := range o.blksizes {
			for _, n := range o.tftpClients {
				cases = append(cases, benchCase{
					section: sectionTFTP, keys: []string{fmt.Sprint(bs), fmt.Sprint(n)}, servers: have(serverDnsmasq, serverTFTPHPA),
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
				section: sectionHTTP, keys: []string{"kernel + initrd", fmt.Sprint(n)}, servers: have(serverNginx),
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
	// The commit measured: results are compared across branches (before/after).
	rev := firstLine(exec.Command("git", "log", "-1", "--format=%h %s"))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		rev += " (with uncommitted changes)"
	}
	m.peers = append(m.peers, "bcd: this tree at "+rev+", "+runtime.Version())
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
	p50, p99         float64 // DHCP: median of the runs' p50 and p99, ms
	retries, errors  int64
	refused          int64 // TFTP ERROR packets, summed over the runs
	requests         int64 // TFTP read requests, summed over the runs
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
	p50s := make([]float64, len(rs))
	p99s := make([]float64, len(rs))
	for i, r := range rs {
		vals[i], p50s[i], p99s[i] = metric(r), r.P50, r.P99
		s.retries += r.Retries
		s.refused += r.Refused
		s.requests += r.Requests
		s.errors += r.Errors
		s.unusable += r.Unusable
		if s.sample == "" {
			s.sample = r.ErrorSample
		}
	}
	s.n = len(rs)
	s.median, s.p50, s.p99 = median(vals), median(p50s), median(p99s)
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

// writeReport prints the tables: the headline (bcd site against the peers)
// first, then the library level, each per section with one row per case, a
// column per server, then bcd's ratio to each peer.
func writeReport(w io.Writer, m machine, o options, l *lab, cases []benchCase, res []map[string][]result) {
	fmt.Fprintf(w, "bootbench %s: Linux %s, %s CPUs shared by the servers and the clients\n", m.start.Format("2006-01-02 15:04 UTC"), m.kernel, m.cpus)
	fmt.Fprintf(w, "load average (1 5 15 min) before %s, after %s\n", m.loadBefore, m.loadAfter)
	for _, p := range m.peers {
		fmt.Fprintf(w, "  %s\n", p)
	}
	fmt.Fprintf(w, "each figure: median of %d runs of %s (after %s of warm-up), ± half the spread of the runs;\n", o.runs, o.duration, o.warmup)
	fmt.Fprintf(w, "servers alternated within each case; every server in its own network namespace, the clients in another, over veths\n")
	var notes []string
	for _, bcd := range l.bcdServerNames() {
		fmt.Fprintln(w)
		if bcd == serverSite {
			fmt.Fprintf(w, "=== HEADLINE: the shipped binary. bcd-site is `bcd site --config` (%s), joined with a site token to a real\n", o.bcd)
			fmt.Fprintf(w, "    `better-compute serve` in its namespace, %d machines registered with boot ramdisk (half UEFI), default logging\n", o.machines)
			fmt.Fprintf(w, "    (info), event reporting on; its CPU and serve's are their cgroups'. The clients use the registered MACs.\n")
		} else {
			fmt.Fprintf(w, "=== LIBRARY LEVEL (not what ships): bcd-lib is boot.ProxyDHCP, boot.TFTPServer and boot.HTTPServer inside the\n")
			fmt.Fprintf(w, "    bootbench process, as bcd site configures them, without the site agent (no events, no serve); %d MACs in a\n", tableMACs)
			fmt.Fprintf(w, "    MemTable, MaxTransfers %d. Same peer measurements as the headline.\n", tftpMax)
		}
		for _, section := range []string{sectionDHCP, sectionTFTP, sectionHTTP} {
			notes = writeSection(w, section, bcd, l, cases, res, notes)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nretries (a DHCP answer not seen within 250 ms), refused TFTP transfers (ERROR packets) and errors, summed over the runs:")
		for _, n := range notes {
			fmt.Fprintln(w, "  "+n)
		}
	}
}

// writeSection prints one section's tables for bcd (serverSite or serverLib)
// against the peers, and returns notes with what went wrong.
func writeSection(w io.Writer, section, bcd string, l *lab, cases []benchCase, res []map[string][]result, notes []string) []string {
	var idx []int
	for i, c := range cases {
		if c.section == section {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return notes
	}
	var servers []string
	for _, s := range cases[idx[0]].servers {
		if s == bcd || (s != serverSite && s != serverLib) {
			servers = append(servers, s)
		}
	}
	fmt.Fprintln(w)
	var metric func(result) float64
	unit := "%.0f"
	var head []string
	switch section {
	case sectionDHCP:
		fmt.Fprintf(w, "proxyDHCP: PXE clients answered per second, each waiting for its answer; p50 and p99 latency in ms\n")
		metric, head = result.Rate, []string{"client", "exchange", "in flight"}
	case sectionTFTP:
		fmt.Fprintf(w, "TFTP: a 1 MiB file (pin/tftp/v3 client, tsize), MiB/s received by all clients together;\n  refused: requests answered with an ERROR packet / requests made, over all runs (firmware aborts its boot on one)\n")
		metric, unit, head = result.MiBps, "%.1f", []string{"blksize", "clients"}
	case sectionHTTP:
		fmt.Fprintf(w, "HTTP: each client fetches the kernel (%s) then a 30 MiB initrd, again and again; MiB/s received by all\n", l.kernel)
		metric, head = result.MiBps, []string{"files", "clients"}
	}
	keys := len(head)
	var tb bytes.Buffer
	tw := tabwriter.NewWriter(&tb, 2, 8, 2, ' ', 0)
	for _, s := range servers {
		head = append(head, s)
		switch section {
		case sectionDHCP:
			head = append(head, "p50", "p99")
		case sectionTFTP:
			head = append(head, "refused")
		}
	}
	for _, s := range servers[1:] {
		head = append(head, bcd+"/"+s)
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, i := range idx {
		c := cases[i]
		row := slices.Clone(c.keys)
		stats := map[string]stat{}
		for _, s := range servers {
			st := summarize(res[i][s], metric)
			stats[s] = st
			row = append(row, cell(st, unit))
			switch section {
			case sectionDHCP:
				row = append(row, fmt.Sprintf("%.2f", st.p50), fmt.Sprintf("%.2f", st.p99))
			case sectionTFTP:
				row = append(row, fmt.Sprintf("%d/%d", st.refused, st.requests))
			}
			if (s == bcd || bcd == serverSite) && (st.errors > 0 || st.retries > 0 || st.unusable > 0) {
				notes = append(notes, fmt.Sprintf("%s %s, %s: %d retries, %d unusable answers, %d refused, %d errors %s",
					section, strings.Join(c.keys, " "), s, st.retries, st.unusable, st.refused, st.errors, quoteSample(st.sample)))
			}
		}
		for _, s := range servers[1:] {
			row = append(row, ratio(stats[bcd], stats[s]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
	w.Write(tb.Bytes())
	writeCPUTable(w, section, bcd, servers, cases, idx, res, head[:keys])
	return notes
}

func quoteSample(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf("(first: %q)", s)
}

// writeCPUTable prints the servers' CPU time per answer (DHCP) or per MiB
// (TFTP, HTTP): what a busy machine does not distort, since it counts the work,
// not the turns on the cores a server got. For bcd site, serve's time (the
// events the site reports) is a column of its own and in the ratio.
func writeCPUTable(w io.Writer, section, bcd string, servers []string, cases []benchCase, idx []int, res []map[string][]result, head []string) {
	metric, unit, what := result.CPUPerMiB, "%.2f", "ms of server CPU per MiB sent"
	serveMetric := func(r result) float64 {
		if r.AllBytes == 0 {
			return 0
		}
		return float64(r.ServeCPU) / float64(time.Millisecond) / (float64(r.AllBytes) / (1 << 20))
	}
	if section == sectionDHCP {
		metric, unit, what = result.CPUPerOp, "%.1f", "µs of server CPU per answer (per exchange on the 4011 rows)"
		serveMetric = result.ServePerOp
	}
	site := bcd == serverSite
	if site {
		what += "; serve: better-compute serve's meanwhile, " + bcd + "+serve the two together"
	}
	fmt.Fprintf(w, "%s: %s, median of the runs; ratio below 1: bcd spends less\n", section, what)
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	head = slices.Clone(head)
	head = append(head, bcd)
	if site {
		head = append(head, "serve", bcd+"+serve")
	}
	head = append(head, servers[1:]...)
	for _, s := range servers[1:] {
		if site {
			head = append(head, "(bcd+serve)/"+s)
		} else {
			head = append(head, bcd+"/"+s)
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, i := range idx {
		c := cases[i]
		row := slices.Clone(c.keys)
		stats := map[string]stat{}
		for _, s := range servers {
			// The median only: the spread is the throughput table's.
			st := summarize(res[i][s], metric)
			stats[s] = st
			row = append(row, fmt.Sprintf(unit, st.median))
			if s == serverSite {
				sv := summarize(res[i][s], serveMetric)
				both := summarize(res[i][s], func(r result) float64 { return metric(r) + serveMetric(r) })
				stats[s] = both
				row = append(row, fmt.Sprintf(unit, sv.median), fmt.Sprintf(unit, both.median))
			}
		}
		for _, s := range servers[1:] {
			row = append(row, ratio(stats[bcd], stats[s]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
}
