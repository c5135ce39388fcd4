package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/internal/labfault"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/protocol"
)

// Handler runs one command. It reports progress through report, which fills in the
// command id and time and journals each status before sending it. A returned error
// becomes a FAILED status carrying its message; nil means the handler has reported
// everything it will (a command that ends the process, like node.reboot, reports
// its end from the next process).
type Handler func(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error

// Defaults of Session's tunables.
const (
	DefaultPingInterval     = 30 * time.Second
	DefaultPingTimeout      = 15 * time.Second
	DefaultHandshakeTimeout = 30 * time.Second
	// MaxFrameSize bounds one message from the gateway; a spec with a site's boot
	// table fits with room to spare.
	MaxFrameSize = 8 << 20
	writeTimeout = 10 * time.Second
)

// Reasons the session puts in statuses it makes itself.
const (
	ReasonUnsupported = "Unsupported"
	ReasonError       = "Error"
)

// Session keeps the agent's session with the gateway: it dials {GatewayURL}/v1/session
// over mutual TLS pinned to the serving CA, says Hello, waits for Welcome, replays
// the journal's unacknowledged statuses and events, then runs commands and applies
// specs until the connection drops, and dials again with jittered exponential
// backoff. Fields must be set before Run and not changed after.
type Session struct {
	// GatewayURL is gateway_url; ServerName the name its certificate must carry
	// (gateway_server_name or the URL's host); ServingCAPin serving_ca_spki_pin.
	GatewayURL   string
	ServerName   string
	ServingCAPin string
	// Proxy, when set, is an HTTP proxy (http://host:port) the session reaches the
	// gateway through with CONNECT, as the ramdisk does through its site agent.
	Proxy *url.URL
	// Identity is the node certificate and key the session authenticates with.
	Identity *Identity
	// Current, if set, returns the identity to present at each connection (a
	// Renewer's Current), so a renewed certificate is used from the next
	// connection on; nil presents Identity.
	Current func() *Identity
	// Journal holds every status and event until the gateway acknowledges it.
	Journal *journal.Journal
	// Handlers run commands by kind. A kind without a handler, or one the role
	// may not run, is answered UNSUPPORTED.
	Handlers map[string]Handler
	// OnWelcome, if set, runs after each Welcome, before the journal is replayed
	// and before any command runs; first is true for the first Welcome of Run.
	OnWelcome func(ctx context.Context, w protocol.Welcome, first bool)
	// OnSpec, if set, receives the desired state: Welcome's spec and every Spec
	// frame. It runs on the session's reader, so it must not block for long.
	OnSpec func(ctx context.Context, spec protocol.Spec)
	// Claims go into Hello; nil sends none.
	Claims *protocol.Claims
	// BootID goes into Hello (see BootID).
	BootID string
	// PingInterval, PingTimeout and HandshakeTimeout: zero means the defaults.
	PingInterval, PingTimeout, HandshakeTimeout time.Duration
	// Backoff spaces reconnects; the zero value waits 1 s doubling to 1 min.
	Backoff Backoff
	// Logger receives what happens; nil discards it.
	Logger *slog.Logger

	runCtx   context.Context
	handlers sync.WaitGroup

	// sendMu orders journal appends and writes, so that frames reach the
	// gateway in sequence order, replay included.
	sendMu sync.Mutex
	conn   *websocket.Conn

	// acks removes acknowledged entries from the journal off the reader.
	acks acker
	// failSend, set by tests, fails a live send as a write that timed out
	// waiting for the connection does: nothing written, the connection up.
	failSend func() bool

	mu              sync.Mutex
	running         map[string]bool
	finished        finishedCommands
	state           SessionState
	upgradeRequired bool
}

// SessionState is what a status socket says about the session.
type SessionState struct {
	// Connected is true between a Welcome and the end of that connection.
	Connected bool `json:"connected"`
	// NodeState is what the last Welcome said the gateway records for the node.
	NodeState string `json:"node_state,omitempty"`
	// LastWelcome is when the gateway last welcomed the agent.
	LastWelcome time.Time `json:"last_welcome,omitzero"`
	// LastError is why the last connection ended or failed.
	LastError string `json:"last_error,omitempty"`
	// Pending is the number of statuses and events awaiting an Ack.
	Pending int `json:"pending"`
}

// State returns a snapshot of the session.
func (s *Session) State() SessionState {
	s.mu.Lock()
	st := s.state
	s.mu.Unlock()
	if s.Journal != nil {
		st.Pending = s.Journal.Len()
	}
	return st
}

func (s *Session) log() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Run keeps the session until ctx is done, then waits for running handlers to
// return and returns ctx's error.
func (s *Session) Run(ctx context.Context) error {
	if s.Identity == nil || s.Journal == nil {
		return errors.New("session: no identity or journal")
	}
	if _, err := s.httpClient(); err != nil {
		return err
	}
	s.runCtx = ctx
	s.mu.Lock()
	s.running = map[string]bool{}
	s.mu.Unlock()
	defer s.handlers.Wait()
	stopAcks := s.acks.start(s.Journal, s.log())
	defer stopAcks()
	if labfault.NoWelcome {
		// A lab release that must never confirm a self-update (see labfault).
		s.log().Error("this is a labfault_nowelcome build: never dialling the gateway")
		<-ctx.Done()
		return ctx.Err()
	}
	first := true
	for attempt := 0; ; attempt++ {
		welcomed, err := s.connect(ctx, first)
		if welcomed {
			first = false
			attempt = 0
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.mu.Lock()
		s.state.LastError = err.Error()
		s.mu.Unlock()
		d := s.Backoff.Delay(attempt)
		s.log().Warn("gateway session ended; reconnecting", "error", err.Error(), "retry_in", d.Round(time.Millisecond).String())
		if !Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

func (s *Session) sessionURL() string {
	return strings.TrimRight(s.GatewayURL, "/") + protocol.PathSession
}

func (s *Session) httpClient() (*http.Client, error) {
	current := s.Current
	if current == nil {
		current = func() *Identity { return s.Identity }
	}
	cfg, err := ClientTLSConfigFor(current, s.ServingCAPin, s.ServerName)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	proxy, err := ProxyFor(s.Proxy, s.GatewayURL)
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     cfg,
		DialContext:         ProxyDialer(proxy, &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
		TLSHandshakeTimeout: 15 * time.Second,
		// A WebSocket is HTTP/1.1; the agent talks to the gateway directly, or
		// through a CONNECT tunnel that carries the TLS end to end.
		ForceAttemptHTTP2: false,
	}}, nil
}

// connect runs one connection from dial to drop and reports whether it was welcomed.
func (s *Session) connect(ctx context.Context, first bool) (welcomed bool, err error) {
	client, err := s.httpClient()
	if err != nil {
		return false, err
	}
	defer client.CloseIdleConnections()
	hctx, cancel := context.WithTimeout(ctx, orDefault(s.HandshakeTimeout, DefaultHandshakeTimeout))
	defer cancel()
	conn, resp, err := websocket.Dial(hctx, s.sessionURL(), &websocket.DialOptions{HTTPClient: client})
	if err != nil {
		if resp != nil && resp.Body != nil {
			return false, refusal(resp, err)
		}
		return false, fmt.Errorf("dial %s: %w", s.sessionURL(), err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(MaxFrameSize)

	hello := protocol.Hello{
		ProtocolVersion: helloProtocolVersion(),
		NodeID:          s.Identity.NodeID,
		Role:            s.Identity.Role,
		DaemonVersion:   version.Version,
		BootID:          s.BootID,
		DaemonArch:      runtime.GOARCH,
		Claims:          s.Claims,
	}
	if err := writeFrame(hctx, conn, protocol.FrameHello, hello); err != nil {
		return false, fmt.Errorf("send hello: %w", err)
	}
	w, err := readWelcome(hctx, conn)
	if err != nil {
		return false, err
	}
	if w.MinProtocolVersion > hello.ProtocolVersion {
		s.log().Error("the gateway wants a newer protocol than this bcd speaks; upgrade bcd",
			"min_protocol_version", w.MinProtocolVersion, "protocol_version", hello.ProtocolVersion)
	}
	s.mu.Lock()
	s.upgradeRequired = w.UpgradeRequired
	s.mu.Unlock()
	s.log().Info("gateway session welcomed", "gateway", s.GatewayURL, "node_state", w.NodeState, "upgrade_required", w.UpgradeRequired)
	if s.OnWelcome != nil {
		s.OnWelcome(ctx, w, first)
	}
	if w.Spec != nil && s.OnSpec != nil {
		s.OnSpec(ctx, *w.Spec)
	}

	if err := s.replayAndAttach(ctx, conn); err != nil {
		return true, err
	}
	s.mu.Lock()
	s.state.Connected, s.state.NodeState, s.state.LastWelcome = true, w.NodeState, time.Now()
	s.mu.Unlock()
	defer func() {
		s.sendMu.Lock()
		s.conn = nil
		s.sendMu.Unlock()
		s.mu.Lock()
		s.state.Connected = false
		s.mu.Unlock()
	}()

	cctx, stop := context.WithCancel(ctx)
	defer stop()
	go s.heartbeat(cctx, conn)
	return true, s.readLoop(cctx, conn)
}

// refusal reads the gateway's ErrorResponse from a refused upgrade.
func refusal(resp *http.Response, dialErr error) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	var e protocol.ErrorResponse
	if json.Unmarshal(body, &e) == nil && e.Code != "" {
		return fmt.Errorf("gateway refused the session (HTTP %d): %w", resp.StatusCode, &e)
	}
	return fmt.Errorf("gateway refused the session (HTTP %d): %w", resp.StatusCode, dialErr)
}

func readWelcome(ctx context.Context, conn *websocket.Conn) (protocol.Welcome, error) {
	var w protocol.Welcome
	f, err := readFrame(ctx, conn)
	if err != nil {
		return w, fmt.Errorf("waiting for welcome: %w", err)
	}
	switch f.Type {
	case protocol.FrameWelcome:
		if err := f.Decode(&w); err != nil {
			return w, err
		}
		return w, nil
	case protocol.FrameError:
		var e protocol.ErrorResponse
		if err := f.Decode(&e); err != nil {
			return w, err
		}
		return w, fmt.Errorf("gateway refused hello: %w", &e)
	}
	return w, fmt.Errorf("gateway answered hello with a %q frame, want welcome", f.Type)
}

func readFrame(ctx context.Context, conn *websocket.Conn) (protocol.Frame, error) {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return protocol.Frame{}, err
		}
		if typ != websocket.MessageText {
			continue // the protocol sends text only; a binary message has no meaning
		}
		var f protocol.Frame
		if err := json.Unmarshal(data, &f); err != nil {
			return protocol.Frame{}, fmt.Errorf("a message from the gateway is not a frame: %w", err)
		}
		return f, nil
	}
}

func writeFrame(ctx context.Context, conn *websocket.Conn, typ string, v any) error {
	f, err := protocol.NewFrame(typ, v)
	if err != nil {
		return err
	}
	return writeRaw(ctx, conn, f)
}

func writeRaw(ctx context.Context, conn *websocket.Conn, f protocol.Frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return conn.Write(ctx, websocket.MessageText, b)
}

// replayAndAttach sends every unacknowledged entry, then makes conn the connection
// new statuses go to, all under sendMu so nothing new overtakes the replay.
func (s *Session) replayAndAttach(ctx context.Context, conn *websocket.Conn) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	pending, err := s.Journal.Pending()
	if err != nil {
		return err
	}
	for _, e := range pending {
		if err := writeRaw(ctx, conn, protocol.Frame{Type: e.Type, Data: e.Data}); err != nil {
			return fmt.Errorf("replay journal entry %d: %w", e.Seq, err)
		}
	}
	if len(pending) > 0 {
		s.log().Info("replayed unacknowledged journal entries", "count", len(pending))
	}
	s.conn = conn
	return nil
}

func (s *Session) heartbeat(ctx context.Context, conn *websocket.Conn) {
	t := time.NewTicker(orDefault(s.PingInterval, DefaultPingInterval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, orDefault(s.PingTimeout, DefaultPingTimeout))
		err := conn.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.log().Warn("gateway did not answer a ping; dropping the connection", "error", err.Error())
			}
			conn.CloseNow() // the reader returns and Run reconnects
			return
		}
	}
}

