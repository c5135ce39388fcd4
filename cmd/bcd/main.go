// Command bcd is the agent: `bcd node` on installed servers, `bcd site` on site agents,
// `bcd ramdisk` inside the PXE ramdisk, and the commands around them.
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
		Use:   "bcd",
		Short: "bcd: the better-compute agent for nodes, sites and the PXE ramdisk",
		Args:  cli.NoArgs,
	}
	root.AddCommand(newVersionCmd(), newConfigCmd(), newJoinCmd(), newNodeCmd(), newSiteCmd(), newRamdiskCmd(), newDoctorCmd(), newUpdateCmd(), newPluginExecCmd(), newHelperCmd(), newSimCmd(), newBootOrderCmd())
	return root
}
