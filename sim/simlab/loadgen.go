package simlab

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// The load generator of SessionBench (sessionbench loadgen, run inside the
// bench's namespace) speaks to the coordinator in lines: it writes one JSON
// loadgenEvent per line to stdout and reads commands from stdin.
const (
	cmdTokens  = "tokens"  // create the join tokens
	cmdJoin    = "join"    // join the nodes, load their identities, open their journals
	cmdConnect = "connect" // open every node's session
	cmdStats   = "stats"   // answer with a stats event
	cmdExit    = "exit"    // end the sessions and exit (so does EOF)
)

// loadgenEvent is one line of the load generator's stdout.
type loadgenEvent struct {
	// Event is tokens, joined, prepared, progress, welcomed, stats, exit or
	// error.
	Event string `json:"event"`
	N     int    `json:"n,omitempty"`
	// Seconds is how long the phase took.
	Seconds float64 `json:"seconds,omitempty"`
	// Latencies are each operation's of the phase (a join; a session's
	// first dial to its Welcome), in ms.
	Latencies []float64 `json:"latencies_ms,omitempty"`
	// Warnings is what the phase's agent code logged at warn or above (a
	// join retried, a session's connection ended or failed).
	Warnings int64          `json:"warnings,omitempty"`
	Counts   *sessionCounts `json:"counts,omitempty"`
	Error    string         `json:"error,omitempty"`
}

// sessionCounts are the load generator's session counters.
type sessionCounts struct {
	// Started sessions; Welcomed of them at least once; Connected now (the
	// session's own State).
	Started, Welcomed, Connected int
	// Welcomes counts every Welcome, the first ones and those after a
	// reconnect.
	Welcomes int64
	// Warnings the sessions logged: every connection that ended or failed
	// to open, every ping the gateway left unanswered.
	Warnings int64
	// LastWarning is the last of them, with its error.
	LastWarning string `json:",omitempty"`
}

// warnCounter is a slog.Handler that counts records at warn and above and
// keeps the last one's text: the session logs one for every connection that
// ends or fails, which is how the load generator counts drops without a hook
// in the agent.
type warnCounter struct {
	n    *atomic.Int64
	last *atomic.Pointer[string]
}

func newWarnCounter() warnCounter {
	return warnCounter{n: new(atomic.Int64), last: new(atomic.Pointer[string])}
}

func (h warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h warnCounter) Handle(_ context.Context, r slog.Record) error {
	h.n.Add(1)
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	})
	s := b.String()
	h.last.Store(&s)
	return nil
}

func (h warnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h warnCounter) WithGroup(string) slog.Handler      { return h }

func (h warnCounter) lastText() string {
	if p := h.last.Load(); p != nil {
		return *p
	}
	return ""
}

type loadgenOptions struct {
	api, pki, tokenFile, config, site, dir string
	// first is the index of this load generator's first node: several share
	// the nodes when one process may not open enough files for all.
	first, n, joinWorkers, connectWorkers int
}

