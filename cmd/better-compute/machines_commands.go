package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/api"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/controlplane/store"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/protocol"
)

// pollInterval is how often a waiting command reads its command's state.
const pollInterval = 250 * time.Millisecond

// waitFlags are how a command that runs somewhere waits for its answer.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (w *waitFlags) add(cmd *cobra.Command, timeout time.Duration) {
	cmd.Flags().BoolVar(&w.wait, "wait", true, "wait for the agent's answer (--wait=false: print the command id and return)")
	cmd.Flags().DurationVar(&w.timeout, "timeout", timeout, "how long to wait for the answer")
}

// run enqueues with send and, when waiting, waits for the terminal status
// and hands a SUCCEEDED command to done. A command that FAILED (or that the
// agent does not run) is an error naming its reason.
func (w *waitFlags) run(cmd *cobra.Command, af *apiFlags, what string, send func(context.Context, *client.Client) (store.Command, error),
	done func(io.Writer, store.Command) error) error {
	if w.timeout <= 0 {
		return cli.Usagef("%s: --timeout %v: want a positive duration", what, w.timeout)
	}
	c, err := af.client()
	if err != nil {
		return err
	}
	sent, err := send(cmd.Context(), c)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	out := cmd.OutOrStdout()
	if !w.wait {
		if af.json() {
			return printJSON(out, sent)
		}
		_, err := fmt.Fprintln(out, sent.ID)
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), w.timeout)
	defer cancel()
	got, err := c.WaitCommand(ctx, sent.ID, pollInterval)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%s: no answer from node %s within %v: command %s is %s (better-compute commands get %s)",
				what, sent.NodeID, w.timeout, sent.ID, got.State, sent.ID)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	if af.json() {
		if err := printJSON(out, got); err != nil {
			return err
		}
	}
	if got.State != protocol.StateSucceeded {
		reason := got.State
		if got.Reason != "" {
			reason += ": " + got.Reason
		}
		if got.Message != "" {
			reason += ": " + got.Message
		}
		return fmt.Errorf("%s: %s (command %s)", what, reason, got.ID)
	}
	if af.json() {
		return nil
	}
	return done(out, got)
}

func newMachinesPowerCmd(af *apiFlags) *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "power M on|off|cycle|reset|status",
		Short: "Drive the machine's power through its BMC, from a site agent",
		Long: `Ask a connected site agent of the machine's site to drive its BMC (bmc.power) and print
the power state the BMC reports afterwards; status only reads it. A BMC failure exits 1
with its reason.`,
		Args: cli.ExactArgs(2, "the machine and the action (on, off, cycle, reset or status)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			action := args[1]
			switch action {
			case protocol.PowerOn, protocol.PowerOff, protocol.PowerCycle, protocol.PowerReset, protocol.PowerStatus:
			default:
				return cli.Usagef("machines power: %q: want on, off, cycle, reset or status", action)
			}
			return w.run(cmd, af, "machines power",
				func(ctx context.Context, c *client.Client) (store.Command, error) {
					return c.Power(ctx, args[0], action)
				},
				func(out io.Writer, got store.Command) error {
					var res protocol.BMCPowerResult
					if err := json.Unmarshal(got.Result, &res); err != nil || res.Power == "" {
						_, err := fmt.Fprintf(out, "machine %s: %s done\n", got.MachineID, action)
						return err
					}
					if action == protocol.PowerStatus {
						_, err := fmt.Fprintf(out, "machine %s: power is %s\n", got.MachineID, res.Power)
						return err
					}
					_, err := fmt.Fprintf(out, "machine %s: %s done, power is %s\n", got.MachineID, action, res.Power)
					return err
				})
		},
	}
	w.add(cmd, 2*time.Minute)
	return cmd
}

func newMachinesBootdevCmd(af *apiFlags) *cobra.Command {
	var w waitFlags
	var in api.MachineBootdev
	cmd := &cobra.Command{
		Use:   "bootdev M pxe|disk [--efi] [--persistent]",
		Short: "Set the device the machine boots from next, through its BMC",
		Args:  cli.ExactArgs(2, "the machine and the device (pxe or disk)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Device = args[1]
			if in.Device != protocol.BootDevicePXE && in.Device != protocol.BootDeviceDisk {
				return cli.Usagef("machines bootdev: %q: want pxe or disk", in.Device)
			}
			return w.run(cmd, af, "machines bootdev",
				func(ctx context.Context, c *client.Client) (store.Command, error) { return c.Bootdev(ctx, args[0], in) },
				func(out io.Writer, got store.Command) error {
					var res protocol.BMCBootdevResult
					if json.Unmarshal(got.Result, &res) != nil || res.Device == "" {
						res = protocol.BMCBootdevResult{Device: in.Device, EFI: in.EFI, Persistent: in.Persistent}
					}
					var how []string
					if res.EFI {
						how = append(how, "EFI")
					}
					if res.Persistent {
						how = append(how, "persistent")
					} else {
						how = append(how, "next boot only")
					}
					_, err := fmt.Fprintf(out, "machine %s boots from %s (%s)\n", got.MachineID, res.Device, strings.Join(how, ", "))
					return err
				})
		},
	}
	w.add(cmd, 2*time.Minute)
	cmd.Flags().BoolVar(&in.EFI, "efi", false, "boot the device under UEFI")
	cmd.Flags().BoolVar(&in.Persistent, "persistent", false, "for every boot, not only the next")
	return cmd
}

