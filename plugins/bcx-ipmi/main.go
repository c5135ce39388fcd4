// Command bcx-ipmi is bcd's IPMI BMC driver plugin: bcd site starts it, sandboxed,
// from its [plugins] dir and sends it power and boot-device operations over
// go-plugin's gRPC. It is not meant to be run by hand.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/better-compute/bcd/bmc/bmcplugin"
	"github.com/better-compute/bcd/internal/version"
	"github.com/better-compute/bcd/plugins/bcx-ipmi/ipmi"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && (args[0] == "version" || args[0] == "--version"):
		fmt.Fprintln(stdout, version.String("bcx-ipmi"))
		return 0
	case len(args) > 0:
		fmt.Fprintln(stderr, "bcx-ipmi: takes no arguments (bcd site starts it)")
		return 2
	case os.Getenv(bmcplugin.Handshake.MagicCookieKey) != bmcplugin.Handshake.MagicCookieValue:
		fmt.Fprintln(stderr, "bcx-ipmi is a bcd plugin: bcd site starts it from its [plugins] dir")
		return 1
	}
	logger, pluginLogger := bmcplugin.Loggers(stderr, "bcx-ipmi")
	bmcplugin.Serve(&ipmi.Driver{Logger: logger}, pluginLogger)
	return 0
}
