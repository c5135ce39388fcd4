package gateway

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

const (
	closePolicy    = websocket.StatusPolicyViolation
	closeGoingAway = websocket.StatusGoingAway
	closeTryLater  = websocket.StatusTryAgainLater
)

// session is one agent's WebSocket. The handler goroutine reads; writeLoop
// writes. Nothing else runs per session.
//
// The reader never waits for the writer: what it stored it leaves in ackSeq
// and kicks writeLoop, which acknowledges the highest seq stored so far (an
// Ack covers every entry up to its seq). A reader that waited for the writer
// deadlocked with a writer that waited in a ping for the pong only the reader
// reads: under a site agent's stream of boot events the session stood still
// until the ping timed out, again at every ping, and the boot nonces in that
// stream reached the store tens of seconds late.
type session struct {
	srv    *Server
	conn   *websocket.Conn
	nodeID string
	role   string
	site   string
	// node is the node as the session found it: its site and role decide
	// what spec it gets. Only the session's goroutines read it.
	node store.Node
	id   int64
	log  *slog.Logger
	// upgradeOnly: the agent is older than MinVersion and is sent nothing
	// but daemon.upgrade.
	upgradeOnly bool

	ctx    context.Context
	cancel context.CancelFunc
	// ackSeq is the highest seq stored and not yet acknowledged (under
	// ackMu); ackKick tells writeLoop there is one.
	ackMu   sync.Mutex
	ackSeq  uint64
	ackKick chan struct{}
	kick    chan struct{}
	// specKick asks writeLoop to build the spec again; specRev is the
	// revision last written (writeLoop's alone once the Welcome is out).
	specKick chan struct{}
	specRev  int64
	ended    sync.Once
	// failed is set once the session failed: the ingester stores nothing more of
	// it, though frames read before its context ends may still be queued (an
	// ack of a later entry would cover the one that failed).
	failed atomic.Bool
	// closed is closed once the close handshake end started has finished.
	closed chan struct{}
	// sent holds the commands written in this session; only writeLoop
	// touches it.
	sent map[string]bool
	// welcomed is when the Welcome went out; resendArmed says a kick is
	// scheduled for the commands held back until ResendDelay after it.
	// Only writeLoop touches resendArmed.
	welcomed    time.Time
	resendArmed bool
}

// peer is who a verified client certificate names.
type peer struct {
	leaf         *x509.Certificate
	role, nodeID string
}

// verifyPeer checks the client certificate against the node CA and the trust
// domain; what calls for a certificate (a session, a renewal) is what.
func (s *Server) verifyPeer(r *http.Request, what string) (peer, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return peer{}, httpjson.Errorf(protocol.CodeUnauthenticated, "a %s needs the node's client certificate (from bcd join)", what)
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots:         s.NodeCAs,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		CurrentTime:   s.now(),
	}); err != nil {
		return peer{}, httpjson.Errorf(protocol.CodeUnauthenticated, "the client certificate does not verify against this control plane's node CA: %v", err)
	}
	if len(leaf.URIs) != 1 {
		return peer{}, httpjson.Errorf(protocol.CodeUnauthenticated, "the client certificate carries %d URIs, want one SPIFFE id", len(leaf.URIs))
	}
	td, role, nodeID, err := pki.ParseSPIFFEID(leaf.URIs[0].String())
	if err != nil {
		return peer{}, httpjson.Errorf(protocol.CodeUnauthenticated, "client certificate: %v", err)
	}
	if td != s.TrustDomain {
		return peer{}, httpjson.Errorf(protocol.CodeUnauthenticated, "client certificate is for trust domain %s, not %s", td, s.TrustDomain)
	}
	return peer{leaf: leaf, role: role, nodeID: nodeID}, nil
}

// authenticate checks the client certificate and the node it names.
func (s *Server) authenticate(r *http.Request) (store.Node, error) {
	p, err := s.verifyPeer(r, "session")
	if err != nil {
		return store.Node{}, err
	}
	leaf, role, nodeID := p.leaf, p.role, p.nodeID
	node, err := s.Store.GetNode(r.Context(), nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Node{}, httpjson.Errorf(protocol.CodeNodeRevoked, "node %s is not known to this control plane", nodeID)
	case err != nil:
		return store.Node{}, err
	case node.Deleted():
		return store.Node{}, httpjson.Errorf(protocol.CodeNodeRevoked, "node %s was deleted; to join again: bcd join --reset --yes, then bcd join", nodeID)
	case node.Role != role:
		return store.Node{}, httpjson.Errorf(protocol.CodeNodeRevoked, "node %s has role %s, the certificate says %s", nodeID, node.Role, role)
	case node.CertSerial != leaf.SerialNumber.Text(16):
		return store.Node{}, httpjson.Errorf(protocol.CodeNodeRevoked, "this certificate of node %s was replaced by a later join", nodeID)
	}
	return node, nil
}

