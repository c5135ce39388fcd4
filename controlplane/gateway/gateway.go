package gateway

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/controlplane/httpjson"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/lograte"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of the Server's zero fields.
const (
	DefaultPingInterval = 15 * time.Second
	DefaultMissedPings  = 3
	DefaultHelloTimeout = 10 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	DefaultResendDelay  = 2 * time.Second
	// MaxFrameSize bounds one message from an agent. A status with a
	// command's result (an inventory) is the largest.
	MaxFrameSize = 1 << 20
)

// Joiner answers joins: the JoinService.
type Joiner interface {
	Join(ctx context.Context, req *protocol.JoinRequest) (*protocol.JoinResponse, error)
}

// Renewer answers certificate renewals: the JoinService.
type Renewer interface {
	Renew(ctx context.Context, r join.Renewal) (*protocol.JoinResponse, error)
}

// Store is what sessions read and write.
type Store interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	SetNodeState(ctx context.Context, id, from, to string, at time.Time) (bool, error)
	store.Sessions
	OpenCommands(ctx context.Context, nodeID string) ([]store.Command, error)
	MarkSent(ctx context.Context, id string, at time.Time) error
	ApplyStatus(ctx context.Context, u store.StatusUpdate) (bool, error)
	ApplySectionStatus(ctx context.Context, s store.SectionStatus) (bool, error)
}

// SpecSource builds an agent's desired state.
type SpecSource interface {
	Spec(ctx context.Context, node store.Node) (*protocol.Spec, error)
}

// EventHandler makes the control plane's records of what an agent reports.
// It returns the event as it may be stored (a secret in it replaced); an
// error leaves the event unacknowledged, for the agent to replay.
type EventHandler interface {
	Event(ctx context.Context, node store.Node, ev protocol.Event) (protocol.Event, error)
	// Events is Event for a batch of events that arrived together, in order.
	Events(ctx context.Context, node store.Node, evs []protocol.Event) ([]protocol.Event, error)
}

// Observer is told what changed in a session once the store has it: the
// lifecycle controller steps the machine concerned at once instead of at its
// next tick. Calls must not block.
type Observer interface {
	// StatusApplied: a status of the command was stored.
	StatusApplied(nodeID, commandID string)
	// SessionChanged: the node's session opened (its Welcome is out and the
	// node is ready) or closed.
	SessionChanged(nodeID string)
}

// SectionObserver is told about a node's report on a section of its spec
// once the store has it: the rollout controller. Calls must not block.
type SectionObserver interface {
	SectionChanged(nodeID, section string)
}

// Server is the gateway. Set the fields, then serve Handler() on a TLS
// listener whose config requests client certificates
// (tls.RequestClientCert or tls.VerifyClientCertIfGiven).
type Server struct {
	// Joiner answers POST /v1/join.
	Joiner Joiner
	// Renewer answers POST /v1/renew; nil answers UNSUPPORTED.
	Renewer Renewer
	// Store holds nodes, sessions, commands and events.
	Store Store
	// Specs builds the spec of the Welcome and of later spec frames; nil
	// sends every node an empty spec of its own revision.
	Specs SpecSource
	// Events is told about every event before it is stored; nil stores
	// events as they come.
	Events EventHandler
	// NodeCAs verifies client certificates: the node CA.
	NodeCAs *x509.CertPool
	// TrustDomain is the SPIFFE trust domain node certificates must name.
	TrustDomain string
	// PingInterval is how often a session is pinged; 0 means
	// DefaultPingInterval.
	PingInterval time.Duration
	// MissedPings is how many unanswered pings in a row end a session; 0
	// means DefaultMissedPings.
	MissedPings int
	// HelloTimeout is how long an agent has for its Hello; 0 means
	// DefaultHelloTimeout.
	HelloTimeout time.Duration
	// WriteTimeout bounds one frame's write; a client that reads slower is
	// dropped. 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// ResendDelay holds back, on a new session, the commands an earlier
	// session already sent, so the agent's journal replay (which may finish
	// them) is stored first; 0 means DefaultResendDelay.
	ResendDelay time.Duration
	// Observer, when set, is told about stored statuses and sessions that
	// open or close.
	Observer Observer
	// Sections, when set, is told about stored section statuses.
	Sections SectionObserver
	// MinProtocolVersion is the oldest protocol an agent may speak before
	// its session is upgrade_required (it is sent only daemon.upgrade); 0
	// means protocol.MinVersion.
	MinProtocolVersion int
	// Logger; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu       sync.Mutex
	sessions map[string]*session
	closed   bool
	wg       sync.WaitGroup
	// ingest stores what every session reads, in batches (ingest.go): [0] the
	// site agents' sessions, whose writes have priority, [1] every other one's.
	// Apart, so that a site agent's boot nonces never wait for a round of a
	// thousand ramdisks' statuses to be stored (the ramdisks' joins wait for them).
	ingest ingesters

	// joinRefusals counts every join refused, a malformed request included;
	// refusalLog lets one "join refused" line a second through. Joins need no
	// credential to send, so a line each would let anyone fill the log.
	joinRefusals atomic.Uint64
	refusalLog   lograte.Limiter
}

// JoinRefusals is how many joins this gateway refused since it started, a
// malformed request included: the count behind better_compute_join_refusals_total.
func (s *Server) JoinRefusals() uint64 { return s.joinRefusals.Load() }

