package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
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
it keeps an outbound session to the gateway, runs the node's commands (node.reboot),
keeps unacknowledged statuses in its journal, and answers a JSON status on its unix
socket (socket_path, GET /v1/status).`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
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
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			n := &nodeagent.Node{Config: cfg, Logger: logger, RenewHook: renewHook()}
			if nodeHooks != nil {
				nodeHooks(n)
			}
			return n.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	return cmd
}