func (s *Server) serveSession(w http.ResponseWriter, r *http.Request) {
	node, err := s.authenticate(r)
	if err != nil {
		if e := httpjson.Response(err); e != nil {
			s.log().Info("session refused", "code", e.Code, "reason", e.Message, "remote", r.RemoteAddr)
		}
		httpjson.WriteError(w, s.log(), err)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		httpjson.WriteError(w, s.log(), httpjson.Unavailable("the gateway is shutting down"))
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	started := false
	defer func() {
		if !started {
			s.wg.Done()
		}
	}()

	// The server's read and write deadlines would outlive the hijack and cut
	// a healthy session; heartbeats and per-write timeouts take over.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Time{})
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		s.log().Info("session: websocket upgrade failed", "node", node.ID, "err", err)
		return
	}
	conn.SetReadLimit(MaxFrameSize)
	ctx, cancel := context.WithCancel(context.Background())
	if node.Role == protocol.RoleSite {
		// One stream for all of its site's machines: its writes go first.
		ctx = store.WithPriority(ctx)
	}
	ss := &session{
		srv:      s,
		conn:     conn,
		nodeID:   node.ID,
		role:     node.Role,
		site:     node.Site,
		node:     node,
		log:      s.log().With("node", node.ID),
		ctx:      ctx,
		cancel:   cancel,
		ackKick:  make(chan struct{}, 1),
		kick:     make(chan struct{}, 1),
		specKick: make(chan struct{}, 1),
		sent:     make(map[string]bool),
		closed:   make(chan struct{}),
	}
	// The session reads on a goroutine of its own and the handler returns:
	// the connection's goroutine, its stack grown by the TLS handshake, and
	// the request are then freed for as long as the session lasts.
	started = true
	remote := r.RemoteAddr
	go func() {
		defer s.wg.Done()
		defer cancel()
		ss.run(node, remote)
		// Whatever ended the session, finish its close handshake before
		// Close stops waiting, so the agent reads why.
		ss.end(websocket.StatusNormalClosure, "")
		<-ss.closed
	}()
}

