package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/daemonupdate"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/labfault"
	"github.com/better-compute/bcd/nodeagent"
)

// nodeHooks lets tests replace the rebooter and shorten timings; the binary leaves
// it nil.
var nodeHooks func(*nodeagent.Node)

func newNodeCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: the gateway session, the journal and the status socket",
		Long: `bcd node runs on an installed server after bcd join. It opens no TCP listener:
it keeps an outbound session to the gateway, runs the node's commands (node.reboot,
daemon.upgrade), updates itself to a signed release the daemon section names (see
bcd update), keeps unacknowledged statuses in its journal, and answers a JSON status
on its unix socket (socket_path, GET /v1/status). A [metrics] section is bcd
site's: bcd node ignores it, with a warning.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if labfault.Crash {
				// A lab release that crash-loops under systemd (see labfault).
				fmt.Fprintln(cmd.ErrOrStderr(), "bcd node: this is a labfault_crash build: exiting at once")
				return cli.ExitSilently(1)
			}
			cfg, err := config.Load(path, configOptions())
			if err != nil {
				if config.IsInvalid(err) {
					return cli.Usagef("bcd node: %w", err)
				}
				return fmt.Errorf("bcd node: %w", err)
			}
			logger, err := agent.NewLogger(cmd.ErrOrStderr(), cfg.LogOrDefault())
			if err != nil {
				return cli.Usagef("bcd node: %w", err)
			}
			if cfg.Metrics != nil {
				// The node opens no TCP listener. The section is not refused:
				// a site agent on the same host reads the same config.toml.
				logger.Warn("ignoring [metrics]: bcd node serves no metrics; the section is bcd site's", "listen", cfg.Metrics.Listen)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			n := &nodeagent.Node{Config: cfg, ConfigPath: path, Logger: logger, RenewHook: renewHook()}
			if nodeHooks != nil {
				nodeHooks(n)
			}
			err = n.Run(ctx)
			if errors.Is(err, daemonupdate.ErrExec) {
				// Run has closed the journal, the socket and the session.
				stop()
				return n.ExecUpdate()
			}
			return err
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	return cmd
}
