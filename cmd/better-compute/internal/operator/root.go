package operator

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
)

// NewRoot is the better-compute command with every operator subcommand;
// the caller adds serve.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "better-compute",
		Short: "better-compute: the control plane and the operator's CLI for a bare-metal fleet",
		Args:  cli.NoArgs,
	}
	root.AddCommand(newVersionCmd(), newPKICmd(), newReleaseCmd(), newDaemonCmd())
	root.AddCommand(newTokensCmd(), newSitesCmd(), newNodesCmd(), newCommandsCmd(), newMachinesCmd(), newTPMCmd(), newPoolsCmd(),
		newReleasesCmd(), newRolloutsCmd(), newImagesCmd())
	return root
}

// run runs the operator CLI with args, as main runs the binary.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(NewRoot(), args, stdin, stdout, stderr)
}