// RunLoadgen is sessionbench loadgen. Each step waits for the coordinator's
// command: "tokens" creates -sessions join tokens over the operator api;
// "join" joins that many nodes with bcd join's code (join.Run, attestor
// join-token, one data directory each), then loads their identities and
// opens their journals as bcd node does; "connect" runs an agent.Session for
// each, the client bcd node runs. It must run where the api and gateway are
// reachable (the bench's namespace).
func RunLoadgen(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	var o loadgenOptions
	fs := flag.NewFlagSet("sessionbench loadgen", flag.ContinueOnError)
	fs.StringVar(&o.api, "api", "", "the operator api, https://host:port")
	fs.StringVar(&o.pki, "pki", "", "the PKI bundle (for the api's CA)")
	fs.StringVar(&o.tokenFile, "operator-token-file", "", "the operator token")
	fs.StringVar(&o.config, "config", "", "the nodes' config.toml (gateway_url, pins, site), join-encryption.jwk beside it")
	fs.StringVar(&o.site, "site", "", "the site the tokens are for")
	fs.StringVar(&o.dir, "dir", "", "where the nodes' data directories go")
	fs.IntVar(&o.n, "sessions", 0, "nodes to join and sessions to hold")
	fs.IntVar(&o.first, "first", 0, "the index of the first node (node directories and claims are numbered from it)")
	fs.IntVar(&o.joinWorkers, "join-workers", 8, "token creations and joins in flight")
	fs.IntVar(&o.connectWorkers, "connect-workers", 100, "sessions dialled at once (each slot is freed by its Welcome)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.n <= 0 || o.api == "" || o.config == "" || o.dir == "" || o.joinWorkers <= 0 || o.connectWorkers <= 0 {
		return errors.New("sessionbench loadgen: -api, -config, -dir and positive -sessions, -join-workers, -connect-workers are needed")
	}
	enc := json.NewEncoder(stdout)
	var encMu sync.Mutex
	emit := func(e loadgenEvent) {
		encMu.Lock()
		enc.Encode(e)
		encMu.Unlock()
	}
	// Commands are read apart from the steps, so that an exit (or EOF: the
	// coordinator went away) ends whatever step is running.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmds := make(chan string)
	var exiting atomic.Bool
	go func() {
		defer cancel()
		defer exiting.Store(true)
		in := bufio.NewScanner(stdin)
		for in.Scan() {
			if in.Text() == cmdExit {
				return
			}
			select {
			case cmds <- in.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	err := loadgen(ctx, o, cmds, emit)
	if err != nil && exiting.Load() && ctx.Err() != nil {
		return nil // told to stop before the last step
	}
	if err != nil {
		emit(loadgenEvent{Event: "error", Error: err.Error()})
	}
	return err
}

// node is one joined node as bcd node would hold it.
type node struct {
	dir     string
	id      *agent.Identity
	journal *journal.Journal
}

// loadgen runs the steps, each on its command from cmds; ctx ends with an
// exit command or EOF.
func loadgen(ctx context.Context, o loadgenOptions, cmds <-chan string, emit func(loadgenEvent)) error {
	expect := func(cmd string) error {
		select {
		case c := <-cmds:
			if c != cmd {
				return fmt.Errorf("expected %q on stdin, got %q", cmd, c)
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := expect(cmdTokens); err != nil {
		return err
	}
	tokens, err := createTokens(ctx, o, emit)
	if err != nil {
		return err
	}
	if err := expect(cmdJoin); err != nil {
		return err
	}
	if err := joinNodes(ctx, o, tokens, emit); err != nil {
		return err
	}
	nodes, err := prepareNodes(ctx, o, emit)
	defer func() {
		for _, n := range nodes {
			if n.journal != nil {
				n.journal.Close()
			}
		}
	}()
	if err != nil {
		return err
	}
	if err := expect(cmdConnect); err != nil {
		return err
	}
	return holdSessions(ctx, o, nodes, cmds, emit)
}

// createTokens makes one single-use node token per node over the operator
// api, as better-compute tokens create does.
func createTokens(ctx context.Context, o loadgenOptions, emit func(loadgenEvent)) ([]string, error) {
	tok, err := os.ReadFile(o.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("operator token: %w", err)
	}
	pub, err := pki.LoadPublic(o.pki)
	if err != nil {
		return nil, err
	}
	c, err := client.New(o.api, strings.TrimSpace(string(tok)), pub.ServingCAPool())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	tokens := make([]string, o.n)
	err = parallel(ctx, o.n, o.joinWorkers, func(i int) error {
		t, err := c.CreateToken(ctx, apitype.TokenCreate{Pool: "sessionbench", Site: o.site, Role: protocol.RoleNode})
		if err != nil {
			return fmt.Errorf("token %d: %w", i, err)
		}
		tokens[i] = t.Token
		return nil
	})
	if err != nil {
		return nil, err
	}
	emit(loadgenEvent{Event: "tokens", N: o.n, Seconds: time.Since(start).Seconds()})
	return tokens, nil
}

func (o loadgenOptions) nodeDir(i int) string {
	return filepath.Join(o.dir, fmt.Sprintf("node-%05d", o.first+i))
}

// joinNodes runs bcd join's code for each node: config.toml shared, a data
// directory each, the token as BCD_JOIN_TOKEN would give it.
func joinNodes(ctx context.Context, o loadgenOptions, tokens []string, emit func(loadgenEvent)) error {
	warn := newWarnCounter()
	lat := make([]time.Duration, o.n)
	start := time.Now()
	err := parallel(ctx, o.n, o.joinWorkers, func(i int) error {
		t0 := time.Now()
		err := join.Run(ctx, join.Options{
			ConfigPath: o.config, DataDir: o.nodeDir(i), Role: protocol.RoleNode, Attestor: protocol.AttestorJoinToken,
			Getenv: func(k string) string {
				if k == join.EnvToken {
					return tokens[i]
				}
				return ""
			},
			Stdin: strings.NewReader(""), IsRoot: func() bool { return false },
			Claims: func(context.Context) protocol.Claims { return benchClaims(o.first + i) },
			Logger: slog.New(warn),
		})
		if err != nil {
			return fmt.Errorf("join %d: %w", i, err)
		}
		lat[i] = time.Since(t0)
		return nil
	})
	if err != nil {
		return err
	}
	emit(loadgenEvent{Event: "joined", N: o.n, Seconds: time.Since(start).Seconds(), Latencies: millis(lat), Warnings: warn.n.Load()})
	return nil
}

// benchClaims are a node's hardware claims: unique MAC, UUID and serial.
func benchClaims(i int) protocol.Claims {
	return protocol.Claims{
		Hostname:      fmt.Sprintf("sess-%05d", i),
		MACs:          []string{fmt.Sprintf("02:bc:5e:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)},
		SystemUUID:    fmt.Sprintf("5e55b0c0-0000-4000-8000-%012x", i),
		SystemSerial:  fmt.Sprintf("SESS%07d", i),
		SystemVendor:  "bcd sessionbench",
		SystemProduct: "load generator node",
		CPUs:          64,
		MemoryBytes:   256 << 30,
	}
}

// prepareNodes loads each node's identity and opens its journal, as bcd
// node does before it dials.
func prepareNodes(ctx context.Context, o loadgenOptions, emit func(loadgenEvent)) ([]node, error) {
	start := time.Now()
	nodes := make([]node, o.n)
	err := parallel(ctx, o.n, o.joinWorkers, func(i int) error {
		dir := o.nodeDir(i)
		id, err := agent.LoadIdentity(dir, nil)
		if err != nil {
			return err
		}
		j, err := journal.Open(filepath.Join(dir, journal.FileName), id.NodeID, journal.Options{})
		if err != nil {
			return err
		}
		nodes[i] = node{dir: dir, id: id, journal: j}
		return nil
	})
	if err == nil {
		emit(loadgenEvent{Event: "prepared", N: o.n, Seconds: time.Since(start).Seconds()})
	}
	return nodes, err
}

// holdSessions runs a session per node, connectWorkers dialling at a time
// (a slot is freed by the session's first Welcome), reports when every one
// was welcomed, then answers stats until ctx ends (exit or EOF), and ends the
// sessions.
func holdSessions(ctx context.Context, o loadgenOptions, nodes []node, cmds <-chan string, emit func(loadgenEvent)) error {
	c, err := config.Load(o.config, config.ParseOptions{})
	if err != nil {
		return err
	}
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	warn := newWarnCounter()
	logger := slog.New(warn)
	var welcomes, welcomed atomic.Int64
	sessions := make([]*agent.Session, len(nodes))
	lat := make([]time.Duration, len(nodes))
	slots := make(chan struct{}, o.connectWorkers)
	all := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	go func() {
		for i, n := range nodes {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			t0 := time.Now()
			var s *agent.Session
			s = &agent.Session{
				GatewayURL: c.GatewayURL, ServerName: serverName, ServingCAPin: c.ServingCASPKIPin,
				Identity: n.id, Journal: n.journal, Handlers: map[string]agent.Handler{},
				// No self-update here: the daemon section is answered
				// unsupported, as bcd sim's nodes do.
				OnSpec: func(_ context.Context, spec protocol.Spec) { s.ReportDaemonUnsupported(spec) },
				OnWelcome: func(_ context.Context, _ protocol.Welcome, first bool) {
					welcomes.Add(1)
					if !first {
						return
					}
					lat[i] = time.Since(t0)
					<-slots
					if welcomed.Add(1) == int64(len(nodes)) {
						close(all)
					}
				},
				Claims: ptr(benchClaims(o.first + i)), BootID: fmt.Sprintf("5e55b007-0000-4000-8000-%012x", o.first+i),
				Logger: logger,
			}
			sessions[i] = s
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.Run(ctx)
			}()
		}
	}()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
wait:
	for {
		select {
		case <-all:
			break wait
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			emit(loadgenEvent{Event: "progress", N: int(welcomed.Load()), Warnings: warn.n.Load()})
		}
	}
	emit(loadgenEvent{Event: "welcomed", N: len(nodes), Seconds: time.Since(start).Seconds(), Latencies: millis(lat), Warnings: warn.n.Load()})

	counts := func() *sessionCounts {
		sc := &sessionCounts{Started: len(nodes), Welcomed: int(welcomed.Load()), Welcomes: welcomes.Load(),
			Warnings: warn.n.Load(), LastWarning: warn.lastText()}
		for _, s := range sessions {
			if s.State().Connected {
				sc.Connected++
			}
		}
		return sc
	}
commands:
	for {
		select {
		case c := <-cmds:
			if c == cmdStats {
				emit(loadgenEvent{Event: "stats", Counts: counts()})
			}
		case <-ctx.Done():
			break commands
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return errors.New("the sessions did not end within 30 s of the exit")
	}
	emit(loadgenEvent{Event: "exit", Counts: counts()})
	return nil
}

func ptr[T any](v T) *T { return &v }

// millis are ds in ms, to a tenth.
func millis(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d/(100*time.Microsecond)) / 10
	}
	return out
}

// quantiles are the p50, p99 and max of ms.
func quantiles(ms []float64) (p50, p99, max float64) {
	s := slices.Clone(ms)
	slices.Sort(s)
	if len(s) == 0 {
		return 0, 0, 0
	}
	q := func(p float64) float64 { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return q(0.50), q(0.99), s[len(s)-1]
}

// parallel runs fn(0) … fn(n-1), workers at a time, and returns the first
// error (the others stop taking work).
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		// The caller's context ended (not ours: cancel runs only on return
		// or after an error).
		return ctx.Err()
	}
	return first
}
