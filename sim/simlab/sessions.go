package simlab

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/controlplane/gateway"
	"github.com/better-compute/bcd/testbed"
)

// The session bench's addresses, on its namespace's own loopback.
const (
	sbAPI     = "127.0.0.1:8443"
	sbGateway = "127.0.0.1:8444"
	sbMetrics = "127.0.0.1:9465"
	sbSite    = "sessionbench"
)

// SessionBench holds Sessions node sessions on one better-compute serve, the
// shipped binary, and measures serve's memory per session and its CPU while
// they only heartbeat. It runs in a network namespace of its own: serve
// (api, gateway and metrics on the namespace's loopback) and the load
// generator (sessionbench loadgen, RunLoadgen), which makes the nodes the
// real way (a join token each over the operator api, then bcd join's code)
// and runs bcd node's client, agent.Session, for each. The steps:
//
//  1. serve starts; the load generator creates the tokens and joins the nodes
//     (JoinWorkers at a time), then loads their identities and opens their
//     journals;
//  2. serve is restarted on the same data, so that its baseline holds the
//     nodes but none of the joins' garbage, and left Settle to settle;
//  3. the load generator dials every session, ConnectWorkers at a time (a
//     slot is freed by the session's Welcome), until all are welcomed;
//  4. after Quiet, a Steady window in which the sessions only heartbeat:
//     serve's CPU, the namespace's TCP segments, and whether any session
//     ended (the load generator's counters, serve's sessions gauge and its
//     log).
//
// Fields must be set before Run.
type SessionBench struct {
	// Dir holds the PKI, serve's data and logs, and the nodes' data
	// directories; the caller removes it.
	Dir string
	// BetterCompute is the serve binary; Loadgen a program whose first
	// argument "loadgen" runs RunLoadgen (sessionbench).
	BetterCompute, Loadgen string
	Sessions               int
	// JoinWorkers are the token creations and joins in flight (default 8);
	// ConnectWorkers the sessions dialling at once (default 100).
	JoinWorkers, ConnectWorkers int
	// Settle is the wait after serve's restart before its baseline (default
	// 10 s); Quiet the wait after the last Welcome before the window (default
	// 20 s); Steady the window (default 60 s).
	Settle, Quiet, Steady time.Duration
	// ConnectTimeout bounds step 3 (default 20 minutes); the joins are bounded
	// by the caller's context only.
	ConnectTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer

	ns      *testbed.Netns
	serve   *testbed.Process
	serves  int
	pki     string
	opToken string
	lg      *exec.Cmd
	lgIn    io.WriteCloser
	lgEv    chan loadgenEvent
	lgDone  chan struct{}
	lgLog   string
}

// ProcSample is a process as /proc and its metrics show it at one moment.
type ProcSample struct {
	// RSS, RSSAnon and HWM (the peak RSS since the process started), bytes.
	RSS, RSSAnon, HWM int64
	Threads, FDs      int
	// CPU is user + system time so far, seconds.
	CPU float64
	// HeapInuse, StackInuse and Goroutines are from serve's /metrics
	// (go_memstats_heap_inuse_bytes, go_memstats_stack_inuse_bytes,
	// go_goroutines); zero for the load generator.
	HeapInuse, StackInuse, Goroutines float64
	// Sessions is serve's better_compute_sessions{role="node"}.
	Sessions float64
}

// SessionResult is what SessionBench measured.
type SessionResult struct {
	Sessions, JoinWorkers, ConnectWorkers int
	// Header lines: versions, host, load.
	GoVersion, BenchGo, Commit, Kernel, CPUModel string
	CPUs                                         int
	LoadBefore, LoadAfter                        string
	NofileServe                                  string
	// Step 1.
	Tokens, Joins, Prepare time.Duration
	JoinP50, JoinP99       float64 // ms
	JoinMax                float64
	JoinWarnings           int64
	ServeAfterJoins        ProcSample // serve before its restart
	// Step 2 and 3: serve restarted; the sessions dialled.
	ServeBefore, ServeWelcomed ProcSample
	Connect                    time.Duration
	ConnectP50, ConnectP99     float64 // ms
	ConnectMax                 float64
	ConnectWarnings            int64
	LoadgenWelcomed            ProcSample
	ServeLoggedOpens           int
	// Step 4.
	Quiet, Window                    time.Duration
	ServeWindowStart, ServeWindowEnd ProcSample
	LoadgenWindowStart, LoadgenEnd   ProcSample
	TCPSegments                      int64 // sent in the namespace during the window
	CountsStart, CountsEnd           sessionCounts
	ServeLoggedCloses                int // in the window
	// Failures are the checks that did not hold; empty means every session
	// was welcomed and none ended during the window.
	Failures []string
}

