package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/controlplane/join"
	"github.com/better-compute/bcd/controlplane/lifecycle"
	"github.com/better-compute/bcd/controlplane/rollouts"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/protocol"
)

func newServeCmd() *cobra.Command {
	s := controlplane.Server{Retention: store.DefaultRetention()}
	var logLevel string
	cmd := &cobra.Command{
		Use:   "serve --pki DIR --data DIR",
		Short: "Run the control plane: api, JoinService and gateway on an embedded store",
		Long: `Run the control plane in one process: the api (operator api, /.well-known/better-compute,
downloads) on --listen, and the gateway (POST /v1/join, the /v1/session WebSockets) on
--gateway-listen, both over HTTPS with a certificate issued from the bundle's serving CA
(or --tls-cert/--tls-key), on a SQLite store in --data.

At the first start on a data directory it creates the operator token and prints it once,
or writes it to --operator-token-file (0600). SIGINT or SIGTERM shut it down gracefully.

The well-known gateway url and server name come from --gateway-url and
--gateway-server-name, else from BETTER_COMPUTE_GATEWAY_URL and
BETTER_COMPUTE_GATEWAY_SERVER_NAME, else the gateway's own address.

It also runs every machine's lifecycle (better-compute machines deploy): each step has a
timeout (--lifecycle-timeouts) and bounded retries, and a restart takes every machine up
where the store says it was.

It also runs the rollouts (better-compute rollouts create): releases add verifies every
manifest under --release-pins (at least --release-threshold of them), and refuses without
them.

Node certificates last --cert-lifetime (default 90 days); a node renews its certificate
at about two thirds of that over POST /v1/renew.

With --metrics-listen HOST:PORT it serves Prometheus metrics on http://HOST:PORT/metrics
(better_compute_*: sessions, joins, machines by state, deployments, agents' events; go_*
and process_*). It has no authentication: bind it to the monitoring network.

It bounds what the agents' reports leave in the store, since every script a site's boot
server serves mints a boot nonce and nothing authenticates who asks: of each node's events
and each machine's timeline entries of one kind it keeps the first and the latest
--events-per-kind, nothing older than --events-max-age, and at most --events-max-total rows
in each of the events, timeline and boot nonce tables (a MAC keeps its 16 newest nonces).
A pruner applies them at start and every minute, in batches of 1,000 rows.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if s.PKIDir == "" || s.DataDir == "" {
				return cli.Usagef("serve: --pki DIR and --data DIR are required")
			}
			if s.CertLifetime < controlplane.MinCertLifetime {
				return cli.Usagef("serve: --cert-lifetime %s: want at least %s", s.CertLifetime, controlplane.MinCertLifetime)
			}
			if s.MetricsListen != "" {
				if err := metrics.CheckAddr(s.MetricsListen); err != nil {
					return cli.Usagef("serve: --metrics-listen: %w", err)
				}
			}
			switch r := s.Retention; {
			case r.PerKind < 0:
				return cli.Usagef("serve: --events-per-kind %d: want 0 (no bound) or more", r.PerKind)
			case r.MaxAge < 0:
				return cli.Usagef("serve: --events-max-age %s: want 0 (no bound) or more", r.MaxAge)
			case r.MaxTotal < 1:
				return cli.Usagef("serve: --events-max-total %d: want at least 1", r.MaxTotal)
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return cli.Usagef("serve: --log-level %q: want debug, info, warn or error", logLevel)
			}
			s.Out = cmd.OutOrStdout()
			s.Logger = newLogger(cmd.ErrOrStderr(), level)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return s.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&s.PKIDir, "pki", "", "PKI bundle directory (better-compute pki init)")
	f.StringVar(&s.DataDir, "data", "", "data directory for the store (created 0700; refused if group or others can write it)")
	f.StringVar(&s.APIListen, "listen", controlplane.DefaultAPIListen, "api address (HTTPS)")
	f.StringVar(&s.GatewayListen, "gateway-listen", controlplane.DefaultGatewayListen, "gateway address (HTTPS, agents' join and sessions)")
	f.StringVar(&s.GatewayURL, "gateway-url", "", "gateway URL published in /.well-known/better-compute (default: $"+controlplane.EnvGatewayURL+", else https://<gateway-listen>)")
	f.StringVar(&s.GatewayServerName, "gateway-server-name", "", "TLS server name agents check for the gateway (default: $"+controlplane.EnvGatewayServerName+")")
	f.StringVar(&s.TLSCertFile, "tls-cert", "", "serving certificate chain (PEM) instead of one issued from the serving CA")
	f.StringVar(&s.TLSKeyFile, "tls-key", "", "key of --tls-cert (PEM)")
	f.StringVar(&s.OperatorTokenFile, "operator-token-file", "", "at first start, write the operator token to this file (0600) instead of printing it")
	f.StringVar(&s.DownloadsDir, "downloads-dir", "", "serve release binaries from this directory at {base-path}/downloads/…")
	f.StringVar(&s.BasePath, "base-path", "", "path prefix of the api routes, e.g. /p")
	f.StringVar(&s.LifecycleTimeouts, "lifecycle-timeouts", "", "machine lifecycle step timeouts, e.g. ramdisk=10m,deploy=1h,install=15m,bmc=2m,inventory=2m,grace=1m (default $"+lifecycle.EnvTimeouts+", else those)")
	f.DurationVar(&s.CertLifetime, "cert-lifetime", join.DefaultCertTTL, "lifetime of the node certificates a join or renewal issues (at least "+controlplane.MinCertLifetime.String()+"); nodes renew at two thirds of it")
	f.StringSliceVar(&s.ReleasePins, "release-pins", nil, "SPKI pins (sha256/…) of the operator's release signing keys: releases add verifies every manifest under them, and is refused without them")
	f.IntVar(&s.ReleaseThreshold, "release-threshold", 0, "how many distinct --release-pins keys must have signed a release (default 1)")
	f.IntVar(&s.MinProtocolVersion, "min-protocol-version", protocol.MinVersion, "agents below this protocol version are upgrade_required: sent only daemon.upgrade (for tests)")
	f.StringVar(&s.DeployBCDVersion, "deploy-bcd-version", "", "the release (better-compute releases add) whose bcd machines deploy installs into the image's root when it gives no --bcd-version (default: none; the image must ship bcd)")
	f.DurationVar(&s.RolloutTick, "rollout-interval", rollouts.DefaultTick, "how often the rollout controller looks at active rollouts when nothing woke it (for tests)")
	f.MarkHidden("min-protocol-version")
	f.MarkHidden("rollout-interval")
	f.StringVar(&s.MetricsListen, "metrics-listen", "", "serve Prometheus metrics on http://HOST:PORT/metrics (default: none)")
	f.IntVar(&s.Retention.PerKind, "events-per-kind", store.DefaultPerKind, "keep the first and the latest N events of each kind per node and per machine timeline (0: no bound)")
	f.DurationVar(&s.Retention.MaxAge, "events-max-age", store.DefaultMaxAge, "delete events, timeline entries and boot nonces older than this (0: no bound)")
	f.IntVar(&s.Retention.MaxTotal, "events-max-total", store.DefaultMaxTotal, "at most this many rows in each of the events, timeline and boot nonce tables; the oldest go first")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

// newLogger logs text to a terminal and JSON lines otherwise (a service
// manager's journal).
func newLogger(w interface{ Write([]byte) (int, error) }, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			return slog.New(slog.NewTextHandler(w, opts))
		}
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
