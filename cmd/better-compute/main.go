// Command better-compute is the operator's CLI (package operator) and the
// control plane server (serve).
package main

import (
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/cmd/better-compute/internal/operator"
	"github.com/better-compute/bcd/internal/cli"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return cli.Run(newRoot(), args, stdin, stdout, stderr)
}

func newRoot() *cobra.Command {
	root := operator.NewRoot()
	root.AddCommand(newServeCmd())
	for _, c := range root.Commands() {
		if c.Name() == "pki" {
			c.AddCommand(newRotateSecretsKeyCmd())
		}
	}
	return root
}
