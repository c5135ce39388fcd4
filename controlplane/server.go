package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/controlplane/api"
	"github.com/better-compute/bcd/controlplane/downloads"
	"github.com/better-compute/bcd/controlplane/gateway"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/machines"
	"github.com/better-compute/bcd/controlplane/retention"
	"github.com/better-compute/bcd/controlplane/rollouts"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/controlplane/store/sealed"
	"github.com/better-compute/bcd/controlplane/store/sqlite"
	"github.com/better-compute/bcd/controlplane/token"
	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/internal/metrics/cpmetrics"
	"github.com/better-compute/bcd/pki"
	"github.com/better-compute/bcd/protocol"
)

// Defaults of the Server's zero fields.
const (
	DefaultAPIListen     = "127.0.0.1:8443"
	DefaultGatewayListen = "127.0.0.1:8444"
)

// Environment variables that provide the well-known gateway section when the
// flags do not.
const (
	EnvGatewayURL        = "BETTER_COMPUTE_GATEWAY_URL"
	EnvGatewayServerName = "BETTER_COMPUTE_GATEWAY_SERVER_NAME"
)

// MinCertLifetime is the shortest node certificate lifetime serve takes: a node
// renews at two thirds of it, so less leaves no room for a retry.
const MinCertLifetime = time.Minute

// servingCertTTL is the lifetime of the serving certificate the server
// issues itself; it is reissued when a third of it is left.
const servingCertTTL = 90 * 24 * time.Hour

// Server is the control plane. Set the fields, then Start (or Run).
type Server struct {
	// PKIDir is the bundle `better-compute pki init` made. Required.
	PKIDir string
	// DataDir holds the store; created 0700, and refused when it exists and
	// group or others may write in it. Required.
	DataDir string
	// APIListen is the api's address; "" means DefaultAPIListen. Port 0
	// picks a free port (APIURL says which).
	APIListen string
	// GatewayListen is the gateway's address; "" means DefaultGatewayListen.
	GatewayListen string
	// GatewayURL is what the well-known document tells agents; "" means
	// $BETTER_COMPUTE_GATEWAY_URL, else https://<the gateway's address>.
	GatewayURL string
	// GatewayServerName is the TLS name agents check, when it is not the
	// URL's host; "" means $BETTER_COMPUTE_GATEWAY_SERVER_NAME.
	GatewayServerName string
	// TLSCertFile and TLSKeyFile replace the self-issued serving
	// certificate; both or neither.
	TLSCertFile, TLSKeyFile string
	// OperatorTokenFile receives the operator token at first start instead
	// of Out.
	OperatorTokenFile string
	// DownloadsDir serves release binaries; "" leaves the route out.
	DownloadsDir string
	// BasePath prefixes the api's routes: "" or like "/p".
	BasePath string
	// Out receives the "… listening on …" lines and, at first start, the
	// operator token. nil means io.Discard.
	Out io.Writer
	// Logger; nil discards.
	Logger *slog.Logger
	// Gateway heartbeats; zero means the gateway's defaults.
	PingInterval time.Duration
	MissedPings  int
	// LifecycleTimeouts bounds the machine lifecycle's steps, in
	// lifecycle.ParseTimeouts' syntax ("ramdisk=10m,deploy=45m"); ""
	// means $BETTER_COMPUTE_LIFECYCLE_TIMEOUTS, else the defaults.
	LifecycleTimeouts string
	// LifecycleTick is how often running deployments are looked at; 0
	// means lifecycle.DefaultTick.
	LifecycleTick time.Duration
	// CertLifetime is the lifetime of the node certificates a join or a
	// renewal issues; 0 means join.DefaultCertTTL. Start refuses one under
	// MinCertLifetime.
	CertLifetime time.Duration
	// ReleasePins are the SPKI pins of the operator's release signing keys
	// (serve --release-pins): `releases add` verifies every manifest under
	// them, and is refused without them. ReleaseThreshold is how many
	// distinct pinned keys must have signed; 0 means 1.
	ReleasePins      []string
	ReleaseThreshold int
	// MinProtocolVersion is the oldest protocol an agent may speak before
	// its session is upgrade_required; 0 means protocol.MinVersion.
	MinProtocolVersion int
	// DeployBCDVersion is the release (better-compute releases add) whose
	// bcd a deploy installs into the root when machines deploy gave no
	// --bcd-version (serve --deploy-bcd-version); "" means none: the image
	// must ship bcd.
	DeployBCDVersion string
	// RolloutTick is how often the rollout controller looks at the active
	// rollouts when nothing woke it; 0 means rollouts.DefaultTick.
	RolloutTick time.Duration
	// MetricsListen, when set (serve --metrics-listen), serves Prometheus
	// metrics on http://MetricsListen/metrics (better_compute_*, go_*,
	// process_*); "" serves none.
	MetricsListen string
	// Retention bounds the agents' events, the machines' timelines and the
	// boot nonces (serve --events-per-kind, --events-max-age,
	// --events-max-total); the zero value means store.DefaultRetention.
	// RetentionInterval is how often the pruner runs; 0 means
	// retention.DefaultInterval.
	Retention         store.Retention
	RetentionInterval time.Duration

	bundle     *pki.Bundle
	store      store.Store
	gw         *gateway.Server
	apiSrv     *http.Server
	gwSrv      *http.Server
	apiL, gwL  net.Listener
	apiURL     string
	gatewayURL string
	serveErr   chan error
	stopOnce   sync.Once
	lc         *lifecycle.Controller
	lcStop     context.CancelFunc
	lcDone     chan struct{}
	rc         *rollouts.Controller
	rcDone     chan struct{}
	prDone     chan struct{}
	metrics    *metrics.Server
}