// OK reports whether every check held.
func (r *SessionResult) OK() bool { return len(r.Failures) == 0 }

// PerSessionRSS is serve's RSS growth per session, all welcomed against the
// baseline, bytes.
func (r *SessionResult) PerSessionRSS() float64 {
	return float64(r.ServeWelcomed.RSS-r.ServeBefore.RSS) / float64(r.Sessions)
}

// HeartbeatsPerSecond is the ping/pong exchanges the intervals make: the
// gateway pings each session every gateway.DefaultPingInterval and the agent
// pings every agent.DefaultPingInterval, each answered with a pong.
func (r *SessionResult) HeartbeatsPerSecond() float64 {
	return float64(r.Sessions) * (1/gateway.DefaultPingInterval.Seconds() + 1/agent.DefaultPingInterval.Seconds())
}

// ServeCPUPerSecond is serve's CPU seconds per second in the window.
func (r *SessionResult) ServeCPUPerSecond() float64 {
	return (r.ServeWindowEnd.CPU - r.ServeWindowStart.CPU) / r.Window.Seconds()
}

func (b *SessionBench) logf(format string, args ...any) {
	if b.Log != nil {
		fmt.Fprintf(b.Log, "%s sessionbench: %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
	}
}

func (b *SessionBench) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&b.Settle, 10*time.Second)
	def(&b.Quiet, 20*time.Second)
	def(&b.Steady, 60*time.Second)
	def(&b.ConnectTimeout, 20*time.Minute)
	if b.JoinWorkers <= 0 {
		b.JoinWorkers = 8
	}
	if b.ConnectWorkers <= 0 {
		b.ConnectWorkers = 100
	}
}