// run is the session from Hello to the end.
func (ss *session) run(node store.Node, remote string) {
	s := ss.srv
	hello, err := ss.readHello()
	if err != nil {
		ss.log.Info("session: no valid hello", "err", err)
		ss.fail(closePolicy, err)
		return
	}
	now := s.now()
	minVersion := orDefault(s.MinProtocolVersion, protocol.MinVersion)
	ss.upgradeOnly = hello.ProtocolVersion < minVersion
	ss.id, err = s.Store.OpenSession(ss.ctx, store.Session{
		NodeID: ss.nodeID, Role: ss.role, DaemonVersion: hello.DaemonVersion, DaemonArch: archOf(hello.DaemonArch), BootID: hello.BootID,
		ProtocolVersion: hello.ProtocolVersion, RemoteAddr: remote, ConnectedAt: now,
	})
	if err != nil {
		ss.log.Error("session: recording it failed", "err", err)
		ss.fail(closeTryLater, httpjson.Unavailable("the control plane could not record the session; try again"))
		return
	}
	defer func() {
		if err := s.Store.CloseSession(context.Background(), ss.id, s.now()); err != nil {
			ss.log.Error("session: recording its end failed", "err", err)
		}
		if s.Observer != nil {
			s.Observer.SessionChanged(ss.nodeID)
		}
	}()
	old, current := s.register(ss)
	if !current {
		ss.end(closePolicy, "replaced by a newer session of this node")
		return
	}
	defer s.unregister(ss)
	if old != nil {
		old.end(closePolicy, "replaced by a newer session of this node")
	}
	// Read the node again now that the session is registered: a delete or a
	// reclaim that ran since the certificate was checked found no session
	// to end, so this one must see it.
	fresh, err := s.Store.GetNode(ss.ctx, ss.nodeID)
	switch {
	case err != nil:
		ss.log.Error("session: reading the node failed", "err", err)
		ss.fail(closeTryLater, httpjson.Unavailable("the control plane could not read the node; try again"))
		return
	case fresh.Deleted() || fresh.CertSerial != node.CertSerial:
		ss.fail(closePolicy, httpjson.Errorf(protocol.CodeNodeRevoked, "node %s was deleted or joined again while this session opened", ss.nodeID))
		return
	}
	node = fresh
	ss.node = fresh
	ss.log.Info("session open", "session", ss.id, "daemon_version", hello.DaemonVersion, "daemon_arch", archOf(hello.DaemonArch),
		"protocol_version", hello.ProtocolVersion, "upgrade_required", ss.upgradeOnly, "remote", remote)

	spec, err := ss.spec()
	if err != nil {
		ss.log.Error("session: building the spec failed", "err", err)
		ss.fail(closeTryLater, httpjson.Unavailable("the control plane could not build the node's spec; try again"))
		return
	}
	ss.specRev = spec.Revision
	welcome := protocol.Welcome{
		ServerTime:         now.UTC(),
		MinProtocolVersion: minVersion,
		UpgradeRequired:    ss.upgradeOnly,
		NodeState:          node.State,
		Spec:               spec,
	}
	b, err := frame(protocol.FrameWelcome, welcome)
	if err == nil {
		err = ss.write(b)
	}
	if err != nil {
		ss.log.Info("session: welcome not written", "err", err)
		return
	}
	ss.welcomed = s.now()
	if node.State == protocol.NodeAdopting {
		if _, err := s.Store.SetNodeState(ss.ctx, ss.nodeID, protocol.NodeAdopting, protocol.NodeReady, s.now()); err != nil {
			ss.log.Error("session: marking the node ready failed", "err", err)
		}
	}
	if s.Observer != nil {
		s.Observer.SessionChanged(ss.nodeID)
	}

	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		ss.writeLoop()
	}()
	ss.kickCommands()
	ss.readLoop()
	ss.end(websocket.StatusNormalClosure, "")
	<-writerDone
	ss.log.Info("session closed", "session", ss.id)
}

func (ss *session) readHello() (protocol.Hello, error) {
	ctx, cancel := context.WithTimeout(ss.ctx, orDefault(ss.srv.HelloTimeout, DefaultHelloTimeout))
	defer cancel()
	typ, data, err := ss.conn.Read(ctx)
	if err != nil {
		return protocol.Hello{}, httpjson.Errorf(protocol.CodeInvalidInput, "reading hello: %v", err)
	}
	f, err := decodeFrame(typ, data)
	if err != nil {
		return protocol.Hello{}, err
	}
	if f.Type != protocol.FrameHello {
		return protocol.Hello{}, httpjson.Errorf(protocol.CodeInvalidInput, "the first frame must be %q, got %q", protocol.FrameHello, human.Short(f.Type))
	}
	var h protocol.Hello
	if err := f.Decode(&h); err != nil {
		return protocol.Hello{}, httpjson.Errorf(protocol.CodeInvalidInput, "hello: %v", err)
	}
	if h.NodeID != ss.nodeID || h.Role != ss.role {
		return protocol.Hello{}, httpjson.Errorf(protocol.CodeUnauthenticated,
			"hello says node %s role %s, the certificate says node %s role %s", human.Short(h.NodeID), human.Short(h.Role), ss.nodeID, ss.role)
	}
	return h, nil
}

func decodeFrame(typ websocket.MessageType, data []byte) (protocol.Frame, error) {
	if typ != websocket.MessageText {
		return protocol.Frame{}, httpjson.Errorf(protocol.CodeInvalidInput, "frames are JSON text messages")
	}
	var f protocol.Frame
	if err := json.Unmarshal(data, &f); err != nil {
		return protocol.Frame{}, httpjson.Errorf(protocol.CodeInvalidInput, "frame: %v", err)
	}
	return f, nil
}

// readLoop reads what the agent sends and queues its statuses and events for the
// server's ingester, which stores them in order and acknowledges them.
func (ss *session) readLoop() {
	for {
		typ, data, err := ss.conn.Read(ss.ctx)
		if err != nil {
			if ss.ctx.Err() == nil {
				ss.log.Info("session: read ended", "status", websocket.CloseStatus(err), "err", err)
			}
			return
		}
		f, err := decodeFrame(typ, data)
		if err != nil {
			ss.fail(closePolicy, err)
			return
		}
		switch f.Type {
		case protocol.FrameStatus, protocol.FrameEvent:
			ss.srv.ingest.put(ss, f)
		case protocol.FrameHello:
			ss.fail(closePolicy, httpjson.Errorf(protocol.CodeInvalidInput, "hello sent twice"))
			return
		default:
			// A newer agent's frame this gateway does not know: ignore it
			// rather than drop the session.
			ss.log.Debug("session: ignoring a frame", "type", human.Short(f.Type))
		}
	}
}

