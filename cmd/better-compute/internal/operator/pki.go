package operator

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/pki"
)

func newPKICmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pki",
		Short: "Create and read the PKI bundle (serving CA, join keys, node CA)",
	}
	var trustDomain string
	initCmd := &cobra.Command{
		Use:   "init DIR",
		Short: "Create a new PKI bundle in DIR (refuses to overwrite one)",
		Args:  cli.ExactArgs(1, "the bundle directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pub, err := pki.Init(args[0], pki.InitOptions{TrustDomain: trustDomain})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "created PKI bundle in %s (trust domain %s)\n", args[0], pub.TrustDomain)
			fmt.Fprintf(out, "private keys are mode 0600; public.json holds what agents and install scripts need.\n")
			fmt.Fprintf(out, "pins for config.toml:\n%s", pub.Pins().ConfigLines())
			return nil
		},
	}
	initCmd.Flags().StringVar(&trustDomain, "trust-domain", "", "SPIFFE trust domain of node certificates (default better-compute.local)")
	pins := &cobra.Command{
		Use:   "pins DIR",
		Short: "Print the three bootstrap pins of the bundle in DIR as config.toml lines",
		Args:  cli.ExactArgs(1, "the bundle directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := pki.BootstrapPins(args[0])
			if err != nil {
				return err
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), p.ConfigLines())
			return err
		},
	}
	cmd.AddCommand(initCmd, pins)
	return cmd
}