func (s *Session) readLoop(ctx context.Context, conn *websocket.Conn) error {
	for {
		f, err := readFrame(ctx, conn)
		if err != nil {
			return err
		}
		switch f.Type {
		case protocol.FrameSpec:
			var spec protocol.Spec
			if err := f.Decode(&spec); err != nil {
				s.log().Warn("ignoring a spec that does not decode", "error", err.Error())
				continue
			}
			if s.OnSpec != nil {
				s.OnSpec(ctx, spec)
			}
		case protocol.FrameCommand:
			var cmd protocol.Command
			if err := f.Decode(&cmd); err != nil {
				s.log().Warn("ignoring a command that does not decode", "error", err.Error())
				continue
			}
			s.dispatch(cmd)
		case protocol.FrameAck:
			var ack protocol.Ack
			if err := f.Decode(&ack); err != nil {
				s.log().Warn("ignoring an ack that does not decode", "error", err.Error())
				continue
			}
			s.acks.note(ack.Seq)
		case protocol.FrameError:
			var e protocol.ErrorResponse
			if err := f.Decode(&e); err != nil {
				return err
			}
			return fmt.Errorf("gateway: %w", &e)
		default:
			s.log().Debug("ignoring a frame of unknown type", "type", f.Type)
		}
	}
}