// store stores a batch of the session's statuses and events in order and
// acknowledges what it stored; false when the session must end (it has failed it).
// Only the ingester calls it.
func (ss *session) store(batch []protocol.Frame) bool {
	var events []protocol.Event
	var acked, stored uint64
	var ackable bool
	storeEvents := func() bool {
		if len(events) == 0 {
			return true
		}
		if err := ss.events(events); err != nil {
			ss.log.Error("session: storing events failed", "events", len(events), "err", err)
			if ackable {
				ss.ack(acked) // what was stored before stays stored
			}
			ss.fail(closeTryLater, httpjson.Unavailable("the control plane could not store the event; it will be replayed"))
			return false
		}
		acked, ackable = stored, true
		events = events[:0]
		return true
	}
	for _, f := range batch {
		switch f.Type {
		case protocol.FrameStatus:
			var st protocol.Status
			if err := f.Decode(&st); err != nil {
				ss.fail(closePolicy, httpjson.Errorf(protocol.CodeInvalidInput, "status: %v", err))
				return false
			}
			if !storeEvents() {
				return false
			}
			if err := ss.status(st); err != nil {
				ss.log.Error("session: storing a status failed", "err", err)
				if ackable {
					ss.ack(acked)
				}
				ss.fail(closeTryLater, httpjson.Unavailable("the control plane could not store the status; it will be replayed"))
				return false
			}
			acked, stored, ackable = st.Seq, st.Seq, true
		case protocol.FrameEvent:
			var ev protocol.Event
			if err := f.Decode(&ev); err != nil {
				ss.fail(closePolicy, httpjson.Errorf(protocol.CodeInvalidInput, "event: %v", err))
				return false
			}
			events = append(events, ev)
			stored = ev.Seq
		}
	}
	if !storeEvents() {
		return false
	}
	if ackable {
		ss.ack(acked)
	}
	return true
}

func (ss *session) status(st protocol.Status) error {
	if st.CommandID == "" || !protocol.Terminal(st.State) && st.State != protocol.StateRunning {
		// Acknowledged all the same: replaying it would not make it valid.
		ss.log.Warn("session: ignoring a malformed status", "command", human.Short(st.CommandID), "state", human.Short(st.State))
		return nil
	}
	var progress []byte
	if st.Progress != nil {
		progress, _ = json.Marshal(st.Progress)
	}
	ok, err := ss.srv.Store.ApplyStatus(ss.ctx, store.StatusUpdate{
		CommandID: st.CommandID, NodeID: ss.nodeID, State: st.State, Reason: st.Reason, Message: st.Message,
		Progress: progress, Result: st.Result, At: ss.srv.now(),
	})
	if err != nil {
		return err
	}
	if !ok {
		ss.log.Info("session: status of an unknown or finished command", "command", human.Short(st.CommandID), "state", st.State)
		return nil
	}
	if ss.srv.Observer != nil {
		ss.srv.Observer.StatusApplied(ss.nodeID, st.CommandID)
	}
	return nil
}

// events stores a batch of events: the records they make (Events), then the
// events themselves in one transaction.
func (ss *session) events(evs []protocol.Event) error {
	now := ss.srv.now()
	for i := range evs {
		if evs[i].Time.IsZero() {
			evs[i].Time = now
		}
		if evs[i].Kind == "" {
			evs[i].Kind = "unknown"
		}
	}
	if ss.srv.Events != nil {
		var err error
		if evs, err = ss.srv.Events.Events(ss.ctx, ss.node, evs); err != nil {
			return err
		}
	}
	rows := make([]store.Event, len(evs))
	for i, ev := range evs {
		if ev.Kind == protocol.EventSectionStatus {
			if err := ss.sectionStatus(ev); err != nil {
				return err
			}
		}
		rows[i] = store.Event{NodeID: ss.nodeID, SessionID: ss.id, Seq: ev.Seq, Kind: ev.Kind, Time: ev.Time, Level: ev.Level,
			Message: ev.Message, Data: ev.Data, ReceivedAt: now}
	}
	return ss.srv.Store.AddEvents(ss.ctx, rows)
}

