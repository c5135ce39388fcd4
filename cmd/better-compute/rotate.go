package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane"
	"github.com/better-compute/bcd/internal/cli"
)

// newRotateSecretsKeyCmd is `pki rotate-secrets-key`, here beside serve
// rather than in package operator, since it opens the store.
func newRotateSecretsKeyCmd() *cobra.Command {
	var data string
	cmd := &cobra.Command{
		Use:   "rotate-secrets-key DIR --data DIR",
		Short: "Seal the store's secrets under a new key of DIR/secrets.key and retire the old one (serve stopped)",
		Long: `Add a new primary key to the keyring secrets.key in the PKI bundle DIR, reseal every
secret the store in --data holds (BMC passwords, command params, credential-bearing image
URLs) under it in one transaction, and only then remove the old keys from the keyring. An
interrupted run leaves a keyring that still opens every value; run it again to finish.
It refuses while a better-compute serve holds the keyring.`,
		Args: cli.ExactArgs(1, "the bundle directory"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if data == "" {
				return cli.Usagef("pki rotate-secrets-key: --data DIR is required (serve's data directory)")
			}
			kid, n, err := controlplane.RotateSecretsKey(cmd.Context(), args[0], data)
			if err != nil {
				return fmt.Errorf("pki rotate-secrets-key: %w", err)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "secrets key %s is primary; %d values resealed; the old keys are retired\n", kid, n)
			return err
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "serve's data directory (the store)")
	return cmd
}