func (s *Session) dispatch(cmd protocol.Command) {
	if cmd.ID == "" {
		s.log().Warn("ignoring a command without an id", "kind", cmd.Kind)
		return
	}
	s.mu.Lock()
	if s.running[cmd.ID] {
		s.mu.Unlock()
		s.log().Info("command already running; ignoring the repeat", "command_id", cmd.ID, "kind", cmd.Kind)
		return
	}
	if st, done := s.finished.get(cmd.ID); done {
		s.mu.Unlock()
		// A gateway that went down before it stored the end of a command sends it
		// again; running it twice (a second deploy, a second power cycle) would be
		// wrong, so it gets the status it missed instead.
		s.log().Info("command already finished; answering with its status again", "command_id", cmd.ID, "kind", cmd.Kind, "state", st.State)
		st.Seq = 0
		if err := s.emitStatus(st); err != nil {
			s.log().Error("could not journal a status", "command_id", cmd.ID, "error", err.Error())
		}
		return
	}
	h, ok := s.Handlers[cmd.Kind]
	role := s.Identity.Role
	switch {
	case !protocol.KindAllowed(role, cmd.Kind):
		ok = false
	case s.upgradeRequired && cmd.Kind != protocol.KindDaemonUpgrade:
		ok = false
	}
	if ok {
		s.running[cmd.ID] = true
	}
	s.mu.Unlock()
	report := func(st protocol.Status) error {
		st.CommandID = cmd.ID
		return s.emitStatus(st)
	}
	if !ok {
		s.log().Info("answering UNSUPPORTED", "command_id", cmd.ID, "kind", cmd.Kind)
		if err := report(protocol.Status{
			State:   protocol.StateUnsupported,
			Reason:  ReasonUnsupported,
			Message: fmt.Sprintf("bcd %s does not run %q commands", role, cmd.Kind),
		}); err != nil {
			s.log().Error("could not journal a status", "command_id", cmd.ID, "error", err.Error())
		}
		return
	}
	s.handlers.Add(1)
	go func() {
		defer s.handlers.Done()
		defer func() {
			s.mu.Lock()
			delete(s.running, cmd.ID)
			s.mu.Unlock()
		}()
		s.log().Info("running command", "command_id", cmd.ID, "kind", cmd.Kind)
		if err := h(s.runCtx, cmd, report); err != nil {
			s.log().Warn("command failed", "command_id", cmd.ID, "kind", cmd.Kind, "error", err.Error())
			if rerr := report(protocol.Status{State: protocol.StateFailed, Reason: ReasonError, Message: err.Error()}); rerr != nil {
				s.log().Error("could not journal a status", "command_id", cmd.ID, "error", rerr.Error())
			}
		}
	}()
}

