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
	// ConnectWorkers the sessions dialling at once (default 100), both
	// split among the load generators.
	JoinWorkers, ConnectWorkers int
	// Loadgens is how many load generator processes share the nodes; 0
	// means as few as RLIMIT_NOFILE allows (a socket and a journal per
	// session each).
	Loadgens int
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
	lgs     []*loadgenProc
	lgEv    chan lgEvent
	// early holds events read while waiting for another: a load generator
	// that is ahead sends its next step's event (prepared right after
	// joined) before the others have sent this one's.
	early []lgEvent
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
	Sessions, JoinWorkers, ConnectWorkers, Loadgens int
	// Nofile is RLIMIT_NOFILE as serve and the load generators got it;
	// NofileRaised says the hard limit could be raised to it.
	Nofile       uint64
	NofileRaised bool
	// Header lines: versions, host, load.
	GoVersion, BenchGo, Commit, Kernel, CPUModel string
	CPUs                                         int
	LoadBefore, LoadAfter                        string
	// NofileServe is serve's "Max open files" (/proc/PID/limits).
	NofileServe string
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
		return nil, errors.New("simlab: SessionBench.Sessions must be positive")
	}
	r = &SessionResult{Sessions: b.Sessions, JoinWorkers: b.JoinWorkers, ConnectWorkers: b.ConnectWorkers, Quiet: b.Quiet,
		BenchGo: runtime.Version(), CPUs: runtime.NumCPU(), Kernel: readTrim("/proc/sys/kernel/osrelease"),
		CPUModel: cpuModel(), LoadBefore: loadavg(), Commit: gitCommit()}
	if bi, err := buildinfo.ReadFile(b.BetterCompute); err == nil {
		r.GoVersion = bi.GoVersion
	}
	defer b.close()
	if err := b.planFiles(r); err != nil {
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
		return nil, fmt.Errorf("simlab: pki init: %v: %s", err, out)
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
	if err := b.startLoadgens(cfg, r.Loadgens); err != nil {
		return nil, err
	}

	// 1. Tokens and joins, each step started in every load generator at once
	// and timed here.
	t0 := time.Now()
	if _, err := b.step(ctx, cmdTokens, "tokens"); err != nil {
		return nil, err
	}
	r.Tokens = time.Since(t0)
	b.logf("%d tokens created in %s", b.Sessions, r.Tokens.Round(time.Millisecond))
	t0 = time.Now()
	es, err := b.step(ctx, cmdJoin, "joined")
	if err != nil {
		return nil, err
	}
	r.Joins = time.Since(t0)
	r.JoinP50, r.JoinP99, r.JoinMax, r.JoinWarnings = merged(es)
	b.logf("%d nodes joined in %s", b.Sessions, r.Joins.Round(time.Millisecond))
	t0 = time.Now()
	if _, err := b.waitAll(ctx, "prepared"); err != nil {
		return nil, err
	}
	r.Prepare = time.Since(t0)
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
	cctx, cancel := context.WithTimeout(ctx, b.ConnectTimeout)
	t0 = time.Now()
	es, err = b.step(cctx, cmdConnect, "welcomed")
	cancel()
	if err != nil {
		return nil, err
	}
	r.Connect = time.Since(t0)
	r.ConnectP50, r.ConnectP99, r.ConnectMax, r.ConnectWarnings = merged(es)
	r.ServeWelcomed = b.sample(b.serve.PID(), true)
	r.LoadgenWelcomed = b.sampleLoadgens()
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
	r.LoadgenWindowStart = b.sampleLoadgens()
	segStart, serr := tcpOutSegs(b.serve.PID())
	t0 = time.Now()
	b.logf("steady window: %s", b.Steady)
	if !sleep(ctx, b.Steady) {
		return nil, ctx.Err()
	}
	segEnd, eerr := tcpOutSegs(b.serve.PID())
	r.Window = time.Since(t0)
	r.ServeWindowEnd = b.sample(b.serve.PID(), true)
	r.LoadgenEnd = b.sampleLoadgens()
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

// planFiles raises RLIMIT_NOFILE, which serve and the load generators
// inherit (Go raises its soft limit to the hard one at start), and splits
// the sessions among as few load generators as it allows: serve holds a
// socket per session, a load generator a socket and a journal.
func (b *SessionBench) planFiles(r *SessionResult) error {
	limit, raised, err := raiseNofile(uint64(4*b.Sessions + 8192))
	if err != nil {
		return err
	}
	r.Nofile, r.NofileRaised = limit, raised
	const spare = 512
	if limit < uint64(b.Sessions+spare) {
		return fmt.Errorf("simlab: serve needs %d open files for %d sessions, and RLIMIT_NOFILE is %d (raising it takes root with CAP_SYS_RESOURCE)",
			b.Sessions+spare, b.Sessions, limit)
	}
	per := int(limit-spare) / 2
	r.Loadgens = b.Loadgens
	if r.Loadgens <= 0 {
		r.Loadgens = (b.Sessions + per - 1) / per
	}
	if (b.Sessions+r.Loadgens-1)/r.Loadgens > per {
		return fmt.Errorf("simlab: %d load generators for %d sessions: each may open %d files (RLIMIT_NOFILE), 2 per session", r.Loadgens, b.Sessions, limit)
	}
	return nil
}

// merged are the p50, p99 and max of every load generator's latencies of a
// step, and their warnings.
func merged(es []loadgenEvent) (p50, p99, max float64, warnings int64) {
	var all []float64
	for _, e := range es {
		all = append(all, e.Latencies...)
		warnings += e.Warnings
	}
	p50, p99, max = quantiles(all)
	return p50, p99, max, warnings
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
		return fmt.Errorf("simlab: better-compute serve did not start: %w\n%s", err, b.serve.Tail(30))
	}
	b.logf("serve: api https://%s, gateway https://%s (pid %d)", sbAPI, sbGateway, b.serve.PID())
	return nil
}