// Run runs the bench. It returns a result whenever the sessions were all
// welcomed (check OK), and an error when a step could not be done.
func (b *SessionBench) Run(ctx context.Context) (r *SessionResult, err error) {
	b.defaults()
	if b.Sessions <= 0 {
		return nil, errors.New("sessionbench: Sessions must be positive")
	}
	r = &SessionResult{Sessions: b.Sessions, JoinWorkers: b.JoinWorkers, ConnectWorkers: b.ConnectWorkers, Quiet: b.Quiet,
		BenchGo: runtime.Version(), CPUs: runtime.NumCPU(), Kernel: readTrim("/proc/sys/kernel/osrelease"),
		CPUModel: cpuModel(), LoadBefore: loadavg(), Commit: gitCommit()}
	if bi, err := buildinfo.ReadFile(b.BetterCompute); err == nil {
		r.GoVersion = bi.GoVersion
	}
	defer b.close()
	// Each session is a socket in serve and one, with its journal, in the
	// load generator: raise the limit both inherit (Go raises its soft
	// limit to the hard one at start).
	if err := raiseNofile(uint64(4*b.Sessions + 8192)); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "nodes", "etc"} {
		if err := os.MkdirAll(filepath.Join(b.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if b.ns, err = testbed.NewNetns(fmt.Sprintf("bcdsess%d", os.Getpid()%100000)); err != nil {
		return nil, err
	}
	// The joins' closed connections wait in TIME_WAIT beside the sessions:
	// widen the namespace's ephemeral ports (its own sysctl).
	if err := b.ns.Run("sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=10000 65000"); err != nil {
		return nil, err
	}
	b.pki = filepath.Join(b.Dir, "pki")
	b.opToken = filepath.Join(b.Dir, "operator-token")
	if out, err := exec.Command(b.BetterCompute, "pki", "init", b.pki).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("sessionbench: pki init: %v: %s", err, out)
	}
	if err := b.startServe(ctx); err != nil {
		return nil, err
	}
	r.NofileServe = nofileOf(b.serve.PID())
	if _, err := b.bc("sites", "create", sbSite); err != nil {
		return nil, err
	}
	cfg, err := b.writeNodeConfig()
	if err != nil {
		return nil, err
	}
	if err := b.startLoadgen(cfg); err != nil {
		return nil, err
	}

	// 1. Tokens and joins.
	e, err := b.wait(ctx, "tokens")
	if err != nil {
		return nil, err
	}
	r.Tokens = secs(e.Seconds)
	b.logf("%d tokens created in %s", b.Sessions, r.Tokens.Round(time.Millisecond))
	if e, err = b.wait(ctx, "joined"); err != nil {
		return nil, err
	}
	r.Joins, r.JoinP50, r.JoinP99, r.JoinMax, r.JoinWarnings = secs(e.Seconds), e.P50, e.P99, e.Max, e.Warnings
	b.logf("%d nodes joined in %s", b.Sessions, r.Joins.Round(time.Millisecond))
	if e, err = b.wait(ctx, "prepared"); err != nil {
		return nil, err
	}
	r.Prepare = secs(e.Seconds)
	r.ServeAfterJoins = b.sample(b.serve.PID(), true)

	// 2. A fresh serve on the same data.
	b.serve.Stop(30 * time.Second)
	if err := b.startServe(ctx); err != nil {
		return nil, err
	}
	if !sleep(ctx, b.Settle) {
		return nil, ctx.Err()
	}
	r.ServeBefore = b.sample(b.serve.PID(), true)
	b.logf("serve restarted: RSS %s before the sessions", mib(r.ServeBefore.RSS))

	// 3. Every session dialled and welcomed.
	if _, err := io.WriteString(b.lgIn, cmdConnect+"\n"); err != nil {
		return nil, fmt.Errorf("sessionbench: load generator: %w", err)
	}
	cctx, cancel := context.WithTimeout(ctx, b.ConnectTimeout)
	e, err = b.wait(cctx, "welcomed")
	cancel()
	if err != nil {
		return nil, err
	}
	r.Connect, r.ConnectP50, r.ConnectP99, r.ConnectMax, r.ConnectWarnings = secs(e.Seconds), e.P50, e.P99, e.Max, e.Warnings
	r.ServeWelcomed = b.sample(b.serve.PID(), true)
	r.LoadgenWelcomed = b.sample(b.lg.Process.Pid, false)
	b.logf("%d sessions welcomed in %s; serve RSS %s", b.Sessions, r.Connect.Round(time.Millisecond), mib(r.ServeWelcomed.RSS))
	// The gateway counts a session once its Welcome is written; the agent
	// may read it first.
	for deadline := time.Now().Add(30 * time.Second); r.ServeWelcomed.Sessions != float64(b.Sessions) && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		r.ServeWelcomed.Sessions = b.sample(b.serve.PID(), true).Sessions
	}

	// 4. The steady window.
	if !sleep(ctx, b.Quiet) {
		return nil, ctx.Err()
	}
	if r.CountsStart, err = b.stats(ctx); err != nil {
		return nil, err
	}
	closesStart := countLog(b.serve.Log, `"msg":"session closed"`)
	r.ServeWindowStart = b.sample(b.serve.PID(), true)
	r.LoadgenWindowStart = b.sample(b.lg.Process.Pid, false)
	segStart, serr := tcpOutSegs(b.serve.PID())
	t0 := time.Now()
	b.logf("steady window: %s", b.Steady)
	if !sleep(ctx, b.Steady) {
		return nil, ctx.Err()
	}
	segEnd, eerr := tcpOutSegs(b.serve.PID())
	r.Window = time.Since(t0)
	r.ServeWindowEnd = b.sample(b.serve.PID(), true)
	r.LoadgenEnd = b.sample(b.lg.Process.Pid, false)
	if serr == nil && eerr == nil {
		r.TCPSegments = segEnd - segStart
	}
	if r.CountsEnd, err = b.stats(ctx); err != nil {
		return nil, err
	}
	r.ServeLoggedCloses = countLog(b.serve.Log, `"msg":"session closed"`) - closesStart
	r.ServeLoggedOpens = countLog(b.serve.Log, `"msg":"session open"`)
	r.LoadAfter = loadavg()
	r.check()
	return r, nil
}

