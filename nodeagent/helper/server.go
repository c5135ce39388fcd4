package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
)

// ErrReExec is what Run returns after a confirmed update once it has closed
// the socket: the caller execs Entrypoint (ReExec), so that the helper runs
// the node's release and not the binary it started from.
var ErrReExec = errors.New("bcd helper: the node's update confirmed: exec the entrypoint")

// socketMode is the socket's mode: root and the node user's group connect.
const socketMode = 0o660

// Server is bcd helper: the root half of an unprivileged bcd node. Make it
// with NewServer after StartupProblems found nothing, then Run it.
type Server struct {
	Config *config.Config
	// ConfigPath is the absolute config.toml (the rollback unit names it).
	ConfigPath string
	Logger     *slog.Logger
	// Socket is [helper] socket.
	Socket string
	// NodeUID and NodeGID are [helper] user's: the callers served besides root.
	NodeUID, NodeGID int
	// Update is the self-update Manager for the helper's own [update].
	Update *selfupdate.Manager
	// Keys holds the TPM node keys (RequireTPM).
	Keys *nodekey.Host
	// RebootReady says, before the answer, whether the machine can reboot
	// (a fakehw build without its marker file cannot); nil: it can.
	RebootReady func() error
	// Reboot reboots the machine, after the answer is written.
	Reboot func() error
	// RebootAfter is how long after the answer the reboot happens, so that
	// the node reads the answer first.
	RebootAfter time.Duration
	// RestartNode restarts bcd.service after the watchdog swapped back.
	RestartNode func(ctx context.Context) error
	// Grace is how long after an update's deadline the watchdog swaps back.
	Grace time.Duration
	// SelfExe is the helper's own binary (/proc/self/exe at NewServer), which
	// callers may run too.
	SelfExe string

	self     fs.FileInfo // SelfExe's stat at NewServer
	mu       sync.Mutex
	keys     map[[32]byte]keyEntry // loaded TPM node keys by their record's digest
	watchdog *time.Timer
	wdFor    string // the pending update's version@deadline the timer is for
	reexec   chan struct{}
	reOnce   sync.Once
	sockInfo fs.FileInfo // the socket this server placed, to remove only that one
	// onFired, for tests, hears each watchdog firing and whether it swapped back.
	onFired func(swappedBack bool)
}

// NewServer makes the helper for c (already checked by StartupProblems):
// it looks up [helper] user and makes the self-update Manager.
func NewServer(c *config.Config, configPath string, log *slog.Logger) (*Server, error) {
	if c.Helper == nil {
		return nil, fmt.Errorf("%s has no [helper] section; bcd helper runs only beside a bcd node configured for it", configPath)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	abs, err := filepath.Abs(configPath)
	if err != nil {
		return nil, err
	}
	name := UserName(c)
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("[helper] user %q: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("[helper] user %q has uid %q gid %q, not numbers", name, u.Uid, u.Gid)
	}
	if uid == 0 {
		return nil, fmt.Errorf("[helper] user %q is root: bcd node must run as an unprivileged account", name)
	}
	o := selfupdate.OptionsFor(c, abs)
	// The records are root's, in the slots directory (OptionsFor does so for
	// a config with [helper]); set it here too so it never depends on that.
	o.RecordsDir = c.SlotsDir()
	o.CheckStagedOwner, o.StagedOwner = true, uid
	o.Deadline = agent.TestDuration(agent.EnvTestUpdateDeadline, 0)
	o.Logger = log
	m, err := selfupdate.New(o)
	if err != nil {
		return nil, err
	}
	self, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("the helper's own binary: %w", err)
	}
	s := &Server{
		Config: c, ConfigPath: abs, Logger: log, Socket: SocketPath(c),
		NodeUID: uid, NodeGID: gid, Update: m,
		Keys:        &nodekey.Host{RequireTPM: true, Logger: log},
		Reboot:      systemReboot,
		RebootAfter: 500 * time.Millisecond,
		RestartNode: restartNodeService,
		Grace:       agent.TestDuration(EnvTestGrace, WatchdogGrace),
		SelfExe:     self,
	}
	return s, nil
}

// init fills what Run needs and a test's Server may leave out.
func (s *Server) init() error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Grace == 0 {
		s.Grace = WatchdogGrace
	}
	if s.keys == nil {
		s.keys = map[[32]byte]keyEntry{}
	}
	s.reexec = make(chan struct{})
	if s.SelfExe == "" {
		self, err := os.Readlink("/proc/self/exe")
		if err != nil {
			return fmt.Errorf("the helper's own binary: %w", err)
		}
		s.SelfExe = self
	}
	fi, err := os.Stat(s.SelfExe)
	if err != nil {
		return fmt.Errorf("the helper's own binary: %w", err)
	}
	s.self = fi
	return nil
}

