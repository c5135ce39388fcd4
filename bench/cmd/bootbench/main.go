package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bootbench:", err)
		os.Exit(1)
	}
}

// options are the coordinator's flags.
type options struct {
	only                               []string
	warmup, duration, timeout          time.Duration
	runs                               int
	out, kernel, inTFTPD               string
	peers                              []string
	inflight, tftpClients, httpClients []int
	blksizes                           []int
	keep                               bool
	cpuprofile                         string
	hold                               bool
	// The headline mode: the bcd and better-compute binaries, and how many
	// machines serve registers. library adds the in-process boot servers.
	bcd, betterCompute string
	machines           int
	library            bool
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "client" {
		// The load generator, started by the coordinator inside the client namespace.
		return runClient(stdin, stdout)
	}
	if len(args) > 0 && args[0] == "register" {
		// The operator's bulk registration, started in the site agent's namespace.
		return runRegister(stdin, stdout)
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root: it creates network namespaces and binds ports 67, 68 and 69 inside them")
	}
	peers, err := findPeers(o)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to run its clients: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	ctx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()

	dir, err := os.MkdirTemp("", "bootbench-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintln(stderr, "bootbench: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	env := describeMachine(peers)
	shipped := shippedBinaries{bcd: o.bcd, betterCompute: o.betterCompute, machines: o.machines}
	l, err := newLab(ctx, dir, o.kernel, peers, shipped, o.library, exe, stderr)
	if err != nil {
		return err
	}
	defer l.close(stderr)

	if o.hold {
		for _, t := range l.targets {
			fmt.Fprintf(stdout, "%s: namespace %s, address %s; clients: namespace %s, interface %s\n", t.name, t.ns.Name, t.serverIP, l.client.Name, t.clientIface)
		}
		fmt.Fprintln(stdout, "files in", dir, "- ^C stops the servers and deletes the namespaces")
		<-ctx.Done()
		return nil
	}
	cases := buildCases(o, l)
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	res := make([]map[string][]result, len(cases))
	for i, c := range cases {
		res[i] = map[string][]result{}
		for r := range o.runs {
			// Alternate the order from run to run, so that no server always goes
			// first (or always runs right after the heaviest one).
			order := append(slices.Clone(c.servers[r%len(c.servers):]), c.servers[:r%len(c.servers)]...)
			for _, name := range order {
				what := strings.Join(c.keys, " ")
				fmt.Fprintf(stderr, "bootbench: %s %s, run %d: %s ... ", c.section, what, r+1, name)
				got, err := measure(ctx, l, exe, name, c.load(l.targets[name]))
				if err != nil {
					fmt.Fprintln(stderr)
					return fmt.Errorf("%s %s against %s: %w", c.section, what, name, err)
				}
				fmt.Fprintln(stderr, got.summary(c.section))
				res[i][name] = append(res[i][name], got)
			}
		}
	}
	env.loadAfter = loadAverage()
	var report bytes.Buffer
	writeReport(&report, env, o, l, cases, res)
	if _, err := stdout.Write(report.Bytes()); err != nil {
		return err
	}
	if o.out != "" {
		if err := os.MkdirAll(o.out, 0o755); err != nil {
			return err
		}
		path := filepath.Join(o.out, "boot-"+env.start.Format("2006-01-02")+".txt")
		if err := os.WriteFile(path, report.Bytes(), 0o644); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "bootbench: wrote", path)
	}
	return nil
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("bootbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	only := fs.String("only", "dhcp,tftp,http", "the protocols to measure")
	fs.DurationVar(&o.warmup, "warmup", 500*time.Millisecond, "load before each measured window, not counted")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "length of each measured window")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "the whole run's limit")
	fs.IntVar(&o.runs, "runs", 3, "measurements per server and case; the table shows their median")
	fs.StringVar(&o.out, "out", "bench/results", "directory for boot-<date>.txt; empty writes none")
	kernel := ".cache/kernel/current/vmlinuz"
	if _, err := os.Stat(kernel); err != nil {
		kernel = ""
	}
	fs.StringVar(&o.kernel, "kernel", kernel, "the kernel served over HTTP; empty uses 8 MiB of random bytes")
	fs.StringVar(&o.inTFTPD, "in-tftpd", "", "tftp-hpa's in.tftpd; empty looks on PATH, then in .cache/tftpd-hpa (bench/run.sh puts it there)")
	peers := fs.String("peers", "dnsmasq,tftp-hpa,nginx", "the peers to run beside bcd")
	inflight := fs.String("inflight", "1,16,64", "proxyDHCP requests in flight")
	tftpClients := fs.String("tftp-clients", "1,16,64,256", "concurrent TFTP clients")
	blksizes := fs.String("blksizes", "512,1468", "TFTP block sizes")
	httpClients := fs.String("http-clients", "1,64,256", "concurrent HTTP clients")
	fs.BoolVar(&o.keep, "keep", false, "keep the files, configurations and peer logs")
	fs.BoolVar(&o.hold, "hold", false, "start the servers, print where they are, and wait for ^C instead of measuring")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of bcd's library servers (this process) to this file")
	fs.StringVar(&o.bcd, "bcd", "", "the bcd binary to run as `bcd site` (the headline); empty measures the library only")
	fs.StringVar(&o.betterCompute, "better-compute", "", "the better-compute binary whose serve the site joins (with -bcd)")
	fs.IntVar(&o.machines, "machines", 1000, "machines registered with boot ramdisk, whose MACs the clients use (with -bcd)")
	fs.BoolVar(&o.library, "library", true, "also measure bcd's boot library in this process (the second table)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (flags only, or \"client\")", fs.Arg(0))
	}
	if o.runs < 1 || o.duration <= 0 || o.warmup < 0 {
		return o, errors.New("-runs must be at least 1 and -duration positive")
	}
	o.only = splitList(*only)
	for _, p := range o.only {
		if p != "dhcp" && p != "tftp" && p != "http" {
			return o, fmt.Errorf("-only: unknown protocol %q (dhcp, tftp, http)", p)
		}
	}
	o.peers = splitList(*peers)
	for _, p := range o.peers {
		if p != serverDnsmasq && p != serverTFTPHPA && p != serverNginx {
			return o, fmt.Errorf("-peers: unknown peer %q (dnsmasq, tftp-hpa, nginx)", p)
		}
	}
	for _, f := range []struct {
		name string
		val  string
		dst  *[]int
		max  int
	}{
		{"inflight", *inflight, &o.inflight, 255},
		{"tftp-clients", *tftpClients, &o.tftpClients, tftpMax},
		{"blksizes", *blksizes, &o.blksizes, 1468},
		{"http-clients", *httpClients, &o.httpClients, 4096},
	} {
		for _, s := range splitList(f.val) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > f.max {
				return o, fmt.Errorf("-%s: %q is not a number from 1 to %d", f.name, s, f.max)
			}
			*f.dst = append(*f.dst, n)
		}
	}
	if (o.bcd == "") != (o.betterCompute == "") {
		return o, errors.New("-bcd and -better-compute go together: bcd site joins that better-compute's serve")
	}
	if o.bcd == "" && !o.library {
		return o, errors.New("nothing of bcd's to measure: give -bcd and -better-compute, or leave -library on")
	}
	if o.bcd != "" {
		for _, p := range []*string{&o.bcd, &o.betterCompute} {
			abs, err := filepath.Abs(*p)
			if err == nil {
				*p = abs
			}
			if fi, err := os.Stat(*p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return o, fmt.Errorf("%s is not an executable (bench/run.sh builds bcd and better-compute into .cache/bench)", *p)
			}
		}
		if o.machines < 1 || o.machines > 65536 {
			return o, fmt.Errorf("-machines %d: want 1 to 65536", o.machines)
		}
	}
	for _, b := range o.blksizes {
		if b < 512 {
			return o, fmt.Errorf("-blksizes: %d is below TFTP's 512", b)
		}
	}
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// findPeers finds the executables of the peers asked for, naming the Debian
// package of any that is missing.
func findPeers(o options) (peerPaths, error) {
	var p peerPaths
	var missing []string
	for _, name := range o.peers {
		switch name {
		case serverDnsmasq:
			path, err := exec.LookPath("dnsmasq")
			if err != nil {
				missing = append(missing, "dnsmasq (Debian package dnsmasq-base)")
			}
			p.dnsmasq = path
		case serverNginx:
			path, err := exec.LookPath("nginx")
			if err != nil {
				missing = append(missing, "nginx (Debian package nginx-light)")
			}
			p.nginx = path
		case serverTFTPHPA:
			path := o.inTFTPD
			if path == "" {
				path, _ = exec.LookPath("in.tftpd")
			}
			if path == "" {
				if _, err := os.Stat(".cache/tftpd-hpa/usr/sbin/in.tftpd"); err == nil {
					path, _ = filepath.Abs(".cache/tftpd-hpa/usr/sbin/in.tftpd")
				}
			}
			if path == "" {
				missing = append(missing, "in.tftpd (Debian package tftpd-hpa; bench/run.sh unpacks it into .cache/tftpd-hpa without its service)")
			}
			p.inTFTPD = path
		}
	}
	if len(missing) > 0 {
		return p, fmt.Errorf("missing peers: %s; or leave them out with -peers", strings.Join(missing, ", "))
	}
	return p, nil
}