// maxSectionText bounds a section status's message as stored.
const maxSectionText = 1024

// sectionStatus records a section.status event as the node's latest report
// on the section, unless the store has a newer one (a replay of an older
// report changes nothing). A malformed one is stored as an event only.
func (ss *session) sectionStatus(ev protocol.Event) error {
	var st protocol.SectionStatus
	if err := json.Unmarshal(ev.Data, &st); err != nil || st.Section == "" || len(st.Section) > 64 ||
		!protocol.Terminal(st.State) && st.State != protocol.SectionRunning {
		ss.log.Warn("session: ignoring a malformed section.status", "section", human.Short(st.Section), "state", human.Short(st.State))
		return nil
	}
	applied, err := ss.srv.Store.ApplySectionStatus(ss.ctx, store.SectionStatus{NodeID: ss.nodeID, Section: st.Section, State: st.State,
		Reason: human.ShortN(st.Reason, 64), Message: human.ShortN(st.Message, maxSectionText), Version: human.ShortN(st.Version, 80),
		Revision: st.Revision, At: ev.Time, ReceivedAt: ss.srv.now()})
	if err != nil {
		return err
	}
	if applied {
		ss.log.Info("section status", "section", st.Section, "state", st.State, "reason", st.Reason, "version", st.Version, "revision", st.Revision)
		if ss.srv.Sections != nil {
			ss.srv.Sections.SectionChanged(ss.nodeID, st.Section)
		}
	}
	return nil
}

// archOf is the GOARCH an agent says it runs on, as stored: "" for a value
// that is no GOARCH's form.
func archOf(a string) string {
	if a == "" || len(a) > 16 {
		return ""
	}
	for _, r := range a {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return ""
		}
	}
	return a
}

// ack records that the entry seq is stored, for writeLoop to acknowledge. It
// never blocks.
func (ss *session) ack(seq uint64) {
	ss.ackMu.Lock()
	if seq > ss.ackSeq {
		ss.ackSeq = seq
	}
	ss.ackMu.Unlock()
	select {
	case ss.ackKick <- struct{}{}:
	default:
	}
}

// writeAck acknowledges everything stored since the last Ack.
func (ss *session) writeAck(acked *uint64) error {
	ss.ackMu.Lock()
	seq := ss.ackSeq
	ss.ackMu.Unlock()
	if seq <= *acked {
		return nil
	}
	b, err := frame(protocol.FrameAck, protocol.Ack{Seq: seq})
	if err != nil {
		return err
	}
	if err := ss.write(b); err != nil {
		return err
	}
	*acked = seq
	return nil
}

func (ss *session) kickSpec() {
	select {
	case ss.specKick <- struct{}{}:
	default:
	}
}

// spec builds the node's spec from the node as stored now: its daemon
// target and revision change while the session lasts. ss.node is left as
// it is, for the read loop.
func (ss *session) spec() (*protocol.Spec, error) {
	node, err := ss.srv.Store.GetNode(ss.ctx, ss.nodeID)
	if err != nil {
		return nil, err
	}
	if ss.srv.Specs == nil {
		return &protocol.Spec{Revision: node.SpecRevision}, nil
	}
	return ss.srv.Specs.Spec(ss.ctx, node)
}

// pushSpec writes the spec when its revision is past the one last written.
func (ss *session) pushSpec() error {
	spec, err := ss.spec()
	if err != nil {
		return err
	}
	if spec.Revision <= ss.specRev {
		return nil
	}
	b, err := frame(protocol.FrameSpec, spec)
	if err != nil {
		return err
	}
	if err := ss.write(b); err != nil {
		return err
	}
	ss.specRev = spec.Revision
	ss.log.Info("spec sent", "revision", spec.Revision)
	return nil
}

func (ss *session) kickCommands() {
	select {
	case ss.kick <- struct{}{}:
	default:
	}
}