// check fills in Failures.
func (r *SessionResult) check() {
	n := r.Sessions
	fail := func(format string, args ...any) { r.Failures = append(r.Failures, fmt.Sprintf(format, args...)) }
	for _, s := range []struct {
		what string
		p    ProcSample
	}{{"before the sessions", r.ServeBefore}, {"all welcomed", r.ServeWelcomed}, {"at the window's end", r.ServeWindowEnd}} {
		if s.p.RSS <= 0 {
			fail("serve's RSS %s did not read", s.what)
		}
	}
	if r.LoadgenEnd.RSS <= 0 {
		fail("the load generator's RSS did not read")
	}
	for _, g := range []struct {
		what string
		v    float64
	}{{"all welcomed", r.ServeWelcomed.Sessions}, {"at the window's start", r.ServeWindowStart.Sessions}, {"at the window's end", r.ServeWindowEnd.Sessions}} {
		if g.v != float64(n) {
			fail("serve's better_compute_sessions{role=\"node\"} %s: %v, want %d", g.what, g.v, n)
		}
	}
	if r.ServeLoggedOpens != n {
		fail("serve logged %d session opens, want %d", r.ServeLoggedOpens, n)
	}
	for _, c := range []struct {
		what string
		c    sessionCounts
	}{{"start", r.CountsStart}, {"end", r.CountsEnd}} {
		if c.c.Connected != n || c.c.Welcomed != n {
			fail("at the window's %s the load generator had %d sessions connected and %d welcomed, want %d", c.what, c.c.Connected, c.c.Welcomed, n)
		}
	}
	if d := r.CountsEnd.Welcomes - r.CountsStart.Welcomes; d != 0 {
		fail("%d sessions were welcomed again during the window (a reconnect)", d)
	}
	if d := r.CountsEnd.Warnings - r.CountsStart.Warnings; d != 0 {
		fail("the sessions logged %d warnings during the window (a connection ended or a ping went unanswered); the last: %s", d, r.CountsEnd.LastWarning)
	}
	if r.ServeLoggedCloses != 0 {
		fail("serve logged %d session closes during the window", r.ServeLoggedCloses)
	}
}

func (b *SessionBench) bc(args ...string) (string, error) {
	return testbed.RunBC(b.ns, b.BetterCompute, "https://"+sbAPI, b.pki, b.opToken, args...)
}

// startServe starts serve (again) on the bench's data, metrics on, logging
// at its default level, and waits for its api.
func (b *SessionBench) startServe(ctx context.Context) error {
	b.serves++
	args := []string{"serve", "--pki", b.pki, "--data", filepath.Join(b.Dir, "cp"),
		"--listen", sbAPI, "--gateway-listen", sbGateway, "--operator-token-file", b.opToken, "--metrics-listen", sbMetrics}
	var err error
	if b.serve, err = testbed.StartProcess("better-compute serve", b.ns.Command(b.BetterCompute, args...),
		filepath.Join(b.Dir, "logs", fmt.Sprintf("serve-%d.log", b.serves))); err != nil {
		return err
	}
	if err := poll(ctx, 60*time.Second, func() bool {
		if _, err := os.Stat(b.opToken); err != nil {
			return false
		}
		_, err := b.bc("sites", "list")
		return err == nil
	}); err != nil {
		return fmt.Errorf("sessionbench: better-compute serve did not start: %w\n%s", err, b.serve.Tail(30))
	}
	b.logf("serve: api https://%s, gateway https://%s (pid %d)", sbAPI, sbGateway, b.serve.PID())
	return nil
}

// writeNodeConfig writes the nodes' config.toml, as the install script
// would, and the join encryption key beside it.
func (b *SessionBench) writeNodeConfig() (string, error) {
	pins, err := exec.Command(b.BetterCompute, "pki", "pins", b.pki).Output()
	if err != nil {
		return "", fmt.Errorf("sessionbench: pki pins: %w", err)
	}
	path := filepath.Join(b.Dir, "etc", "config.toml")
	cfg := fmt.Sprintf("gateway_url = \"https://%s\"\nsite = %q\n%s", sbGateway, sbSite, pins)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", err
	}
	return path, copyFile(filepath.Join(b.pki, "join-encryption.jwk"), filepath.Join(b.Dir, "etc", "join-encryption.jwk"))
}