// measure runs one load against server from the client namespace, in a process
// of its own, and returns what it measured with the CPU time the server spent
// meanwhile. The process is killed by its PID if it overruns.
func measure(ctx context.Context, l *lab, exe, server string, ld load) (result, error) {
	spec, err := json.Marshal(ld)
	if err != nil {
		return result{}, err
	}
	cpuBefore, err := l.serverCPU(server)
	if err != nil {
		return result{}, fmt.Errorf("CPU time of %s: %w", server, err)
	}
	var serveBefore time.Duration
	if server == serverSite {
		if serveBefore, err = l.serverCPU(serverServe); err != nil {
			return result{}, fmt.Errorf("CPU time of serve: %w", err)
		}
	}
	cmd := l.client.Command(exe, "client")
	cmd.Stdin = bytes.NewReader(spec)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return result{}, fmt.Errorf("starting the client: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	limit := time.NewTimer(ld.Warmup + ld.Duration + time.Minute)
	defer limit.Stop()
	select {
	case err = <-done:
	case <-limit.C:
		cmd.Process.Kill()
		<-done
		return result{}, errors.New("the client overran its time and was killed")
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return result{}, ctx.Err()
	}
	if err != nil {
		return result{}, fmt.Errorf("client: %w: %s", err, bytes.TrimSpace(errOut.Bytes()))
	}
	// Let tftp-hpa reap the children of the last transfers, so that their time
	// is counted.
	time.Sleep(100 * time.Millisecond)
	cpuAfter, err := l.serverCPU(server)
	if err != nil {
		return result{}, fmt.Errorf("CPU time of %s: %w", server, err)
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return result{}, fmt.Errorf("client output %q: %w", out.String(), err)
	}
	r.ServerCPU = cpuAfter - cpuBefore
	if server == serverSite {
		serveAfter, err := l.serverCPU(serverServe)
		if err != nil {
			return result{}, fmt.Errorf("CPU time of serve: %w", err)
		}
		r.ServeCPU = serveAfter - serveBefore
	}
	if r.Seconds <= 0 {
		return result{}, errors.New("client measured an empty window")
	}
	return r, nil
}

// summary is one line of progress.
func (r result) summary(section string) string {
	s := ""
	switch section {
	case sectionDHCP:
		s = fmt.Sprintf("%.0f/s, p50 %.2f ms, p99 %.2f ms, server CPU %.1f µs each", r.Rate(), r.P50, r.P99, r.CPUPerOp())
	default:
		s = fmt.Sprintf("%.1f MiB/s, server CPU %.1f ms/MiB", r.MiBps(), r.CPUPerMiB())
	}
	if r.Retries > 0 {
		s += fmt.Sprintf(", %d retries", r.Retries)
	}
	if r.Unusable > 0 {
		s += fmt.Sprintf(", %d unusable answers", r.Unusable)
	}
	if r.Refused > 0 {
		s += fmt.Sprintf(", %d refused", r.Refused)
	}
	if r.Errors > 0 {
		s += fmt.Sprintf(", %d errors (%s)", r.Errors, r.ErrorSample)
	}
	return s
}
