package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/agent/journal"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/agent/selfupdate"
	"github.com/better-compute/bcd/bmc"
	"github.com/better-compute/bcd/boot"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/protocol"
)

// Site is bcd site. Config is required; every other field has a default.
type Site struct {
	// Config is the loaded config.toml.
	Config *config.Config
	// ConfigPath is where Config was read from, for the self-update rollback
	// unit; empty is config.DefaultPath.
	ConfigPath string
	// UpdateOptions, if set, changes the self-update options before the
	// Manager is made (tests: no systemd units, short deadlines).
	UpdateOptions func(*selfupdate.Options)
	// Keys loads and makes the node key; nil is agent.PKCS8Keys.
	Keys agent.KeyStore
	// RenewHook, if set, is the certificate Renewer's Hook (tests).
	RenewHook func(step string)
	// Logger receives the agent's log; nil discards it.
	Logger *slog.Logger
	// BootID reads the current boot id; nil is agent.BootID.
	BootID func() (string, error)
	// Claims gathers the hardware claims for Hello; nil is agent.ClaimsSource{}.
	Claims func(context.Context) protocol.Claims
	// Backoff, PingInterval and PingTimeout tune the session (zero: defaults).
	Backoff                   agent.Backoff
	PingInterval, PingTimeout time.Duration
	// Now is the clock of events and nonces; nil is time.Now.
	Now func() time.Time
	// EventInterval is the least time between two machine.booted events for one
	// MAC and stage; 0 is DefaultEventInterval.
	EventInterval time.Duration
	// BMCDrivers runs bmc.* commands by bmc_hosts driver name, instead of the
	// plugins of [plugins] (tests give hand-written drivers). nil means the
	// plugin host's: bcx-ipmi for driver ipmi, started on the first command.
	BMCDrivers map[string]bmc.Driver
	// PluginRuntimeDir holds the plugins' sockets; empty means
	// pluginhost.DefaultRuntimeDir.
	PluginRuntimeDir string
	// BMCObserver, if set, hears of every bmc.* command a driver ran: its
	// operation (a BMCOp* value), how long it took and, when it failed, the
	// protocol reason of its FAILED status ("" when it succeeded). The
	// metrics endpoint's histogram; it must not block.
	BMCObserver func(op, reason string, took time.Duration)

	// DHCPAddr, PXEAddr and DHCPBroadcast replace the proxyDHCP's ports 67 and
	// 4011 and its broadcast destination (boot.ProxyDHCP's Addr, PXEAddr and
	// BroadcastAddr), for tests on loopback. With DHCPBroadcast set, no interface
	// is needed.
	DHCPAddr, PXEAddr string
	DHCPBroadcast     netip.AddrPort

	log      *slog.Logger
	id       *agent.Identity
	dataDir  string
	session  *agent.Session
	renewer  *agent.Renewer
	events   *reporter
	table    boot.MemTable
	bmcHosts *bmc.Store
	bmcExec  *bmcExecutor
	boot     *bootServers
	proxy    proxyRunner
	updater  *daemonupdate.Updater

	// applyMu orders applying specs: the saved one at start, then the gateway's.
	applyMu sync.Mutex
	specCounters

	addrMu sync.Mutex
	addrs  Addrs

	// running holds the reporter and boot servers of the current Run, for the
	// Stats methods, which metrics call from other goroutines.
	running atomic.Pointer[runningServers]
}

// Addrs are where the site's servers listen; a zero value is a server not running.
type Addrs struct {
	HTTP, TFTP, DHCP, PXE, Proxy netip.AddrPort
}

// Addrs returns where the servers listen now.
func (s *Site) Addrs() Addrs {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addrs
}

func (s *Site) setAddrs(f func(*Addrs)) {
	s.addrMu.Lock()
	f(&s.addrs)
	s.addrMu.Unlock()
}

// DataDir is config.toml's data_dir or its default.
func DataDir(c *config.Config) string {
	if c.DataDir != "" {
		return c.DataDir
	}
	return config.DefaultDataDir
}

// invalid is a configuration error the cobra command turns into exit 2.
func invalid(format string, args ...any) error {
	return &config.Error{Msg: fmt.Sprintf(format, args...)}
}

// CheckConfig applies the rules bcd site adds to config.toml's own: the keys the
// boot server and the ramdisk command line need. Its errors satisfy
// config.IsInvalid.
func CheckConfig(c *config.Config) error {
	if c.GatewayURL == "" || c.ServingCASPKIPin == "" {
		return invalid("bcd site needs gateway_url and serving_ca_spki_pin")
	}
	b := c.Boot
	if b == nil {
		return nil
	}
	if b.URL == "" {
		return invalid("[boot] needs url: the base URL machines fetch their iPXE scripts from")
	}
	if b.TFTP != "" && b.TFTPRoot == "" {
		return invalid("[boot] tftp needs tftp_root, the directory holding the iPXE binaries")
	}
	if c.JoinSigningKeyPin == "" || c.JoinEncryptionKeyPin == "" {
		return invalid("[boot] needs join_signing_key_pin and join_encryption_key_pin: the ramdisk's command line carries them")
	}
	return nil
}