// observers tells each of several gateway observers.
type observers []gateway.Observer

func (o observers) StatusApplied(nodeID, commandID string) {
	for _, x := range o {
		x.StatusApplied(nodeID, commandID)
	}
}

func (o observers) SessionChanged(nodeID string) {
	for _, x := range o {
		x.SessionChanged(nodeID)
	}
}

func (s *Server) log() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func (s *Server) out() io.Writer {
	if s.Out != nil {
		return s.Out
	}
	return io.Discard
}

// APIURL is where the api listens (with the base path), once started.
func (s *Server) APIURL() string { return s.apiURL }

// GatewayAddrURL is where the gateway listens, once started.
func (s *Server) GatewayAddrURL() string { return "https://" + s.gwL.Addr().String() }

// AdvertisedGatewayURL is the gateway URL of the well-known document.
func (s *Server) AdvertisedGatewayURL() string { return s.gatewayURL }

// Bundle is the loaded PKI bundle, once started.
func (s *Server) Bundle() *pki.Bundle { return s.bundle }

// MetricsURL is where the metrics are served, once started with
// MetricsListen; "" without.
func (s *Server) MetricsURL() string {
	if s.metrics == nil {
		return ""
	}
	return s.metrics.URL()
}

// Store is the open store, once started.
func (s *Server) Store() store.Store { return s.store }

// Run starts the server and serves until ctx is done or a listener fails,
// then shuts down gracefully.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-s.serveErr:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(err, s.Shutdown(sctx))
}

// openStore opens the SQLite store in dataDir with its secrets sealed under
// the keyring in pkiDir (created for a bundle older than it).
// It holds the keyring's lock (exclusive for a rotation, else shared) until
// the store is closed.
func openStore(pkiDir, dataDir string, exclusive bool) (store.Store, error) {
	unlock, err := pki.LockSecretsKeyring(pkiDir, exclusive)
	if err != nil {
		return nil, err
	}
	k, err := pki.OpenSecretsKeyring(pkiDir)
	if err != nil {
		unlock()
		return nil, err
	}
	st, err := sqlite.Open(dataDir)
	if err != nil {
		unlock()
		return nil, err
	}
	ss, err := sealed.Wrap(st, k)
	if err != nil {
		st.Close()
		unlock()
		return nil, err
	}
	return lockedStore{ss, unlock}, nil
}

// lockedStore releases the keyring's lock when the store closes.
type lockedStore struct {
	*sealed.Store
	unlock func()
}

func (l lockedStore) Close() error {
	defer l.unlock()
	return l.Store.Close()
}

// RotateSecretsKey makes a new primary key in the keyring in pkiDir, reseals
// every secret in the store in dataDir under it and retires the old keys
// (better-compute pki rotate-secrets-key). Serve must not run on dataDir
// meanwhile. It returns the new key's id and how many values it resealed.
func RotateSecretsKey(ctx context.Context, pkiDir, dataDir string) (string, int, error) {
	st, err := openStore(pkiDir, dataDir, true)
	if err != nil {
		return "", 0, err
	}
	defer st.Close()
	return st.(lockedStore).Rotate(ctx)
}