// startLoadgen starts sessionbench loadgen in the namespace, its events read
// into lgEv and its stderr in logs/loadgen.log.
func (b *SessionBench) startLoadgen(cfg string) error {
	b.lgLog = filepath.Join(b.Dir, "logs", "loadgen.log")
	logf, err := os.Create(b.lgLog)
	if err != nil {
		return err
	}
	cmd := b.ns.Command(b.Loadgen, "loadgen", "-api", "https://"+sbAPI, "-pki", b.pki, "-operator-token-file", b.opToken,
		"-config", cfg, "-site", sbSite, "-dir", filepath.Join(b.Dir, "nodes"), "-sessions", strconv.Itoa(b.Sessions),
		"-join-workers", strconv.Itoa(b.JoinWorkers), "-connect-workers", strconv.Itoa(b.ConnectWorkers))
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if b.lgIn, err = cmd.StdinPipe(); err != nil {
		logf.Close()
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("sessionbench: start the load generator: %w", err)
	}
	b.lg = cmd
	b.lgEv = make(chan loadgenEvent, 64)
	b.lgDone = make(chan struct{})
	go func() {
		defer close(b.lgEv)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var e loadgenEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				fmt.Fprintf(logf, "stdout: %s\n", sc.Bytes())
				continue
			}
			b.lgEv <- e
		}
	}()
	go func() {
		cmd.Wait()
		logf.Close()
		close(b.lgDone)
	}()
	return nil
}

// wait returns the load generator's next event named want, logging progress.
func (b *SessionBench) wait(ctx context.Context, want string) (loadgenEvent, error) {
	for {
		select {
		case <-ctx.Done():
			return loadgenEvent{}, fmt.Errorf("sessionbench: waiting for the load generator's %s: %w", want, ctx.Err())
		case e, ok := <-b.lgEv:
			switch {
			case !ok:
				return e, fmt.Errorf("sessionbench: the load generator exited before %s\n%s", want, tailFile(b.lgLog, 20))
			case e.Event == want:
				return e, nil
			case e.Event == "error":
				return e, fmt.Errorf("sessionbench: load generator: %s", e.Error)
			case e.Event == "progress":
				b.logf("%d of %d sessions welcomed (%d warnings)", e.N, b.Sessions, e.Warnings)
			}
		}
	}
}

func (b *SessionBench) stats(ctx context.Context) (sessionCounts, error) {
	if _, err := io.WriteString(b.lgIn, cmdStats+"\n"); err != nil {
		return sessionCounts{}, fmt.Errorf("sessionbench: load generator: %w", err)
	}
	e, err := b.wait(ctx, "stats")
	if err != nil || e.Counts == nil {
		return sessionCounts{}, fmt.Errorf("sessionbench: no stats from the load generator: %v", err)
	}
	return *e.Counts, nil
}

// Diagnostics are the last lines of serve's and the load generator's logs.
func (b *SessionBench) Diagnostics() string {
	var s strings.Builder
	if b.serve != nil {
		s.WriteString(b.serve.Tail(30))
	}
	if b.lgLog != "" {
		fmt.Fprintf(&s, "--- load generator log %s (last 20 lines)\n%s\n", b.lgLog, tailFile(b.lgLog, 20))
	}
	return s.String()
}

// close ends the load generator (exit, then SIGKILL by its PID after 40 s)
// and serve, and deletes the namespace.
func (b *SessionBench) close() {
	if b.lg != nil {
		io.WriteString(b.lgIn, cmdExit+"\n")
		b.lgIn.Close()
		select {
		case <-b.lgDone:
		case <-time.After(40 * time.Second):
			b.lg.Process.Kill()
			<-b.lgDone
		}
	}
	if b.serve != nil {
		b.serve.Stop(30 * time.Second)
	}
	if b.ns != nil {
		b.ns.Close()
	}
}

// sample reads pid's /proc files and, for serve, its metrics.
func (b *SessionBench) sample(pid int, serve bool) ProcSample {
	var p ProcSample
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			p.RSS = n << 10
		case "RssAnon":
			p.RSSAnon = n << 10
		case "VmHWM":
			p.HWM = n << 10
		case "Threads":
			p.Threads = int(n)
		}
	}
	p.CPU = procCPU(pid)
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		p.FDs = len(fds)
	}
	if serve {
		body, err := scrapeMetrics(b.ns, sbMetrics)
		if err != nil {
			b.logf("serve's metrics: %v", err)
		}
		p.HeapInuse = metricValue(body, "go_memstats_heap_inuse_bytes")
		p.StackInuse = metricValue(body, "go_memstats_stack_inuse_bytes")
		p.Goroutines = metricValue(body, "go_goroutines")
		p.Sessions = metricValue(body, `better_compute_sessions{role="node"}`)
	}
	return p
}

