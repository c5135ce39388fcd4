package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/nodeagent/helper"
	"github.com/better-compute/bcd/protocol"
)

// ResetHint ends every message that sends an operator to bcd join --reset.
const ResetHint = "bcd join --reset --yes, then bcd join"

// Node is bcd node. Config is required; every other field has a default.
type Node struct {
	// Config is the loaded config.toml.
	Config *config.Config
	// ConfigPath is where Config was read from, for the self-update rollback
	// unit; empty is config.DefaultPath.
	ConfigPath string
	// UpdateOptions, if set, changes the self-update options before the
	// Manager is made (tests: no systemd units, short deadlines).
	UpdateOptions func(*selfupdate.Options)
	// Logger receives the agent's log; nil discards it.
	Logger *slog.Logger
	// Rebooter restarts the machine for node.reboot; nil is SystemRebooter,
	// or bcd helper's reboot under [helper].
	Rebooter Rebooter
	// BootID reads the current boot id; nil is agent.BootID.
	BootID func() (string, error)
	// Claims gathers the hardware claims for Hello; nil is agent.ClaimsSource{}.
	Claims func(context.Context) protocol.Claims
	// Backoff, PingInterval and PingTimeout tune the session (zero: defaults).
	Backoff                   agent.Backoff
	PingInterval, PingTimeout time.Duration
	// Listening, if set, is called with the status socket's path once it serves.
	Listening func(path string)
	// Keys loads and makes the node key; nil is the host's (nodekey.Host), or
	// bcd helper's tpm.* operations under [helper].
	Keys agent.KeyStore
	// RenewHook, if set, is the certificate Renewer's Hook (tests).
	RenewHook func(step string)
	// RenewBackoff spaces retries of a failed renewal (zero: the default).
	RenewBackoff agent.Backoff

	log      *slog.Logger
	rebooter Rebooter
	id       *agent.Identity
	journal  *journal.Journal
	session  *agent.Session
	renewer  *agent.Renewer
	bootID   string
	updater  *daemonupdate.Updater
	// pending is a node.reboot an earlier process started; finishReboot settles
	// it on the first Welcome.
	pending *pendingReboot
}

// DataDir is config.toml's data_dir or its default.
func DataDir(c *config.Config) string {
	if c.DataDir != "" {
		return c.DataDir
	}
	return config.DefaultDataDir
}

// JournalPath is [journal] path or data_dir/journal.db.
func JournalPath(c *config.Config) string {
	if c.Journal != nil && c.Journal.Path != "" {
		return c.Journal.Path
	}
	return filepath.Join(DataDir(c), journal.FileName)
}

// SocketPath is socket_path or its default.
func SocketPath(c *config.Config) string {
	if c.SocketPath != "" {
		return c.SocketPath
	}
	return config.DefaultSocketPath
}