// Start opens everything and starts serving in the background.
func (s *Server) Start() (err error) {
	if s.PKIDir == "" {
		return errors.New("serve: --pki DIR is required (the bundle better-compute pki init made)")
	}
	if s.DataDir == "" {
		return errors.New("serve: --data DIR is required (where the store lives)")
	}
	if (s.TLSCertFile == "") != (s.TLSKeyFile == "") {
		return errors.New("serve: give both --tls-cert and --tls-key, or neither")
	}
	if s.CertLifetime != 0 && s.CertLifetime < MinCertLifetime {
		return fmt.Errorf("serve: --cert-lifetime %s is under the minimum %s", s.CertLifetime, MinCertLifetime)
	}
	timeouts, err := lifecycle.ParseTimeouts(firstOf(s.LifecycleTimeouts, os.Getenv(lifecycle.EnvTimeouts)))
	if err != nil {
		return fmt.Errorf("serve: --lifecycle-timeouts: %w", err)
	}
	if err := checkReleasePins(s.ReleasePins, s.ReleaseThreshold); err != nil {
		return err
	}
	if s.BasePath != "" && (!strings.HasPrefix(s.BasePath, "/") || strings.HasSuffix(s.BasePath, "/") || strings.ContainsAny(s.BasePath, "?#%{} ")) {
		return fmt.Errorf("serve: --base-path %q: want /name (no trailing /)", s.BasePath)
	}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()

	if s.bundle, err = pki.LoadBundle(s.PKIDir); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if s.store, err = openStore(s.PKIDir, s.DataDir, false); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	cleanup = append(cleanup, func() { s.store.Close() })
	ctx := context.Background()
	// A database from before sealing, or one a rotation left half done, is
	// sealed under the primary key before anything reads it.
	if n, err := s.store.(lockedStore).RewriteSecrets(ctx); err != nil {
		return fmt.Errorf("serve: %w", err)
	} else if n > 0 {
		s.log().Info("sealed stored secrets", "values", n)
	}
	// Sessions left open by a process that died are over.
	if err := s.store.CloseAllSessions(ctx, time.Now()); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if err := s.operatorToken(ctx); err != nil {
		return err
	}

	var dl http.Handler
	if s.DownloadsDir != "" {
		if dl, err = downloads.New(downloads.Options{Dir: s.DownloadsDir, BasePath: s.BasePath, Logger: s.log()}); err != nil {
			return fmt.Errorf("serve: downloads: %w", err)
		}
	}

	if s.apiL, err = net.Listen("tcp", orDefault(s.APIListen, DefaultAPIListen)); err != nil {
		return fmt.Errorf("serve: api: %w", err)
	}
	cleanup = append(cleanup, func() { s.apiL.Close() })
	if s.gwL, err = net.Listen("tcp", orDefault(s.GatewayListen, DefaultGatewayListen)); err != nil {
		return fmt.Errorf("serve: gateway: %w", err)
	}
	cleanup = append(cleanup, func() { s.gwL.Close() })

	if s.MetricsListen != "" {
		// Bound with the other listeners, so a taken port fails the start.
		if s.metrics, err = metrics.Listen(s.MetricsListen, metrics.NewRegistry(), s.log().With("component", "metrics")); err != nil {
			return fmt.Errorf("serve: --metrics-listen: %w", err)
		}
		cleanup = append(cleanup, s.metrics.Close)
	}

	s.gatewayURL = firstOf(s.GatewayURL, os.Getenv(EnvGatewayURL), "https://"+advertise(s.gwL.Addr()))
	serverName := firstOf(s.GatewayServerName, os.Getenv(EnvGatewayServerName))
	gwURL, err := url.Parse(s.gatewayURL)
	if err != nil || gwURL.Scheme != "https" || gwURL.Host == "" || gwURL.RawQuery != "" || gwURL.Fragment != "" || gwURL.User != nil {
		return fmt.Errorf("serve: gateway url %q: want https://host[:port][/path]", s.gatewayURL)
	}
	if serverName != "" && !validHost(serverName) {
		return fmt.Errorf("serve: gateway server name %q is not a DNS name", serverName)
	}

	certs, err := s.certificates(gwURL.Hostname(), serverName)
	if err != nil {
		return err
	}
	pub := s.bundle.Public
	wk := &protocol.WellKnown{
		Gateway: &protocol.WellKnownGateway{URL: s.gatewayURL, ServerName: serverName, ServingCAPin: pub.ServingCASPKIPin},
		Join: protocol.WellKnownJoin{
			EncryptionJWK:    pub.JoinEncryptionJWK,
			EncryptionKeyPin: pub.JoinEncryptionKeyPin,
			SigningKeyPin:    pub.JoinSigningKeyPin,
		},
	}
	joinSvc := &join.Service{
		Bundle: s.bundle,
		Store:  s.store,
		Attestors: map[string]join.Attestor{
			protocol.AttestorJoinToken:   join.NewTokenAttestor(s.store),
			protocol.AttestorProvisioned: join.NewProvisionedAttestor(s.store),
			protocol.AttestorDiscovery:   join.NewDiscoveryAttestor(s.store, join.TPMOptions{Bundle: s.bundle}),
			protocol.AttestorTPM:         join.NewTPMAttestor(s.store, join.TPMOptions{Bundle: s.bundle}),
		},
		CertTTL: s.CertLifetime,
		Logger:  s.log().With("component", "join"),
	}
	s.gw = &gateway.Server{
		Joiner:       joinSvc,
		Renewer:      joinSvc,
		Store:        s.store,
		Specs:        &machines.Specs{Store: s.store, GatewayURL: s.gatewayURL},
		Events:       &machines.Events{Store: s.store, Logger: s.log().With("component", "machines")},
		NodeCAs:      pub.NodeCAPool(),
		TrustDomain:  pub.TrustDomain,
		PingInterval: s.PingInterval,
		MissedPings:  s.MissedPings,
		Logger:       s.log().With("component", "gateway"),
	}
	s.lc = &lifecycle.Controller{
		Store:    s.store,
		Notifier: s.gw,
		Install: &machines.Install{GatewayURL: s.gatewayURL, GatewayServerName: serverName, Pins: pub.Pins(),
			EncryptionJWK: pub.JoinEncryptionJWK},
		Timeouts: timeouts,
		Tick:     s.LifecycleTick,
		Logger:   s.log().With("component", "lifecycle"),
	}
	s.rc = &rollouts.Controller{
		Store:              s.store,
		Notifier:           s.gw,
		MinProtocolVersion: s.MinProtocolVersion,
		Tick:               s.RolloutTick,
		Logger:             s.log().With("component", "rollouts"),
	}
	s.rc.Init()
	if s.metrics != nil {
		m := cpmetrics.New(s.gw, s.store)
		s.metrics.Registry().MustRegister(m.Collectors()...)
		s.gw.Joiner = m.Joiner(s.gw.Joiner)
		s.gw.Events = m.Events(s.gw.Events)
		s.lc.Metrics = m
	}
	s.gw.Observer = observers{s.lc, s.rc}
	s.gw.Sections = s.rc
	s.gw.MinProtocolVersion = s.MinProtocolVersion
	joinSvc.Bound = s.lc.Bound
	joinSvc.Reclaimed = func(nodeID string) {
		s.gw.Disconnect(nodeID, "the node joined again with a new certificate")
	}
	joinSvc.Retired = func(nodeID string) {
		s.gw.Disconnect(nodeID, "the machine's next ramdisk joined; this node was retired")
	}
	apiSrv := &api.Server{
		Store:     s.store,
		WellKnown: wk,
		Downloads: dl,
		BasePath:  s.BasePath,
		Notifier:  s.gw,
		Lifecycle: s.lc,
		Rollouts: &rollouts.Service{Store: s.store, ReleasePins: s.ReleasePins, ReleaseThreshold: s.ReleaseThreshold,
			Notifier: s.gw, Kick: s.rc.Kick, Logger: s.log().With("component", "rollouts")},
		DeployBCDVersion: s.DeployBCDVersion,
		Logger:           s.log().With("component", "api"),
	}
	errLog := slog.NewLogLogger(s.log().Handler(), slog.LevelDebug)
	s.apiSrv = &http.Server{
		Handler:           apiSrv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          errLog,
		TLSConfig:         &tls.Config{GetCertificate: certs.get, MinVersion: tls.VersionTLS12},
	}
	// A WebSocket needs HTTP/1.1 (it hijacks the connection); an agent that
	// offered h2 would otherwise get a session route it cannot upgrade.
	var http1 http.Protocols
	http1.SetHTTP1(true)
	s.gwSrv = &http.Server{
		Protocols:         &http1,
		Handler:           s.gw.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// A session clears both deadlines once it is upgraded.
		ReadTimeout:  30 * time.Second,
		WriteTimeout: 30 * time.Second,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     errLog,
		TLSConfig: &tls.Config{
			GetCertificate: certs.get,
			MinVersion:     tls.VersionTLS12,
			// Asked, not required: /v1/join has no certificate yet.
			// /v1/session verifies it against the node CA itself, to
			// answer 401 or 403 with a reason instead of a TLS alert.
			ClientAuth: tls.RequestClientCert,
		},
	}
	s.apiURL = "https://" + s.apiL.Addr().String() + s.BasePath
	s.serveErr = make(chan error, 3)
	for _, p := range []struct {
		srv *http.Server
		l   net.Listener
	}{{s.apiSrv, s.apiL}, {s.gwSrv, s.gwL}} {
		go func() {
			if err := p.srv.ServeTLS(p.l, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.serveErr <- err
			}
		}()
	}
	lcCtx, lcStop := context.WithCancel(context.Background())
	s.lcStop, s.lcDone = lcStop, make(chan struct{})
	go func() {
		defer close(s.lcDone)
		s.lc.Run(lcCtx)
	}()
	s.rcDone = make(chan struct{})
	go func() {
		defer close(s.rcDone)
		s.rc.Run(lcCtx)
	}()
	policy := s.Retention
	if policy == (store.Retention{}) {
		policy = store.DefaultRetention()
	}
	pruner := &retention.Pruner{Store: s.store, Policy: policy, Interval: s.RetentionInterval,
		Logger: s.log().With("component", "retention")}
	s.prDone = make(chan struct{})
	go func() {
		defer close(s.prDone)
		pruner.Run(lcCtx)
	}()
	fmt.Fprintf(s.out(), "api listening on %s\n", s.apiURL)
	fmt.Fprintf(s.out(), "gateway listening on %s\n", s.GatewayAddrURL())
	if s.metrics != nil {
		go func() {
			if err := s.metrics.Serve(context.Background()); err != nil {
				s.serveErr <- err
			}
		}()
		fmt.Fprintf(s.out(), "metrics listening on %s\n", s.metrics.URL())
	}
	s.log().Info("control plane started", "api", s.apiURL, "gateway", s.GatewayAddrURL(), "gateway_url", s.gatewayURL,
		"gateway_server_name", serverName, "trust_domain", pub.TrustDomain, "downloads", s.DownloadsDir != "",
		"lifecycle_timeouts", timeouts.WithDefaults().String(), "release_pins", len(s.ReleasePins),
		"min_protocol_version", max(s.MinProtocolVersion, protocol.MinVersion), "events_per_kind", policy.PerKind,
		"events_max_age", policy.MaxAge.String(), "events_max_total", policy.MaxTotal)
	return nil
}

