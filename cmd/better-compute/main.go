// Command better-compute is the operator's CLI and the control plane server.
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(newRoot(), args, stdin, stdout, stderr)
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "better-compute",
		Short: "better-compute: the control plane and the operator's CLI for a bare-metal fleet",
		Args:  cli.NoArgs,
	}
	root.AddCommand(newVersionCmd(), newPKICmd(), newReleaseCmd(), newDaemonCmd())
	root.AddCommand(newServeCmd(), newTokensCmd(), newSitesCmd(), newNodesCmd(), newCommandsCmd(), newMachinesCmd())
	return root
}
