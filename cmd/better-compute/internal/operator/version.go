package operator

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/version"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this build",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String("better-compute"))
			return err
		},
	}
}