// emitStatus journals st, then sends it if a connection is up. Once journaled it is
// as good as sent: a failed write is replayed after the next Welcome.
func (s *Session) emitStatus(st protocol.Status) error {
	if st.Time.IsZero() {
		st.Time = time.Now().UTC()
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	st, err := s.Journal.AppendStatus(st)
	if err != nil {
		return err
	}
	if protocol.Terminal(st.State) && st.CommandID != "" {
		s.mu.Lock()
		s.finished.add(st)
		s.mu.Unlock()
	}
	s.sendLocked(protocol.FrameStatus, st)
	return nil
}

// finishedCommands remembers the terminal statuses of the last commands this
// process ran, so that a command the gateway sends again is answered, not rerun.
type finishedCommands struct {
	byID  map[string]protocol.Status
	order []string
}

// maxFinishedCommands bounds the memory: a gateway repeats only what it sent
// since its last restart and has no status of, far fewer than this.
const maxFinishedCommands = 1024

func (f *finishedCommands) add(st protocol.Status) {
	if f.byID == nil {
		f.byID = map[string]protocol.Status{}
	}
	if _, ok := f.byID[st.CommandID]; !ok {
		f.order = append(f.order, st.CommandID)
	}
	f.byID[st.CommandID] = st
	if len(f.order) > maxFinishedCommands {
		delete(f.byID, f.order[0])
		f.order = f.order[1:]
	}
}

func (f *finishedCommands) get(id string) (protocol.Status, bool) {
	st, ok := f.byID[id]
	return st, ok
}

// Event journals ev and sends it if a connection is up.
func (s *Session) Event(ev protocol.Event) error {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	ev, err := s.Journal.AppendEvent(ev)
	if err != nil {
		return err
	}
	s.sendLocked(protocol.FrameEvent, ev)
	return nil
}

// Events journals evs in one transaction and sends them if a connection is up: a
// storm of boot events costs one write to disk per batch, not per event.
func (s *Session) Events(evs []protocol.Event) error {
	now := time.Now().UTC()
	for i := range evs {
		if evs[i].Time.IsZero() {
			evs[i].Time = now
		}
	}
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	evs, err := s.Journal.AppendEvents(evs)
	if err != nil {
		return err
	}
	for _, ev := range evs {
		s.sendLocked(protocol.FrameEvent, ev)
	}
	return nil
}

// ReportStatus journals and sends a status for a command outside any handler, such
// as the end of a node.reboot, which only the next process can see.
func (s *Session) ReportStatus(st protocol.Status) error {
	return s.emitStatus(st)
}

func (s *Session) sendLocked(typ string, v any) {
	if s.conn == nil {
		return
	}
	ctx := s.runCtx
	if ctx == nil {
		ctx = context.Background()
	}
	var err error
	if s.failSend != nil && s.failSend() {
		err = errors.New("failed by the test")
	} else {
		err = writeFrame(ctx, s.conn, typ, v)
	}
	if err != nil {
		// A frame that did not go out must not be overtaken by the next: the
		// gateway's Ack covers every entry up to its seq, so the Ack of a later
		// entry would take this one out of the journal unsent. A write can fail
		// and leave the connection up (coder/websocket gives up waiting for
		// the connection's write lock, held by a ping stuck behind a full TCP
		// window, without closing it), so the connection goes here, and the
		// next one replays the journal from this entry on.
		s.log().Warn("a frame was not sent; reconnecting, the journal replays it", "type", typ, "error", err.Error())
		s.conn.CloseNow()
		s.conn = nil
	}
}

// Flush waits until the gateway has acknowledged every status and event journaled
// before the call, or ctx ends. A command that takes the machine down (kexec, reboot,
// power off) flushes first: once the machine is gone, nothing replays the journal.
func (s *Session) Flush(ctx context.Context) error {
	pending, err := s.Journal.Pending()
	if err != nil {
		return err
	}
	if len(pending) == 0 {
		return nil
	}
	last := pending[len(pending)-1].Seq
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		pending, err := s.Journal.Pending()
		if err != nil {
			return err
		}
		if len(pending) == 0 || pending[0].Seq > last {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d statuses and events still unacknowledged: %w", countUpTo(pending, last), ctx.Err())
		case <-t.C:
		}
	}
}