// writeNodeConfig writes the nodes' config.toml, as the install script
// would, and the join encryption key beside it.
func (b *SessionBench) writeNodeConfig() (string, error) {
	pins, err := exec.Command(b.BetterCompute, "pki", "pins", b.pki).Output()
	if err != nil {
		return "", fmt.Errorf("simlab: pki pins: %w", err)
	}
	path := filepath.Join(b.Dir, "etc", "config.toml")
	cfg := fmt.Sprintf("gateway_url = \"https://%s\"\nsite = %q\n%s", sbGateway, sbSite, pins)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return "", err
	}
	return path, copyFile(filepath.Join(b.pki, "join-encryption.jwk"), filepath.Join(b.Dir, "etc", "join-encryption.jwk"))
}

// loadgenProc is one sessionbench loadgen process.
type loadgenProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	done chan struct{}
	log  string
}

// lgEvent is an event of load generator k; closed says its stdout ended.
type lgEvent struct {
	k      int
	e      loadgenEvent
	closed bool
}

// startLoadgens starts k sessionbench loadgen processes in the namespace,
// the nodes and the workers split among them, their events read into lgEv
// and their stderr in logs/loadgen-K.log.
func (b *SessionBench) startLoadgens(cfg string, k int) error {
	b.lgEv = make(chan lgEvent, 16*k)
	for i := 0; i < k; i++ {
		first, next := i*b.Sessions/k, (i+1)*b.Sessions/k
		if err := b.startLoadgen(cfg, i, first, next-first, (b.JoinWorkers+k-1)/k, (b.ConnectWorkers+k-1)/k); err != nil {
			return err
		}
	}
	return nil
}

func (b *SessionBench) startLoadgen(cfg string, k, first, n, joinWorkers, connectWorkers int) error {
	p := &loadgenProc{log: filepath.Join(b.Dir, "logs", fmt.Sprintf("loadgen-%d.log", k)), done: make(chan struct{})}
	logf, err := os.Create(p.log)
	if err != nil {
		return err
	}
	p.cmd = b.ns.Command(b.Loadgen, "loadgen", "-api", "https://"+sbAPI, "-pki", b.pki, "-operator-token-file", b.opToken,
		"-config", cfg, "-site", sbSite, "-dir", filepath.Join(b.Dir, "nodes"), "-first", strconv.Itoa(first), "-sessions", strconv.Itoa(n),
		"-join-workers", strconv.Itoa(joinWorkers), "-connect-workers", strconv.Itoa(connectWorkers))
	p.cmd.Stderr = logf
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if p.in, err = p.cmd.StdinPipe(); err != nil {
		logf.Close()
		return err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return err
	}
	if err := p.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("simlab: start load generator %d: %w", k, err)
	}
	b.lgs = append(b.lgs, p)
	go func() {
		sc := bufio.NewScanner(out)
		// An event carries a latency per node.
		sc.Buffer(make([]byte, 64<<10), 32<<20)
		for sc.Scan() {
			var e loadgenEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				fmt.Fprintf(logf, "stdout: %s\n", sc.Bytes())
				continue
			}
			b.lgEv <- lgEvent{k: k, e: e}
		}
		b.lgEv <- lgEvent{k: k, closed: true}
	}()
	go func() {
		p.cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return nil
}

// step sends cmd to every load generator and waits for each one's want.
func (b *SessionBench) step(ctx context.Context, cmd, want string) ([]loadgenEvent, error) {
	for k, p := range b.lgs {
		if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
			return nil, fmt.Errorf("simlab: load generator %d: %w", k, err)
		}
	}
	return b.waitAll(ctx, want)
}

