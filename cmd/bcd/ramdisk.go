package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/ramdisk"
)

// ramdiskHooks lets tests replace the machine, the gateway's timings and the data
// directory; the binary leaves it nil.
var ramdiskHooks func(*ramdisk.Agent)

func newRamdiskCmd() *cobra.Command {
	var cmdline string
	cmd := &cobra.Command{
		Use:   "ramdisk",
		Short: "Run the PXE ramdisk agent (u-root's uinit): join by discovery, deploy, kexec",
		Long: `bcd ramdisk runs inside the PXE ramdisk a site agent boots. It reads everything from
the kernel command line (bcd.gateway_url, bcd.server_name, bcd.site, bcd.serving_ca_pin,
bcd.join_signing_pin, bcd.join_encryption_pin, bcd.boot_nonce, optionally bcd.proxy,
bcd.witness and bcd.log) and exits 2 naming any that is missing or malformed. It loads
the kernel modules the hardware needs, runs DHCP, asks the site agent at bcd.witness to
countersign its join, joins through the discovery attestor as role ramdisk, and runs the control plane's commands until the machine kexecs into its
installed OS, reboots or powers off. It logs JSON lines on the console.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmdline == ramdisk.DefaultCmdlinePath {
				if err := ramdisk.EnsureProc(); err != nil {
					return cli.Exit(1, fmt.Errorf("bcd ramdisk: %w", err))
				}
			}
			p, err := ramdisk.ReadParams(cmdline, buildmode.FakeHW)
			if ramdisk.IsCmdlineError(err) {
				return cli.Usagef("bcd ramdisk: %w", err)
			}
			if err != nil {
				return cli.Exit(1, fmt.Errorf("bcd ramdisk: %w", err))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			a := &ramdisk.Agent{
				Params:    p,
				Logger:    ramdisk.NewLogger(cmd.ErrOrStderr(), p.LogLevel),
				AllowHTTP: buildmode.FakeHW,
			}
			if ramdiskHooks != nil {
				ramdiskHooks(a)
			}
			if err := a.Run(ctx); err != nil {
				return cli.Exit(1, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cmdline, "cmdline", ramdisk.DefaultCmdlinePath, "the kernel command line to read")
	_ = cmd.Flags().MarkHidden("cmdline")
	return cmd
}
