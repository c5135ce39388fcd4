package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/labfault"
	"github.com/better-compute/bcd/internal/metrics"
	"github.com/better-compute/bcd/internal/metrics/sitemetrics"
	"github.com/better-compute/bcd/site"
)

// serveSiteMetrics serves [metrics] listen, when the section is there, until
// the returned function is called. The port is bound before Run: a site agent
// configured for metrics does not run without them.
func serveSiteMetrics(ctx context.Context, s *site.Site, log *slog.Logger) (func(), error) {
	m := s.Config.Metrics
	if m == nil {
		return func() {}, nil
	}
	reg := metrics.NewRegistry()
	reg.MustRegister(sitemetrics.New(s))
	srv, err := metrics.Listen(m.Listen, reg, log)
	if err != nil {
		return nil, fmt.Errorf("[metrics] listen: %w", err)
	}
	log.Info("metrics listening", "url", srv.URL())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx); err != nil {
			log.Error("the metrics endpoint stopped", "error", err.Error())
		}
	}()
	return func() { srv.Close(); <-done }, nil
}

// siteHooks lets tests point the proxyDHCP at loopback and shorten timings; the
// binary leaves it nil.
var siteHooks func(*site.Site)

func newSiteCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "site",
		Short: "Run the site agent: boot server, BMC commands and the boot network's HTTP proxy",
		Long: `bcd site runs on a site's provisioning host after bcd join --role site. It keeps an
outbound session to the gateway and applies the site's desired state: the boot table
(served by the proxyDHCP, TFTP and HTTP boot servers of [boot]), the HTTP proxy of the
boot network, and the BMC hosts that bmc.power, bmc.bootdev and bmc.inventory drive.
It answers a JSON status on its unix socket (socket_path, GET /v1/status).
Without a [boot] section it serves no PXE machine. The last spec is kept in
<data_dir>/site-spec.json so a restart during a gateway outage keeps booting.
With a [metrics] section it serves Prometheus metrics on http://<listen>/metrics
(bcd_site_*: DHCP, TFTP, BMC operations; go_* and process_*).`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if labfault.Crash {
				// A lab release that crash-loops under systemd (see labfault).
				fmt.Fprintln(cmd.ErrOrStderr(), "bcd site: this is a labfault_crash build: exiting at once")
				return cli.ExitSilently(1)
			}
			cfg, err := config.Load(path, configOptions())
			if err != nil {
				if config.IsInvalid(err) {
					return cli.Usagef("bcd site: %w", err)
				}
				return fmt.Errorf("bcd site: %w", err)
			}
			if err := site.CheckConfig(cfg); err != nil {
				var ce *config.Error
				if errors.As(err, &ce) {
					ce.File = path
				}
				return cli.Usagef("bcd site: %w", err)
			}
			logger, err := agent.NewLogger(cmd.ErrOrStderr(), cfg.LogOrDefault())
			if err != nil {
				return cli.Usagef("bcd site: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			s := &site.Site{Config: cfg, ConfigPath: path, Logger: logger, RenewHook: renewHook()}
			if siteHooks != nil {
				siteHooks(s)
			}
			closeMetrics, err := serveSiteMetrics(ctx, s, logger)
			if err != nil {
				return fmt.Errorf("bcd site: %w", err)
			}
			err = s.Run(ctx)
			closeMetrics()
			if errors.Is(err, daemonupdate.ErrExec) {
				// Run has closed the journal, the sockets, the servers and
				// the plugins; the metrics port is closed too, for the new
				// binary to bind.
				stop()
				return s.ExecUpdate()
			}
			if config.IsInvalid(err) {
				return cli.Exit(2, err)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	return cmd
}