// writeLoop writes queued frames, delivers commands and pings.
func (ss *session) writeLoop() {
	interval := orDefault(ss.srv.PingInterval, DefaultPingInterval)
	maxMissed := orDefault(ss.srv.MissedPings, DefaultMissedPings)
	t := time.NewTicker(interval)
	defer t.Stop()
	missed := 0
	var acked uint64
	for {
		select {
		case <-ss.ctx.Done():
			return
		case <-ss.ackKick:
			if err := ss.writeAck(&acked); err != nil {
				ss.drop()
				return
			}
		case <-ss.specKick:
			if ss.upgradeOnly {
				continue
			}
			if err := ss.pushSpec(); err != nil {
				ss.log.Info("session: sending the spec failed", "err", err)
				ss.end(closeTryLater, "sending the spec failed")
				return
			}
		case <-ss.kick:
			if err := ss.deliver(); err != nil {
				ss.log.Info("session: delivering commands failed", "err", err)
				ss.end(closeTryLater, "delivering commands failed")
				return
			}
		case <-t.C:
			ctx, cancel := context.WithTimeout(ss.ctx, interval)
			err := ss.conn.Ping(ctx)
			cancel()
			switch {
			case err == nil:
				missed = 0
			case ss.ctx.Err() != nil:
				return
			case errors.Is(err, context.DeadlineExceeded):
				missed++
				if missed >= maxMissed {
					ss.log.Info("session: dropped after missed heartbeats", "missed", missed)
					ss.drop()
					return
				}
			default:
				ss.drop()
				return
			}
		}
	}
}

// deliver writes the node's open commands this session has not sent yet.
// A command the agent reported RUNNING is not sent again: the agent has it,
// and its journal replays what became of it, so a deploy that finished while
// the gateway was away is not run twice. A command an earlier session sent
// without an answer is held until ResendDelay after the Welcome, for the
// replay to land first, and sent only if it is still unanswered.
func (ss *session) deliver() error {
	cmds, err := ss.srv.Store.OpenCommands(ss.ctx, ss.nodeID)
	if err != nil {
		return err
	}
	resendAt := ss.welcomed.Add(orDefault(ss.srv.ResendDelay, DefaultResendDelay))
	now := ss.srv.now()
	for _, c := range cmds {
		if ss.sent[c.ID] || ss.upgradeOnly && c.Kind != protocol.KindDaemonUpgrade || c.State == protocol.StateRunning {
			continue
		}
		if !c.SentAt.IsZero() && now.Before(resendAt) {
			if !ss.resendArmed {
				ss.resendArmed = true
				time.AfterFunc(resendAt.Sub(now), ss.kickCommands)
			}
			continue
		}
		b, err := frame(protocol.FrameCommand, protocol.Command{ID: c.ID, Kind: c.Kind, Params: c.Params})
		if err != nil {
			return err
		}
		if err := ss.write(b); err != nil {
			return err
		}
		ss.sent[c.ID] = true
		if err := ss.srv.Store.MarkSent(ss.ctx, c.ID, ss.srv.now()); err != nil {
			return err
		}
		ss.log.Info("command sent", "command", c.ID, "kind", c.Kind)
	}
	return nil
}

func (ss *session) write(b []byte) error {
	ctx, cancel := context.WithTimeout(ss.ctx, orDefault(ss.srv.WriteTimeout, DefaultWriteTimeout))
	defer cancel()
	return ss.conn.Write(ctx, websocket.MessageText, b)
}

// fail tells the agent why in an Error frame, then ends the session.
func (ss *session) fail(code websocket.StatusCode, err error) {
	ss.failed.Store(true)
	e := httpjson.Response(err)
	if e == nil {
		e = httpjson.Errorf(protocol.CodeInternal, "%v", err)
	}
	if b, ferr := frame(protocol.FrameError, e); ferr == nil {
		ss.write(b)
	}
	ss.end(code, e.Code)
}

// end closes the session with code and reason (at most 123 bytes, the
// WebSocket limit). It returns at once; the close handshake runs on its own.
func (ss *session) end(code websocket.StatusCode, reason string) {
	ss.ended.Do(func() {
		if len(reason) > 120 {
			reason = reason[:120]
		}
		go func() {
			defer close(ss.closed)
			ss.conn.Close(code, reason)
			ss.cancel()
		}()
	})
}

// drop closes a session whose peer is gone or broken, without waiting for a
// close handshake it would not answer.
func (ss *session) drop() {
	ss.ended.Do(func() {
		go func() {
			defer close(ss.closed)
			ss.conn.CloseNow()
			ss.cancel()
		}()
	})
}

func frame(typ string, v any) ([]byte, error) {
	f, err := protocol.NewFrame(typ, v)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("gateway: encode %s frame: %w", typ, err)
	}
	return b, nil
}