// Shutdown stops accepting, ends sessions (close 1001), waits for requests in
// flight and closes the store.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		// The lifecycle first: it writes the store, and a step cut short
		// is taken up again by the next start.
		if s.lcStop != nil {
			s.lcStop()
			for _, done := range []chan struct{}{s.lcDone, s.rcDone, s.prDone} {
				select {
				case <-done:
				case <-ctx.Done():
				}
			}
		}
		if s.metrics != nil {
			s.metrics.Close()
		}
		err = errors.Join(
			s.apiSrv.Shutdown(ctx),
			s.gwSrv.Shutdown(ctx),
			s.gw.Close(ctx),
			s.store.Close(),
		)
		s.log().Info("control plane stopped")
	})
	return err
}

// checkReleasePins checks serve's release pins and threshold.
func checkReleasePins(pins []string, threshold int) error {
	seen := map[string]bool{}
	for _, p := range pins {
		if _, err := pki.ParsePin(p); err != nil {
			return fmt.Errorf("serve: --release-pins: %w", err)
		}
		if seen[p] {
			return fmt.Errorf("serve: --release-pins: pin %s given twice", p)
		}
		seen[p] = true
	}
	if threshold < 0 || threshold > max(len(pins), 1) || threshold > 0 && len(pins) == 0 {
		return fmt.Errorf("serve: --release-threshold %d: want 1 to %d (the number of --release-pins)", threshold, len(pins))
	}
	return nil
}