// procCPU is pid's user + system time, seconds (/proc/PID/stat, at the
// kernel's USER_HZ of 100).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces; the fields after it do not.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100
}

// tcpOutSegs is the TCP segments sent in pid's network namespace so far
// (Tcp: OutSegs of /proc/PID/net/snmp). On a namespace's loopback each
// segment is counted once.
func tcpOutSegs(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/snmp", pid))
	if err != nil {
		return 0, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "OutSegs" && i < len(f) {
				return strconv.ParseInt(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("no Tcp: OutSegs in /proc/net/snmp")
}

// metricValue is the value of series (a name and its labels as the
// exposition writes them) in a Prometheus text exposition, 0 if absent.
func metricValue(body []byte, series string) float64 {
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, _ := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v
		}
	}
	return 0
}

// tailFile is the last n lines of path.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// countLog counts the lines of path holding s.
func countLog(path, s string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if bytes.Contains(sc.Bytes(), []byte(s)) {
			n++
		}
	}
	return n
}

// raiseNofile makes RLIMIT_NOFILE at least want, soft and hard (the hard
// limit only as root), at most fs.nr_open.
func raiseNofile(want uint64) error {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return err
	}
	if n, err := strconv.ParseUint(readTrim("/proc/sys/fs/nr_open"), 10, 64); err == nil && want > n {
		want = n
	}
	if r.Cur >= want {
		return nil
	}
	if r.Max < want {
		r.Max = want
	}
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return fmt.Errorf("sessionbench: raise RLIMIT_NOFILE to %d: %w", want, err)
	}
	return nil
}

