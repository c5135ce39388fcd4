package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/sim"
)

func newSimCmd() *cobra.Command {
	var (
		siteConfig, api, tokenFile, firstIP, bmcAddr, jsonOut string
		watch                                                 []string
		c                                                     sim.Config
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Play N machines over the real protocols against a real bcd site and better-compute serve",
		Long: `bcd sim adds N machines (with simulated BMCs) to the site of --site-config, deploys
them all at once through the operator api, and plays each machine: DHCP as PXE
firmware and then iPXE sends it, TFTP of the boot file, the iPXE script, kernel and
initrd over HTTP, the real bcd ramdisk (discovery join with the script's nonce,
inventory, deploy.image onto a simulated disk, the "kexec"), then the installed OS's
provisioned join and node session. It prints the time to provision all, each stage's
p50/p99, the watched processes' peak RSS and CPU, and every machine that failed
(with its reason), is stuck, or has an incomplete timeline; it exits 1 unless every
machine is provisioned with a complete timeline.

Run it in a network namespace whose interface is on the site's boot network and
holds the machines' addresses (--first-ip and the N-1 after it) and --bmc-address,
which the site agent must reach. sim never self-updates (the daemon section is
reported unsupported).`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if siteConfig == "" || api == "" || tokenFile == "" || c.Machines == 0 {
				return cli.Usagef("bcd sim: --site-config, --api, --operator-token-file and --machines are required")
			}
			sc, err := config.Load(siteConfig, config.ParseOptions{})
			if err != nil {
				return cli.Usagef("bcd sim: --site-config: %w", err)
			}
			c.Site, c.ServingCAPin, c.API = sc.Site, sc.ServingCASPKIPin, api
			tok, err := secretfile.Read(tokenFile, secretfile.Options{Limit: 4096, Private: true, What: "the operator token"})
			if err != nil {
				return cli.Usagef("bcd sim: --operator-token-file: %w", err)
			}
			c.OperatorToken = strings.TrimSpace(string(tok))
			if c.FirstIP, err = netip.ParseAddr(firstIP); err != nil {
				return cli.Usagef("bcd sim: --first-ip %q: want an IPv4 address", firstIP)
			}
			if c.BMCAddr, err = netip.ParseAddr(bmcAddr); err != nil {
				return cli.Usagef("bcd sim: --bmc-address %q: want an IPv4 address", bmcAddr)
			}
			c.Watch = map[string]func() int{}
			for _, w := range watch {
				name, pidfile, ok := strings.Cut(w, "=")
				if !ok || name == "" || pidfile == "" {
					return cli.Usagef("bcd sim: --watch %q: want NAME=PIDFILE", w)
				}
				c.Watch[name] = func() int {
					b, err := os.ReadFile(pidfile)
					if err != nil {
						return 0
					}
					pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
					return pid
				}
			}
			c.Log = cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var printed bool
			show := func(r *sim.Result) {
				printed = true
				fmt.Fprint(cmd.OutOrStdout(), r.String())
				if jsonOut != "" {
					b, _ := json.MarshalIndent(r, "", "  ")
					if err := os.WriteFile(jsonOut, append(b, '\n'), 0o644); err != nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "bcd sim: --json: %v\n", err)
					}
				}
			}
			c.OnResult = show
			r, err := sim.Run(ctx, c)
			if err != nil {
				if strings.Contains(err.Error(), "bcd sim: machines ") || ctx.Err() != nil {
					return err
				}
				return cli.Usagef("%w", err)
			}
			if !printed {
				show(r)
			}
			if !r.OK() {
				return cli.ExitSilently(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&siteConfig, "site-config", "", "the site agent's config.toml: its site, gateway and serving CA pin")
	f.StringVar(&api, "api", "", "better-compute serve's api, https://host:port")
	f.StringVar(&tokenFile, "operator-token-file", "", "a file holding an operator token for the api")
	f.IntVar(&c.Machines, "machines", 0, "how many machines to play")
	f.StringVar(&firstIP, "first-ip", "", "machine 0's address; machine i has this plus i")
	f.StringVar(&bmcAddr, "bmc-address", "", "where the simulated BMCs listen (port --bmc-port + i)")
	f.IntVar(&c.BMCPort, "bmc-port", 16000, "machine 0's BMC port")
	f.StringVar(&c.ImageListen, "image-listen", "", "where sim serves the image it deploys (default --bmc-address:8090)")
	f.Int64Var(&c.ImageSize, "image-size", 8<<20, "the image's size in bytes")
	f.StringVar(&c.WorkDir, "work-dir", "", "each machine's ramdisk data, simulated root filesystem and disk")
	f.StringVar(&c.Name, "name", "sim", "machine name prefix: NAME-00000, …")
	f.Float64Var(&c.UEFIShare, "uefi-share", 0.5, "the fraction of machines booting UEFI (the rest BIOS)")
	f.DurationVar(&c.KernelBoot, "kernel-boot", 1500*time.Millisecond, "the ramdisk kernel's boot, before bcd ramdisk joins (±25 %; negative: none)")
	f.BoolVar(&c.SparseDisks, "sparse-disks", false, "write each image to a sparse file in --work-dir (default: hash only)")
	f.DurationVar(&c.Timeout, "timeout", 20*time.Minute, "the longest the run waits for every machine to settle")
	f.IntVar(&c.Parallel, "parallel", 16, "api calls in flight while adding and deploying")
	f.DurationVar(&c.PingInterval, "ping-interval", 0, "node sessions' heartbeat (default: the session's)")
	f.StringArrayVar(&watch, "watch", nil, "NAME=PIDFILE: report the process's peak RSS and CPU (repeatable; serve, site)")
	f.StringVar(&jsonOut, "json", "", "also write the result as JSON here")
	f.BoolVar(&c.Keep, "keep", false, "after the result, keep the node sessions up until interrupted")
	cmd.AddCommand(newSimFirmwareCmd())
	return cmd
}

// newSimFirmwareCmd is bcd sim firmware, the child bcd sim starts to run its
// machines' firmware (sim.FirmwareMain): JSON lines on stdin and stdout, not for
// people.
func newSimFirmwareCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "firmware",
		Short:  "bcd sim's firmware child (DHCP, TFTP and HTTP of its machines); bcd sim starts it",
		Hidden: true,
		Args:   cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// A ^C reaches the whole process group: sim stops the run and
			// then closes our stdin, which ends us; sim's death kills us
			// (PR_SET_PDEATHSIG).
			signal.Ignore(os.Interrupt, syscall.SIGTERM)
			return sim.FirmwareMain(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}
