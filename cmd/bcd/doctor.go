package main

import (
	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/nodeagent"
	"github.com/better-compute/bcd/site"
)

func newDoctorCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check config.toml, the identity, the TPM, the gateway and self-update; print one line per check, exit 1 if any fails",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			checks := nodeagent.DoctorChecks(path, nodeagent.DoctorOptions{ParseOptions: configOptions(), SiteMachines: site.ServedMachines})
			if nodeagent.RunChecks(cmd.Context(), cmd.OutOrStdout(), checks) {
				return cli.ExitSilently(1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	return cmd
}