// nofileOf is pid's "Max open files" soft limit.
func nofileOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0]
			}
		}
	}
	return "?"
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func loadavg() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func cpuModel() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// gitCommit is the working tree's commit, +dirty when tracked files differ.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown (not run in a git tree)"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
		c += "+dirty"
	}
	return c
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func sleep(ctx context.Context, d time.Duration) bool { return agent.Sleep(ctx, d) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// Report writes the result as text.
func (r *SessionResult) Report(w io.Writer) {
	n := float64(r.Sessions)
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("# %s (serve built with it; sessionbench %s), commit %s\n", r.GoVersion, r.BenchGo, r.Commit)
	p("# kernel %s, %d CPUs (%s), load average before %s, after %s\n", r.Kernel, r.CPUs, r.CPUModel, r.LoadBefore, r.LoadAfter)
	p("# %d node sessions of agent.Session (bcd node's client) held by one better-compute serve (the shipped binary), TLS WebSockets on a network namespace's loopback; serve at its default log level (info), metrics on, RLIMIT_NOFILE %s\n\n", r.Sessions, r.NofileServe)

	p("## identities: a join token each over the operator api, then bcd join's code (join.Run, attestor join-token), %d at a time\n", r.JoinWorkers)
	p("tokens created      %8.1f s  (%.0f/s)\n", r.Tokens.Seconds(), n/r.Tokens.Seconds())
	p("nodes joined        %8.1f s  (%.0f/s; one join p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d retried)\n",
		r.Joins.Seconds(), n/r.Joins.Seconds(), r.JoinP50, r.JoinP99, r.JoinMax, r.JoinWarnings)
	p("identities loaded, journals opened (load generator) %.1f s\n", r.Prepare.Seconds())
	p("serve after the joins: RSS %s (peak %s), %.1f CPU-s since its start\n\n", mib(r.ServeAfterJoins.RSS), mib(r.ServeAfterJoins.HWM), r.ServeAfterJoins.CPU)

	p("## sessions: serve restarted on the same data (its baseline holds the %d nodes, not the joins' garbage), then every session dialled, %d at a time (a slot freed by its Welcome)\n", r.Sessions, r.ConnectWorkers)
	p("%-24s %10s %10s %10s %10s %10s %8s %8s\n", "serve", "RSS", "RssAnon", "heap inuse", "stacks", "goroutines", "threads", "fds")
	row := func(name string, s ProcSample) {
		p("%-24s %10s %10s %10s %10s %10.0f %8d %8d\n", name, mib(s.RSS), mib(s.RSSAnon), mib(int64(s.HeapInuse)), mib(int64(s.StackInuse)), s.Goroutines, s.Threads, s.FDs)
	}
	row("before the sessions", r.ServeBefore)
	row("all welcomed", r.ServeWelcomed)
	row("end of steady window", r.ServeWindowEnd)
	p("%-24s %10s %10s %10s %10s %10.2f %8s %8.2f\n", "per session (welcomed)", kib(r.PerSessionRSS()),
		kib(float64(r.ServeWelcomed.RSSAnon-r.ServeBefore.RSSAnon)/n), kib((r.ServeWelcomed.HeapInuse-r.ServeBefore.HeapInuse)/n),
		kib((r.ServeWelcomed.StackInuse-r.ServeBefore.StackInuse)/n), (r.ServeWelcomed.Goroutines-r.ServeBefore.Goroutines)/n, "",
		float64(r.ServeWelcomed.FDs-r.ServeBefore.FDs)/n)
	p("per session (window end) %10s\n", kib(float64(r.ServeWindowEnd.RSS-r.ServeBefore.RSS)/n))
	p("serve peak RSS (VmHWM since the restart): %s\n", mib(r.ServeWindowEnd.HWM))
	p("connect all %d: %.1f s (%.0f sessions/s); one session's first dial to its Welcome: p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d failed attempts before a Welcome\n",
		r.Sessions, r.Connect.Seconds(), n/r.Connect.Seconds(), r.ConnectP50, r.ConnectP99, r.ConnectMax, r.ConnectWarnings)
	p("serve CPU while connecting: %.1f CPU-s; serve logged %d session opens\n", r.ServeWelcomed.CPU-r.ServeBefore.CPU, r.ServeLoggedOpens)
	p("load generator (sessionbench loadgen: %d agent.Sessions, their identities and bbolt journals): RSS %s all welcomed, %s at the end (peak %s), %d fds\n\n",
		r.Sessions, mib(r.LoadgenWelcomed.RSS), mib(r.LoadgenEnd.RSS), mib(r.LoadgenEnd.HWM), r.LoadgenEnd.FDs)

	hb := r.HeartbeatsPerSecond()
	cps := r.ServeCPUPerSecond()
	p("## steady: %.1f s with the sessions only heartbeating, %s after the last Welcome\n", r.Window.Seconds(), r.Quiet)
	p("heartbeats: the gateway pings each session every %s and the agent every %s, each answered by a pong: %d × (1/%.0f + 1/%.0f) = %.0f ping/pong exchanges/s expected\n",
		gateway.DefaultPingInterval, agent.DefaultPingInterval, r.Sessions, gateway.DefaultPingInterval.Seconds(), agent.DefaultPingInterval.Seconds(), hb)
	p("serve CPU          %.2f CPU-s in the window = %.4f CPU-s/s (%.1f %% of one core); %.1f µs per exchange; %.2f µs/s per session\n",
		r.ServeWindowEnd.CPU-r.ServeWindowStart.CPU, cps, 100*cps, 1e6*cps/hb, 1e6*cps/n)
	lcps := (r.LoadgenEnd.CPU - r.LoadgenWindowStart.CPU) / r.Window.Seconds()
	p("load generator CPU %.2f CPU-s in the window = %.4f CPU-s/s\n", r.LoadgenEnd.CPU-r.LoadgenWindowStart.CPU, lcps)
	p("TCP segments sent in the namespace: %d (%.0f/s, %.2f per expected exchange: ping, pong, and the ACKs not carried by one)\n",
		r.TCPSegments, float64(r.TCPSegments)/r.Window.Seconds(), float64(r.TCPSegments)/r.Window.Seconds()/hb)
	p("sessions: serve's gauge %.0f at the start, %.0f at the end; the load generator's connected %d → %d, welcomes %d → %d, warnings %d → %d; serve logged %d session closes\n",
		r.ServeWindowStart.Sessions, r.ServeWindowEnd.Sessions, r.CountsStart.Connected, r.CountsEnd.Connected,
		r.CountsStart.Welcomes, r.CountsEnd.Welcomes, r.CountsStart.Warnings, r.CountsEnd.Warnings, r.ServeLoggedCloses)
	if r.OK() {
		p("\nRESULT: ok: all %d welcomed, none ended during the window\n", r.Sessions)
	} else {
		p("\nRESULT: FAILED\n")
		for _, f := range r.Failures {
			p("- %s\n", f)
		}
	}
}