func countUpTo(entries []journal.Entry, seq uint64) int {
	n := 0
	for _, e := range entries {
		if e.Seq <= seq {
			n++
		}
	}
	return n
}

// acker applies the gateway's acknowledgements to the journal. Acks are cumulative,
// so while one removal (a disk write) runs, the acks arriving meanwhile fold into
// the next: a storm of events acknowledged one by one costs a few writes, not one
// each. An ack not applied when the process ends only means a replay the gateway
// already has.
type acker struct {
	mu      sync.Mutex
	journal *journal.Journal
	log     *slog.Logger
	latest  uint64 // the highest seq acknowledged
	applied uint64 // the highest seq removed from the journal
	kick    chan struct{}
}

// start runs the remover until the returned stop is called; stop applies what is
// still waiting.
func (a *acker) start(j *journal.Journal, log *slog.Logger) (stop func()) {
	a.mu.Lock()
	a.journal, a.log = j, log
	a.kick = make(chan struct{}, 1)
	kick := a.kick
	a.mu.Unlock()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-kick:
				a.apply()
			case <-done:
				a.apply()
				return
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// note records an ack for the remover Run started.
func (a *acker) note(seq uint64) {
	a.mu.Lock()
	if seq > a.latest {
		a.latest = seq
	}
	kick := a.kick
	a.mu.Unlock()
	select {
	case kick <- struct{}{}:
	default: // a removal is already due; it will see this seq
	}
}

func (a *acker) apply() {
	a.mu.Lock()
	seq, j, log := a.latest, a.journal, a.log
	if seq <= a.applied || j == nil {
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	if _, err := j.Ack(seq); err != nil {
		log.Error("could not remove acknowledged entries from the journal", "seq", seq, "error", err.Error())
		return
	}
	a.mu.Lock()
	if seq > a.applied {
		a.applied = seq
	}
	a.mu.Unlock()
}
