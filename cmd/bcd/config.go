package main

import (
	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/cli"
)

// configOptions is how every subcommand reads config.toml, so `bcd config check`
// judges a file exactly as the daemon will.
func configOptions() config.ParseOptions {
	return config.ParseOptions{AllowHTTP: buildmode.FakeHW}
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Work with /etc/bcd/config.toml",
	}
	var path string
	check := &cobra.Command{
		Use:   "check",
		Short: "Read config.toml as every bcd command does; print OK or each error as FILE:LINE: message",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !config.Check(path, configOptions(), cmd.OutOrStdout()) {
				return cli.ExitSilently(1)
			}
			return nil
		},
	}
	check.Flags().StringVar(&path, "config", config.DefaultPath, "config file to check")
	cmd.AddCommand(check)
	return cmd
}