// Run runs the node agent until ctx is done, then returns nil. After a
// self-update swap (or a swap back) it closes everything and returns
// daemonupdate.ErrExec: the caller then calls ExecUpdate.
func (n *Node) Run(ctx context.Context) error {
	c := n.Config
	if c == nil {
		return errors.New("bcd node: no configuration")
	}
	n.log = n.Logger
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if c.GatewayURL == "" || c.ServingCASPKIPin == "" {
		return errors.New("bcd node: config.toml needs gateway_url and serving_ca_spki_pin")
	}
	// The mode follows the config, not the uid: with [helper] even a root
	// bcd node leaves the TPM, the reboot and the slots to bcd helper, so
	// that it behaves as it will under the bcd user.
	var hc *helper.Client
	if c.Helper != nil {
		hc = helper.NewClient(c.Helper)
		n.log.Info("bcd node runs unprivileged beside bcd helper", "helper_socket", hc.Socket, "uid", os.Geteuid())
	}
	n.rebooter = n.Rebooter
	switch {
	case n.rebooter != nil:
	case hc != nil:
		n.rebooter = helperRebooter(hc)
	default:
		n.rebooter = SystemRebooter
	}
	dataDir := DataDir(c)
	switch {
	case n.Keys != nil:
	case hc != nil:
		// The node never opens /dev/tpmrm0 (spec, 8870b8d): the key in
		// the TPM signs through the helper.
		n.Keys = helper.KeyStoreWithLogger(hc, n.log)
	default:
		// The host's: the node key in its TPM where node.key says so, and
		// the renewal's next key made the same way.
		n.Keys = &nodekey.Host{Logger: n.Logger}
	}
	id, err := agent.LoadIdentity(dataDir, n.Keys)
	switch {
	case errors.Is(err, agent.ErrNotJoined):
		return fmt.Errorf("bcd node: this machine has not joined (no %s in %s): run bcd join first", agent.IdentityFile, dataDir)
	case err != nil && hc != nil && helper.IsHelperError(err):
		// bcd helper answered for the key, not the identity's files: a
		// join again would not help, so the hint says what would.
		return fmt.Errorf("bcd node: the identity does not load: %w; the node key is used through bcd helper at %s: check that bcd-helper.service runs and that this is the installed bcd (%s) run as [helper] user %s",
			err, hc.Socket, helper.Entrypoint(c), helper.UserName(c))
	case err != nil:
		return fmt.Errorf("bcd node: the identity does not load: %w; to join again: %s", err, ResetHint)
	case id.Role != protocol.RoleNode:
		return fmt.Errorf("bcd node: %s holds the identity of %s %s; bcd node runs only a node identity (bcd %s runs this one)", dataDir, id.Role, id.NodeID, id.Role)
	}
	n.id = id
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return fmt.Errorf("bcd node: %w", err)
	}
	readBootID := n.BootID
	if readBootID == nil {
		readBootID = agent.BootID
	}
	if n.bootID, err = readBootID(); err != nil {
		return fmt.Errorf("bcd node: %w", err)
	}

	j, err := journal.Open(JournalPath(c), id.NodeID, journal.Options{
		MaxEntries: int(c.JournalOrDefault().MaxEntries),
		Logger:     n.log,
	})
	if err != nil {
		return fmt.Errorf("bcd node: %w", err)
	}
	defer j.Close()
	n.journal = j
	if raw, err := j.State(stateReboot); err != nil {
		return fmt.Errorf("bcd node: %w", err)
	} else if raw != nil {
		var p pendingReboot
		if err := json.Unmarshal(raw, &p); err != nil {
			n.log.Error("ignoring an unreadable pending reboot record", "error", err.Error())
			_ = j.DeleteState(stateReboot)
		} else {
			n.pending = &p
		}
	}

	n.renewer = &agent.Renewer{
		DataDir: dataDir, Keys: n.Keys, Identity: id,
		GatewayURL: c.GatewayURL, ServerName: serverName, ServingCAPin: c.ServingCASPKIPin, JoinSigningPin: c.JoinSigningKeyPin,
		Backoff: n.RenewBackoff, Logger: n.log, Hook: n.RenewHook,
	}
	cfgPath := n.ConfigPath
	if cfgPath == "" {
		cfgPath = config.DefaultPath
	}
	if hc != nil {
		n.updater = helper.NewUpdater(c, cfgPath, hc, n.log, n.UpdateOptions)
	} else {
		n.updater = daemonupdate.ForConfig(c, cfgPath, n.log, n.UpdateOptions)
	}
	claimsFn := n.Claims
	if claimsFn == nil {
		claimsFn = agent.ClaimsSource{}.Collect
	}
	claims := claimsFn(ctx)
	n.session = &agent.Session{
		GatewayURL:   c.GatewayURL,
		ServerName:   serverName,
		ServingCAPin: c.ServingCASPKIPin,
		Identity:     id,
		Current:      n.renewer.Current,
		Journal:      j,
		Handlers: map[string]agent.Handler{
			protocol.KindNodeReboot:    n.runReboot,
			protocol.KindDaemonUpgrade: n.updater.Upgrade,
		},
		OnWelcome: func(ctx context.Context, w protocol.Welcome, first bool) {
			n.updater.OnWelcome(ctx, w, first)
			if first {
				n.finishReboot()
			}
		},
		OnSpec: func(ctx context.Context, s protocol.Spec) {
			// The daemon section is the only one bcd node applies; the
			// revision is logged so an operator can see the spec arrive.
			n.log.Info("desired state received", "revision", s.Revision, "sections", len(s.Sections))
			n.updater.OnSpec(ctx, s)
		},
		Claims:       &claims,
		BootID:       n.bootID,
		Backoff:      n.Backoff,
		PingInterval: n.PingInterval,
		PingTimeout:  n.PingTimeout,
		Logger:       n.log,
	}

	sock, err := listenStatus(SocketPath(c), c.Helper != nil)
	if err != nil {
		return fmt.Errorf("bcd node: %w", err)
	}
	srv := newStatusServer(n)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(sock) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if n.Listening != nil {
		n.Listening(SocketPath(c))
	}
	n.log.Info("bcd node started", "node_id", id.NodeID, "gateway", c.GatewayURL, "socket", SocketPath(c), "boot_id", n.bootID)

	sctx, stopSession := context.WithCancel(ctx)
	defer stopSession()
	n.updater.Start(sctx, n.session)
	// The updater reports through the session: it ends before the journal closes.
	defer n.updater.Wait()
	sessErr := make(chan error, 1)
	go func() { sessErr <- n.session.Run(sctx) }()
	renewDone := make(chan struct{})
	go func() { n.renewer.Run(sctx); close(renewDone) }()
	defer func() { stopSession(); <-renewDone }()
	select {
	case <-n.updater.ExecRequested():
		// Everything closes before the exec: the session here, then the
		// deferred status socket and journal (bbolt holds a file lock).
		stopSession()
		<-sessErr
		n.log.Warn("bcd node stopping to exec the swapped binary")
		return daemonupdate.ErrExec
	case err := <-sessErr:
		if ctx.Err() != nil {
			n.log.Info("bcd node stopped")
			return nil
		}
		return fmt.Errorf("bcd node: %w", err)
	case err := <-serveErr:
		// The session still uses the journal: end it before the journal closes.
		stopSession()
		<-sessErr
		return fmt.Errorf("bcd node: status socket: %w", err)
	}
}

// ExecUpdate replaces the process with the entrypoint after Run returned
// daemonupdate.ErrExec.
func (n *Node) ExecUpdate() error { return n.updater.Exec() }

// Status is what the status socket answers.
type Status = agent.SessionStatus