// operatorToken creates the operator token at the first start.
func (s *Server) operatorToken(ctx context.Context) error {
	hashes, err := s.store.OperatorTokenHashes(ctx)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	if len(hashes) > 0 {
		return nil
	}
	op := token.NewOperator()
	// The file first: a token whose hash is stored but that nobody ever saw
	// would lock the operator out.
	if s.OperatorTokenFile != "" {
		if err := pki.WriteFileAtomic(s.OperatorTokenFile, []byte(op.Token+"\n"), 0o600); err != nil {
			return fmt.Errorf("serve: operator token file: %w", err)
		}
	}
	created, err := s.store.EnsureOperatorToken(ctx, op.Hash, time.Now())
	if err != nil {
		if s.OperatorTokenFile != "" {
			os.Remove(s.OperatorTokenFile)
		}
		return fmt.Errorf("serve: %w", err)
	}
	if !created {
		return nil
	}
	if s.OperatorTokenFile != "" {
		fmt.Fprintf(s.out(), "operator token written to %s (mode 0600); it is not shown again\n", s.OperatorTokenFile)
		return nil
	}
	fmt.Fprintf(s.out(), "operator token (shown once, keep it secret; the CLI reads it from BETTER_COMPUTE_TOKEN or --token-file):\n%s\n", op.Token)
	return nil
}