// refusedJoin counts a refused join and logs it, at most once a second; the
// line says how many refusals were left out of the log since the one before.
func (s *Server) refusedJoin(r *http.Request, req *protocol.JoinRequest, err error) {
	total := s.joinRefusals.Add(1)
	ok, suppressed := s.refusalLog.Allow()
	if !ok {
		return
	}
	args := []any{"remote", r.RemoteAddr, "suppressed", suppressed, "refused_total", total}
	if e := httpjson.Response(err); e != nil {
		args = append(args, "code", e.Code, "reason", e.Message)
	}
	if req != nil {
		args = append(args, "role", req.Role, "attestor", req.Attestor)
	}
	s.log().Info("join refused", args...)
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// Handler serves /v1/join, /v1/renew and /v1/session.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(protocol.PathJoin, only(http.MethodPost, s.serveJoin))
	mux.HandleFunc(protocol.PathRenew, only(http.MethodPost, s.serveRenew))
	mux.HandleFunc(protocol.PathSession, only(http.MethodGet, s.serveSession))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteJSON(w, http.StatusNotFound, httpjson.Errorf(protocol.CodeNotFound, "no such gateway endpoint"))
	})
	return mux
}

// only answers other methods than method with 405 and a JSON body.
func only(method string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			w.Header().Set("Allow", method)
			httpjson.WriteJSON(w, http.StatusMethodNotAllowed, httpjson.Errorf(protocol.CodeInvalidInput, "%s takes %s", r.URL.Path, method))
			return
		}
		h(w, r)
	}
}

func (s *Server) serveJoin(w http.ResponseWriter, r *http.Request) {
	req, err := join.DecodeRequest(r.Body)
	if err != nil {
		s.refusedJoin(r, nil, err)
		httpjson.WriteError(w, s.log(), err)
		return
	}
	resp, err := s.Joiner.Join(r.Context(), req)
	if err != nil {
		if httpjson.Response(err) != nil {
			s.refusedJoin(r, req, err)
		}
		httpjson.WriteError(w, s.log(), err)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, resp)
}

// serveRenew hands a renewal over mutual TLS to the Renewer: the verified client
// certificate names the node, the body carries the next key's CSR.
func (s *Server) serveRenew(w http.ResponseWriter, r *http.Request) {
	if s.Renewer == nil {
		httpjson.WriteError(w, s.log(), httpjson.Errorf(protocol.CodeUnsupported, "this gateway does not renew certificates"))
		return
	}
	p, err := s.verifyPeer(r, "renewal")
	if err != nil {
		if e := httpjson.Response(err); e != nil {
			s.log().Info("renewal refused", "code", e.Code, "reason", e.Message, "remote", r.RemoteAddr)
		}
		httpjson.WriteError(w, s.log(), err)
		return
	}
	req, err := join.DecodeRenewRequest(r.Body)
	if err != nil {
		httpjson.WriteError(w, s.log(), err)
		return
	}
	resp, err := s.Renewer.Renew(r.Context(), join.Renewal{NodeID: p.nodeID, Role: p.role, Serial: p.leaf.SerialNumber.Text(16), Request: req})
	if err != nil {
		if e := httpjson.Response(err); e != nil {
			s.log().Info("renewal refused", "node", p.nodeID, "code", e.Code, "reason", e.Message, "remote", r.RemoteAddr)
		}
		httpjson.WriteError(w, s.log(), err)
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, resp)
}

// Notify tells the node's session, if it has one here, that it has new
// commands to deliver.
func (s *Server) Notify(nodeID string) {
	s.mu.Lock()
	ss := s.sessions[nodeID]
	s.mu.Unlock()
	if ss != nil {
		ss.kickCommands()
	}
}

// SpecChanged tells the sessions of site agents of site, here, that their
// spec changed: each builds it again and sends it when its revision grew.
func (s *Server) SpecChanged(site string) {
	s.mu.Lock()
	var kick []*session
	for _, ss := range s.sessions {
		if ss.role == protocol.RoleSite && ss.site == site {
			kick = append(kick, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range kick {
		ss.kickSpec()
	}
}

// NodeSpecChanged tells the node's session, if it has one here, that its
// spec changed (its daemon target): it builds it again and sends it when
// its revision grew.
func (s *Server) NodeSpecChanged(nodeID string) {
	s.mu.Lock()
	ss := s.sessions[nodeID]
	s.mu.Unlock()
	if ss != nil {
		ss.kickSpec()
	}
}

// Disconnect ends the node's session (the node was deleted).
func (s *Server) Disconnect(nodeID, reason string) {
	s.mu.Lock()
	ss := s.sessions[nodeID]
	s.mu.Unlock()
	if ss != nil {
		ss.end(closePolicy, reason)
	}
}

// Connected reports whether the node has a session here.
func (s *Server) Connected(nodeID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[nodeID] != nil
}

// SessionCount is the number of open sessions.
func (s *Server) SessionCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Close ends every session (close code 1001, going away) and waits for them
// to finish. http.Server.Shutdown does not: a WebSocket is a hijacked
// connection it no longer tracks. New sessions are refused afterwards.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		ss.end(closeGoingAway, "the gateway is shutting down")
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// register makes ss the node's session and returns the one it replaces. Of
// two sessions of one node that race, the one the store numbered later
// wins, here as in nodes.session_id; ok is false for the loser.
func (s *Server) register(ss *session) (old *session, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		ss.end(closeGoingAway, "the gateway is shutting down")
		return nil, false
	}
	if s.sessions == nil {
		s.sessions = make(map[string]*session)
	}
	old = s.sessions[ss.nodeID]
	if old != nil && old.id > ss.id {
		return nil, false
	}
	s.sessions[ss.nodeID] = ss
	return old, true
}

func (s *Server) unregister(ss *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[ss.nodeID] == ss {
		delete(s.sessions, ss.nodeID)
	}
}

// SessionsByRole counts the open sessions here by the role of their node
// (protocol.RoleSite, RoleRamdisk, RoleNode): the metrics endpoint reads it
// at each scrape.
func (s *Server) SessionsByRole() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, 3)
	for _, ss := range s.sessions {
		out[ss.role]++
	}
	return out
}
