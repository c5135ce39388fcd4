package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/bmc/sandbox"
	"github.com/better-compute/bcd/internal/cli"
)

// newPluginExecCmd is the sandbox launcher bcd re-executes itself as to start a
// plugin (bmc/sandbox): hidden, since only bcd runs it.
func newPluginExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:                "plugin-exec",
		Short:              "Start a bcx plugin in its sandbox (bcd runs this itself)",
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := sandbox.Exec(args)
			// Only failures return. The host reads this line from the plugin's
			// stderr; the prefix makes go-plugin log it as an error.
			fmt.Fprintf(cmd.ErrOrStderr(), "[ERROR] bcd %v\n", err)
			return cli.ExitSilently(126)
		},
	}
}