// Run runs the site agent until ctx is done, then returns nil. After a
// self-update swap (or a swap back) it closes everything, the boot servers'
// sockets and the plugins included, and returns daemonupdate.ErrExec: the
// caller then calls ExecUpdate.
func (s *Site) Run(ctx context.Context) error {
	c := s.Config
	if c == nil {
		return errors.New("bcd site: no configuration")
	}
	if err := CheckConfig(c); err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.dataDir = DataDir(c)
	if s.Keys == nil {
		s.Keys = &nodekey.Host{Logger: s.log}
	}
	id, err := agent.LoadIdentity(s.dataDir, s.Keys)
	switch {
	case errors.Is(err, agent.ErrNotJoined):
		return fmt.Errorf("bcd site: this machine has not joined (no %s in %s): run bcd join --role site first", agent.IdentityFile, s.dataDir)
	case err != nil:
		return fmt.Errorf("bcd site: the identity does not load: %w; to join again: bcd join --reset --yes, then bcd join --role site", err)
	case id.Role != protocol.RoleSite:
		return fmt.Errorf("bcd site: %s holds the identity of %s %s; bcd site runs only a site identity (bcd %s runs this one)", s.dataDir, id.Role, id.NodeID, id.Role)
	}
	s.id = id
	serverName, err := agent.ServerName(c.GatewayURL, c.GatewayServerName)
	if err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}
	readBootID := s.BootID
	if readBootID == nil {
		readBootID = agent.BootID
	}
	bootID, err := readBootID()
	if err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}

	j, err := journal.Open(c.JournalOrDefault().Path, id.NodeID, journal.Options{
		MaxEntries: int(c.JournalOrDefault().MaxEntries),
		Logger:     s.log,
	})
	if err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}
	defer j.Close()

	if s.bmcHosts, err = bmc.OpenStore(s.dataDir); err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}
	closeBMC := s.setupBMC()
	defer closeBMC()

	claimsFn := s.Claims
	if claimsFn == nil {
		claimsFn = agent.ClaimsSource{}.Collect
	}
	claims := claimsFn(ctx)
	cfgPath := s.ConfigPath
	if cfgPath == "" {
		cfgPath = config.DefaultPath
	}
	s.updater = daemonupdate.ForConfig(c, cfgPath, s.log, s.UpdateOptions)
	s.renewer = &agent.Renewer{
		DataDir: s.dataDir, Keys: s.Keys, Identity: id,
		GatewayURL: c.GatewayURL, ServerName: serverName, ServingCAPin: c.ServingCASPKIPin, JoinSigningPin: c.JoinSigningKeyPin,
		Logger: s.log, Hook: s.RenewHook,
	}
	s.session = &agent.Session{
		GatewayURL:   c.GatewayURL,
		ServerName:   serverName,
		ServingCAPin: c.ServingCASPKIPin,
		Identity:     id,
		Current:      s.renewer.Current,
		Journal:      j,
		Handlers: map[string]agent.Handler{
			protocol.KindBMCPower:      s.runBMC,
			protocol.KindBMCBootdev:    s.runBMC,
			protocol.KindBMCInventory:  s.runBMC,
			protocol.KindDaemonUpgrade: s.updater.Upgrade,
		},
		OnWelcome: s.updater.OnWelcome,
		OnSpec: func(ctx context.Context, spec protocol.Spec) {
			s.applySpec(spec, true)
			s.updater.OnSpec(ctx, spec)
		},
		Claims:       &claims,
		BootID:       bootID,
		Backoff:      s.Backoff,
		PingInterval: s.PingInterval,
		PingTimeout:  s.PingTimeout,
		Logger:       s.log,
	}
	s.events = newReporter(s.session, s.log, s.Now, s.EventInterval)
	s.running.Store(&runningServers{events: s.events})
	s.proxy = proxyRunner{site: s}

	// The servers' context ends before the journal closes: nothing may journal
	// after that. Everything started from here on is in wg.
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	wg.Go(func() { s.proxy.wait(sctx) })
	wg.Go(func() { s.events.run(sctx) })
	wg.Go(func() { s.renewer.Run(sctx) })

	sock, err := listenStatus(s.socketPath())
	if err != nil {
		return fmt.Errorf("bcd site: %w", err)
	}
	status := s.statusServer()
	errc := make(chan error, 5)
	wg.Go(func() {
		if err := status.Serve(sock); !errors.Is(err, http.ErrServerClosed) && sctx.Err() == nil {
			errc <- fmt.Errorf("status socket: %w", err)
		}
	})
	wg.Go(func() {
		<-sctx.Done()
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = status.Shutdown(cctx)
	})

	if c.Boot == nil {
		s.log.Warn("no [boot] section: serving no PXE machine")
	} else {
		if s.boot, err = s.openBoot(); err != nil {
			return fmt.Errorf("bcd site: %w", err)
		}
	}
	// The saved table is in place before the first machine is answered.
	saved, err := LoadSpec(s.dataDir)
	switch {
	case err != nil:
		s.log.Warn("ignoring the saved spec; waiting for the gateway's", "error", err.Error())
	case saved != nil:
		s.log.Info("applying the saved spec until the gateway sends one", "revision", saved.Revision)
		s.applySpec(*saved, false)
	}
	if s.boot != nil {
		s.running.Store(&runningServers{events: s.events, dhcp: s.boot.dhcp, tftp: s.boot.tftp, boot: s.boot})
		s.boot.serve(sctx, &wg, errc)
	}
	s.log.Info("bcd site started", "node_id", id.NodeID, "site", s.siteName(), "gateway", c.GatewayURL, "boot", c.Boot != nil, "socket", s.socketPath(), "boot_id", bootID)

	s.updater.Start(sctx, s.session)
	sessErr := make(chan error, 1)
	go func() { sessErr <- s.session.Run(sctx) }()
	select {
	case <-s.updater.ExecRequested():
		// Everything closes before the exec: the new binary binds the same
		// DHCP, TFTP and HTTP ports and opens the same journal.
		stop()
		<-sessErr
		s.updater.Wait()
		s.log.Warn("bcd site stopping to exec the swapped binary")
		return daemonupdate.ErrExec
	case err := <-sessErr:
		s.updater.Wait()
		if ctx.Err() != nil {
			s.log.Info("bcd site stopped")
			return nil
		}
		return fmt.Errorf("bcd site: %w", err)
	case err := <-errc:
		stop()
		<-sessErr
		s.updater.Wait()
		return fmt.Errorf("bcd site: %w", err)
	}
}