// waitAll returns every load generator's next event named want, logging
// their progress.
func (b *SessionBench) waitAll(ctx context.Context, want string) ([]loadgenEvent, error) {
	got := make([]loadgenEvent, len(b.lgs))
	have := make([]bool, len(b.lgs))
	welcomed := make([]int, len(b.lgs))
	warnings := make([]int64, len(b.lgs))
	early := b.early
	b.early = nil
	for n := 0; n < len(b.lgs); {
		var ev lgEvent
		if len(early) > 0 {
			ev, early = early[0], early[1:]
		} else {
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("simlab: waiting for the load generators' %s: %w", want, ctx.Err())
			case ev = <-b.lgEv:
			}
		}
		switch {
		case ev.closed:
			return nil, fmt.Errorf("simlab: load generator %d exited before %s\n%s", ev.k, want, tailFile(b.lgs[ev.k].log, 20))
		case ev.e.Event == want && !have[ev.k]:
			got[ev.k], have[ev.k] = ev.e, true
			n++
		case ev.e.Event == "error":
			return nil, fmt.Errorf("simlab: load generator %d: %s", ev.k, ev.e.Error)
		case ev.e.Event != "progress":
			// The next step's, from one that is ahead.
			b.early = append(b.early, ev)
		case ev.e.Event == "progress":
			welcomed[ev.k], warnings[ev.k] = ev.e.N, ev.e.Warnings
			if ev.k == 0 {
				var sw int
				var ww int64
				for i := range welcomed {
					sw, ww = sw+welcomed[i], ww+warnings[i]
				}
				b.logf("%d of %d sessions welcomed (%d warnings)", sw, b.Sessions, ww)
			}
		}
	}
	b.early = append(b.early, early...)
	return got, nil
}

// stats are the load generators' counters, summed.
func (b *SessionBench) stats(ctx context.Context) (sessionCounts, error) {
	es, err := b.step(ctx, cmdStats, "stats")
	if err != nil {
		return sessionCounts{}, err
	}
	var sum sessionCounts
	for k, e := range es {
		c := e.Counts
		if c == nil {
			return sessionCounts{}, fmt.Errorf("simlab: load generator %d sent no counts", k)
		}
		sum.Started += c.Started
		sum.Welcomed += c.Welcomed
		sum.Connected += c.Connected
		sum.Welcomes += c.Welcomes
		sum.Warnings += c.Warnings
		if c.LastWarning != "" {
			sum.LastWarning = c.LastWarning
		}
	}
	return sum, nil
}

// sampleLoadgens is the load generators' samples summed (the peak RSS as
// the sum of their peaks).
func (b *SessionBench) sampleLoadgens() ProcSample {
	var sum ProcSample
	for _, p := range b.lgs {
		s := b.sample(p.cmd.Process.Pid, false)
		sum.RSS += s.RSS
		sum.RSSAnon += s.RSSAnon
		sum.HWM += s.HWM
		sum.Threads += s.Threads
		sum.FDs += s.FDs
		sum.CPU += s.CPU
	}
	return sum
}

// Diagnostics are the last lines of serve's and the load generator's logs.
func (b *SessionBench) Diagnostics() string {
	var s strings.Builder
	if b.serve != nil {
		s.WriteString(b.serve.Tail(30))
	}
	for _, p := range b.lgs {
		fmt.Fprintf(&s, "--- load generator log %s (last 20 lines)\n%s\n", p.log, tailFile(p.log, 20))
	}
	return s.String()
}

// close ends the load generators (exit, then SIGKILL by PID after 40 s)
// and serve, and deletes the namespace.
func (b *SessionBench) close() {
	for _, p := range b.lgs {
		io.WriteString(p.in, cmdExit+"\n")
		p.in.Close()
	}
	deadline := time.After(40 * time.Second)
	for _, p := range b.lgs {
		select {
		case <-p.done:
		case <-deadline:
			p.cmd.Process.Kill()
			<-p.done
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

// raiseNofile makes RLIMIT_NOFILE's soft limit at least want (at most
// fs.nr_open), raising the hard limit too where this process may (root with
// CAP_SYS_RESOURCE), else the soft limit to the hard one. It returns the soft
// limit now and whether the hard one was raised.
func raiseNofile(want uint64) (limit uint64, raised bool, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false, err
	}
	if n, err := strconv.ParseUint(readTrim("/proc/sys/fs/nr_open"), 10, 64); err == nil && want > n {
		want = n
	}
	if r.Cur >= want {
		return r.Cur, false, nil
	}
	if r.Max < want {
		up := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &up); err == nil {
			return want, true, nil
		}
	}
	r.Cur = r.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false, fmt.Errorf("simlab: RLIMIT_NOFILE: %w", err)
	}
	return r.Cur, false, nil
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
	p("# %d node sessions of agent.Session (bcd node's client) held by one better-compute serve (the shipped binary), TLS WebSockets on a network namespace's loopback; serve at its default log level (info), metrics on\n", r.Sessions)
	raised := "raised by sessionbench"
	if !r.NofileRaised {
		raised = "this host's hard limit, which sessionbench could not raise"
	}
	p("# RLIMIT_NOFILE %d (%s; serve's Max open files: %s): the load generator is %d process(es), a socket and a journal per session each\n\n", r.Nofile, raised, r.NofileServe, r.Loadgens)

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
	p("load generator (%d sessionbench loadgen processes: %d agent.Sessions, their identities and bbolt journals), summed: RSS %s all welcomed, %s at the end (peaks %s), %d fds\n\n",
		r.Loadgens, r.Sessions, mib(r.LoadgenWelcomed.RSS), mib(r.LoadgenEnd.RSS), mib(r.LoadgenEnd.HWM), r.LoadgenEnd.FDs)

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