// certSource serves the serving certificate, reissuing a self-issued one
// before it expires.
type certSource struct {
	mu      sync.Mutex
	cert    *tls.Certificate
	reissue func() (tls.Certificate, error)
	log     *slog.Logger
}

func (c *certSource) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reissue != nil && c.cert.Leaf != nil && time.Until(c.cert.Leaf.NotAfter) < servingCertTTL/3 {
		if cert, err := c.reissue(); err == nil {
			c.cert = &cert
		} else {
			c.log.Error("reissuing the serving certificate failed", "err", err)
		}
	}
	return c.cert, nil
}

func (s *Server) certificates(gatewayHost, serverName string) (*certSource, error) {
	if s.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.TLSCertFile, s.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("serve: --tls-cert/--tls-key: %w", err)
		}
		return &certSource{cert: &cert, log: s.log()}, nil
	}
	hosts := servingHosts(s.log(), s.apiL.Addr(), s.gwL.Addr(), gatewayHost, serverName)
	reissue := func() (tls.Certificate, error) { return s.bundle.IssueServingCert(hosts, servingCertTTL) }
	cert, err := reissue()
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	return &certSource{cert: &cert, reissue: reissue, log: s.log()}, nil
}

var dnsName = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func validHost(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	return len(h) <= 253 && dnsName.MatchString(strings.ToLower(h))
}

// servingHosts are the names and addresses the serving certificate covers.
func servingHosts(log *slog.Logger, api, gw net.Addr, extra ...string) []string {
	names := []string{"localhost", "127.0.0.1", "::1"}
	for _, a := range []net.Addr{api, gw} {
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			continue
		}
		if ap.Addr().IsUnspecified() {
			// Listening everywhere: the machine's name is the best guess
			// at what clients dial; --tls-cert covers the rest.
			if h, err := os.Hostname(); err == nil {
				names = append(names, strings.ToLower(h))
			}
			continue
		}
		names = append(names, ap.Addr().Unmap().WithZone("").String())
	}
	names = append(names, extra...)
	seen := map[string]bool{}
	var out []string
	for _, n := range names {
		n = strings.ToLower(strings.Trim(n, "[]"))
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		if !validHost(n) {
			log.Warn("serving certificate: skipping a name that is not a DNS name or IP", "name", n)
			continue
		}
		out = append(out, n)
	}
	return out
}

// advertise is the host:port agents reach a listener at.
func advertise(a net.Addr) string {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return a.String()
	}
	if ap.Addr().IsUnspecified() {
		if h, err := os.Hostname(); err == nil && validHost(strings.ToLower(h)) {
			return net.JoinHostPort(strings.ToLower(h), fmt.Sprint(ap.Port()))
		}
		return net.JoinHostPort("127.0.0.1", fmt.Sprint(ap.Port()))
	}
	return ap.String()
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func firstOf(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