// Listen places the socket at s.Socket: it binds, chmods and chowns it in a
// private 0700 directory beside that path, so the node can never connect to
// (or race) a socket whose mode and owner are not final yet, then renames it
// into place. A stale socket is replaced; a live helper's or anything that is
// not a socket is refused.
func (s *Server) Listen() (*net.UnixListener, error) {
	dir := filepath.Dir(s.Socket)
	if fi, err := os.Lstat(s.Socket); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket (%s); refusing to replace it", s.Socket, fi.Mode().Type())
		}
		if c, err := net.DialTimeout("unix", s.Socket, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("another bcd helper serves %s (is bcd-helper.service already running?)", s.Socket)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("the socket %s: %w", s.Socket, err)
	}
	private, err := os.MkdirTemp(dir, ".helper-")
	if err != nil {
		return nil, fmt.Errorf("the socket's private directory in %s: %w", dir, err)
	}
	defer os.RemoveAll(private)
	if err := os.Chmod(private, 0o700); err != nil {
		return nil, fmt.Errorf("the socket's private directory: %w", err)
	}
	tmp := filepath.Join(private, filepath.Base(s.Socket))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("bind the socket %s: %w", tmp, err)
	}
	// The name moves; Close must not unlink whatever then has the old one.
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		ln.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, socketMode); err != nil {
		return fail(fmt.Errorf("chmod the socket %s: %w", tmp, err))
	}
	if err := os.Lchown(tmp, 0, s.NodeGID); err != nil {
		return fail(fmt.Errorf("chown the socket %s to root:%d: %w", tmp, s.NodeGID, err))
	}
	if err := os.Rename(tmp, s.Socket); err != nil {
		return fail(fmt.Errorf("rename the socket into place at %s: %w", s.Socket, err))
	}
	fi, err := os.Lstat(s.Socket)
	if err != nil {
		return fail(fmt.Errorf("the socket %s: %w", s.Socket, err))
	}
	s.sockInfo = fi
	return ln, nil
}

// removeSocket removes the socket if it is still the one Listen placed (a
// restarted helper may have put its own there).
func (s *Server) removeSocket() {
	if s.sockInfo == nil {
		return
	}
	if fi, err := os.Lstat(s.Socket); err == nil && os.SameFile(fi, s.sockInfo) {
		if err := os.Remove(s.Socket); err != nil {
			s.Logger.Error("could not remove the socket", "path", s.Socket, "err", err.Error())
		}
	}
}

// Run places the socket, arms the watchdog for a pending update and serves
// until ctx ends (nil) or a confirmed update wants the helper re-executed
// (ErrReExec). The socket is removed either way.
func (s *Server) Run(ctx context.Context) error {
	if err := s.init(); err != nil {
		return err
	}
	ln, err := s.Listen()
	if err != nil {
		return err
	}
	defer s.removeSocket()
	s.Logger.Info("bcd helper serves", "socket", s.Socket, "node_uid", s.NodeUID, "node_gid", s.NodeGID)
	s.armWatchdog()
	defer s.stopWatchdog()
	srv := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       time.Minute,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ErrorLog: slog.NewLogLogger(s.Logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var result error
	select {
	case <-ctx.Done():
	case <-s.reexec:
		result = ErrReExec
	case err := <-served:
		return fmt.Errorf("bcd helper: serving %s: %w", s.Socket, err)
	}
	// Shutdown closes the listener and waits for the requests in flight: the
	// confirm's answer is written before a re-exec.
	shut, cancel := context.WithTimeout(context.Background(), SwapTimeout)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil {
		s.Logger.Warn("bcd helper: requests still in flight at shutdown", "err", err.Error())
		srv.Close()
	}
	s.Logger.Info("bcd helper stopped serving", "socket", s.Socket)
	return result
}

// ReExec replaces this process with the entrypoint, which links to the
// node's confirmed release, with the same arguments.
func (s *Server) ReExec() error {
	return s.Update.Exec()
}

type connKey struct{}

// ServeHTTP checks the caller and dispatches POST /v1/<op>.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	if err := s.checkPeer(c); err != nil {
		writeError(w, http.StatusForbidden, &Error{Code: CodePeerRefused, Message: err.Error()})
		return
	}
	op, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
	h, known := s.handlers()[op]
	if !ok || !known {
		writeError(w, http.StatusNotFound, &Error{Code: CodeUnknownOp, Message: fmt.Sprintf("no operation %q (bcd helper serves POST %s<op> for %s)", r.URL.Path, PathPrefix, strings.Join(Ops, ", "))})
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, http.StatusMethodNotAllowed, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf("%s %s: only POST", r.Method, r.URL.Path)})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, MaxRequest)
	h(w, r)
}

// decode reads r's JSON body into v, strictly: unknown fields and trailing
// data are refused.
func decode(r *http.Request, v any) error {
	d := json.NewDecoder(r.Body)
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return fmt.Errorf("the request is larger than %d bytes", MaxRequest)
		}
		return fmt.Errorf("the request does not decode: %v", err)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the request does not decode: data after the JSON object")
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, e *Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

func invalid(w http.ResponseWriter, format string, args ...any) {
	writeError(w, http.StatusBadRequest, &Error{Code: CodeInvalidRequest, Message: fmt.Sprintf(format, args...)})
}

// fail answers err: a self-update refusal 409 with its code, anything else
// 500 HELPER_FAILED.
func (s *Server) fail(w http.ResponseWriter, op string, err error) {
	if r, ok := selfupdate.IsRefusal(err); ok {
		s.Logger.Warn("bcd helper: refused", "op", op, "code", r.Code, "why", r.Message)
		writeError(w, http.StatusConflict, &Error{Code: r.Code, Message: r.Message, Refusal: true})
		return
	}
	s.Logger.Error("bcd helper: failed", "op", op, "err", err.Error())
	writeError(w, http.StatusInternalServerError, &Error{Code: CodeFailed, Message: op + ": " + err.Error()})
}