func newMachinesInventoryCmd(af *apiFlags) *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "inventory M",
		Short: "Ask the machine's ramdisk for its hardware inventory and store it",
		Args:  cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return w.run(cmd, af, "machines inventory",
				func(ctx context.Context, c *client.Client) (store.Command, error) { return c.Inventory(ctx, args[0]) },
				func(out io.Writer, got store.Command) error {
					var v any
					if json.Unmarshal(got.Result, &v) != nil {
						_, err := fmt.Fprintf(out, "machine %s: inventory done\n", got.MachineID)
						return err
					}
					b, _ := json.MarshalIndent(v, "", "  ")
					_, err := fmt.Fprintf(out, "%s\n", b)
					return err
				})
		},
	}
	w.add(cmd, 5*time.Minute)
	return cmd
}

func newMachinesDeployCmd(af *apiFlags) *cobra.Command {
	var in api.DeployCreate
	cmd := &cobra.Command{
		Use:   "deploy M --image URL --sha256 H --size N [--format F] [--image-size N] [--disk-serial S | --disk-path P]",
		Short: "Write an image to the machine's disk from its ramdisk; prints the command id",
		Long: `Send deploy.image to the machine's ramdisk (it must have joined and be connected): it
streams the image, checks its SHA-256 and size, writes it to the disk, then writes into
the installed root /etc/bcd/config.toml, /etc/bcd/join-encryption.jwk, /etc/bcd/join-token
(a single-use token bound to a new node id, for pool --pool) and /etc/bcd/node-id, all
0600 root, and kexecs the installed kernel (--after). The installed OS joins with
bcd join --token-file /etc/bcd/join-token --node-id $(cat /etc/bcd/node-id) and becomes
the machine's node. Follow it with better-compute machines events M.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if in.Image.URL == "" || in.Image.SHA256 == "" || in.Image.Size <= 0 {
				return cli.Usagef("machines deploy: --image, --sha256 and --size are required")
			}
			if in.Target.Serial != "" && in.Target.Path != "" {
				return cli.Usagef("machines deploy: give --disk-serial or --disk-path, not both")
			}
			switch in.After {
			case protocol.AfterKexec, protocol.AfterReboot, protocol.AfterNone, protocol.AfterPowerOff:
			default:
				return cli.Usagef("machines deploy: --after %q: want kexec, reboot, poweroff or none", in.After)
			}
			in.Image.SHA256 = strings.ToLower(in.Image.SHA256)
			c, err := af.client()
			if err != nil {
				return err
			}
			out, err := c.Deploy(cmd.Context(), args[0], in)
			if err != nil {
				return fmt.Errorf("machines deploy: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "deploy.image sent to ramdisk node %s of machine %s; the installed OS joins as node %s (pool %s, join token %s)\n",
				out.Command.NodeID, out.Command.MachineID, out.NodeID, firstNonEmpty(in.Pool, api.DefaultPool), out.TokenID)
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.Command.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Image.URL, "image", "", "the image's https URL")
	f.StringVar(&in.Image.SHA256, "sha256", "", "SHA-256 of the image as served (hex)")
	f.Int64Var(&in.Image.Size, "size", 0, "the image's served length in bytes")
	f.StringVar(&in.Image.Format, "format", "", "raw, raw.gz, raw.xz or raw.zst (default: from the image's first bytes)")
	f.Int64Var(&in.Image.ImageSize, "image-size", 0, "the decompressed length (required for a compressed format)")
	f.StringVar(&in.Target.Serial, "disk-serial", "", "write to the disk with this serial")
	f.StringVar(&in.Target.Path, "disk-path", "", "write to this disk (/dev/…)")
	f.StringVar(&in.After, "after", protocol.AfterKexec, "then: kexec, reboot, poweroff or none")
	f.StringVar(&in.Cmdline, "cmdline", "", "kernel command line for the kexec'd kernel")
	f.StringVar(&in.Pool, "pool", api.DefaultPool, "pool the installed OS joins")
	return cmd
}