// ExecUpdate replaces the process with the entrypoint after Run returned
// daemonupdate.ErrExec.
func (s *Site) ExecUpdate() error { return s.updater.Exec() }

// socketPath is socket_path or its default.
func (s *Site) socketPath() string {
	if s.Config.SocketPath != "" {
		return s.Config.SocketPath
	}
	return config.DefaultSocketPath
}

// siteName is config.toml's site, else the one the join answered.
func (s *Site) siteName() string {
	if s.Config.Site != "" {
		return s.Config.Site
	}
	return s.id.Site
}

func (s *Site) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// applySpec makes spec the site's desired state: the boot table, the HTTP proxy
// and, from the gateway only, the BMC hosts. A section that does not decode keeps
// what the site had. fromGateway also saves the spec for the next start.
func (s *Site) applySpec(spec protocol.Spec, fromGateway bool) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	log := s.log.With("revision", spec.Revision)
	log.Info("desired state received", "sections", len(spec.Sections), "from_gateway", fromGateway)

	if raw, ok := spec.Sections[protocol.SectionBoot]; ok {
		t, err := parseBootSection(raw)
		if err != nil {
			log.Error("keeping the current boot table: the boot section does not decode", "error", err.Error())
		} else {
			for _, why := range t.skipped {
				log.Warn("boot entry left out", "reason", why)
			}
			_ = s.table.Set(t.entries) // keys and modes are checked by parseBootSection
			s.entries.Store(int64(len(t.entries)))
			log.Info("boot table applied", "entries", len(t.entries))
		}
	} else {
		_ = s.table.Set(nil)
		s.entries.Store(0)
	}
	s.revision.Store(spec.Revision)

	if raw, ok := spec.Sections[protocol.SectionHTTPProxy]; ok {
		sec, err := parseProxySection(raw)
		if err != nil {
			log.Error("keeping the current HTTP proxy: the http_proxy section does not decode", "error", err.Error())
		} else {
			s.proxy.apply(sec)
		}
	} else {
		s.proxy.apply(nil)
	}
	if s.boot != nil {
		s.boot.setProxy(s.proxy.url())
	}

	if fromGateway {
		raw := spec.Sections[protocol.SectionBMCHosts]
		var sec protocol.BMCHostsSection
		var err error
		if raw != nil {
			sec, err = bmc.ParseHostsSection(raw)
		}
		if err == nil {
			err = s.bmcHosts.Apply(sec)
		}
		if err != nil {
			log.Error("keeping the current BMC hosts", "error", err.Error())
		} else if raw != nil {
			log.Info("BMC hosts applied", "hosts", len(sec.Hosts), "file", s.bmcHosts.Path())
		}
		if err := saveSpec(s.dataDir, spec, s.now()); err != nil {
			log.Error("cannot save the spec for the next start", "error", err.Error())
		}
	}
}

// hostPortOf is the host:port a URL connects to.
func hostPortOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Hostname() == "" {
		return "", fmt.Errorf("%q is not a URL with a host", raw)
	}
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
