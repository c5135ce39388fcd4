package operator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
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
func (w *waitFlags) run(cmd *cobra.Command, af *apiFlags, what string, send func(context.Context, *client.Client) (apitype.Command, error),
	done func(io.Writer, apitype.Command) error) error {
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
				func(ctx context.Context, c *client.Client) (apitype.Command, error) {
					return c.Power(ctx, args[0], action)
				},
				func(out io.Writer, got apitype.Command) error {
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
	var in apitype.MachineBootdev
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
				func(ctx context.Context, c *client.Client) (apitype.Command, error) {
					return c.Bootdev(ctx, args[0], in)
				},
				func(out io.Writer, got apitype.Command) error {
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
				func(ctx context.Context, c *client.Client) (apitype.Command, error) { return c.Inventory(ctx, args[0]) },
				func(out io.Writer, got apitype.Command) error {
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
	var in apitype.DeployCreate
	var wait bool
	var timeout time.Duration
	var image, imageURL string
	var keysFile, userDataFile, networkFile string
	cmd := &cobra.Command{
		Use:   "deploy M (--image NAME | --url URL --sha256 H --size N [--format F] [--image-size N]) [--disk-serial S | --disk-path P] [--wait]",
		Short: "Install an image on the machine: PXE boot, ramdisk, deploy, installed OS; prints the deployment id",
		Long: `Start a deployment of the machine, which the control plane runs as a state machine:
pxe-booting (boot entry ramdisk, bmc.bootdev pxe and bmc.power cycle through a site agent,
then the ramdisk's join), ramdisk (inventory), deploying (deploy.image streams the image,
checks its SHA-256 and size, writes it, then writes /etc/bcd/config.toml,
join-encryption.jwk, join-token and node-id into the installed root, 0600 root),
installing (kexec, or reboot with --after reboot) and provisioned (the installed OS joined
as its node and was welcomed; the boot entry flips to local). Each step has a timeout and
bounded retries; a machine that runs out of them is failed with the reason, and can be
deployed again. A machine whose ramdisk is already connected starts at ramdisk.

The image is an entry of the image catalog (--image NAME; better-compute images add), whose
URL, digest, size and format the control plane copies into the deployment, or is given
whole: --url, --sha256, --size (and --format, --image-size). --image URL is --url, as
before the catalog. A catalog name with any of the image's own flags is refused.

A stock image (one that does not ship bcd) gets its node agent from the deploy: --bcd-version V
names a release added with better-compute releases add (or serve --deploy-bcd-version sets a
default); the ramdisk downloads that release's binary for the machine's architecture, checks its
SHA-256, and writes /usr/local/bin/bcd, bcd.service, bcd-join.service and their enable symlinks.
--hostname, --ssh-authorized-keys, --user-data and --network-config write a cloud-init NoCloud
seed (/var/lib/cloud/seed/nocloud: meta-data with instance-id = the node id, local-hostname and
public-keys; user-data; network-config). An image without cloud-init still deploys; machines show
says cloud-init was not found.

It prints the deployment id and returns; with --wait it prints each state as the machine
reaches it and exits 0 once provisioned, 1 when failed. Follow a deployment with
better-compute machines list and better-compute machines events M.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := deployImageFlags(cmd, &in, image, imageURL); err != nil {
				return err
			}
			if err := deploySeedFlags(&in, keysFile, userDataFile, networkFile); err != nil {
				return err
			}
			if in.Target.Serial != "" && in.Target.Path != "" {
				return cli.Usagef("machines deploy: give --disk-serial or --disk-path, not both")
			}
			if wait && timeout <= 0 {
				return cli.Usagef("machines deploy: --timeout %v: want a positive duration", timeout)
			}
			// The api's own checks, so that a bad flag is a usage error here.
			in.Normalize()
			if err := in.Validate(); err != nil {
				return cli.Usagef("machines deploy: %v", err)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			out, err := c.Deploy(cmd.Context(), args[0], in)
			if err != nil {
				return fmt.Errorf("machines deploy: %w", err)
			}
			m := out.Machine
			if !wait {
				if af.json() {
					return printJSON(cmd.OutOrStdout(), out)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "machine %s: deployment %s started: %s (pool %s); follow it with better-compute machines events %s\n",
					m.ID, out.Deployment.ID, stateLine(m.State, m.StateReason), out.Deployment.Spec.Pool, m.ID)
				_, err = fmt.Fprintln(cmd.OutOrStdout(), out.Deployment.ID)
				return err
			}
			return waitDeployment(cmd, af, c, m, out.Deployment.ID, timeout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&image, "image", "", "the image catalog entry to install (or, as --url, the image's URL)")
	f.StringVar(&imageURL, "url", "", "the image's https URL, when it is not in the catalog")
	f.StringVar(&in.Image.SHA256, "sha256", "", "SHA-256 of the image as served (hex)")
	f.Int64Var(&in.Image.Size, "size", 0, "the image's served length in bytes")
	f.StringVar(&in.Image.Format, "format", "", "raw, raw.gz, raw.xz, raw.zst or qcow2 (v2 or v3, compressed clusters allowed, no backing file; converted as it streams) (default: from the image's first bytes)")
	f.Int64Var(&in.Image.ImageSize, "image-size", 0, "the decompressed length (required for raw.gz, raw.xz, raw.zst; for qcow2 the header's virtual size, checked when given)")
	f.StringVar(&in.Target.Serial, "disk-serial", "", "write to the disk with this serial")
	f.StringVar(&in.Target.Path, "disk-path", "", "write to this disk (/dev/…)")
	f.StringVar(&in.After, "after", protocol.AfterKexec, "once the disk is written: kexec or reboot")
	f.StringVar(&in.Cmdline, "cmdline", "", "kernel command line for the kexec'd kernel")
	f.StringVar(&in.Pool, "pool", apitype.DefaultPool, "pool the installed OS joins")
	f.StringVar(&in.BCDVersion, "bcd-version", "", "install this release's bcd (better-compute releases add) into the root, for an image that does not ship it (default: serve --deploy-bcd-version)")
	f.StringVar(&in.Seed.Hostname, "hostname", "", "cloud-init local-hostname (RFC 1123) in the NoCloud seed")
	f.StringVar(&keysFile, "ssh-authorized-keys", "", "file of OpenSSH public keys (one a line) for the seed's public-keys")
	f.StringVar(&userDataFile, "user-data", "", "cloud-init user-data file for the seed (default: a minimal #cloud-config)")
	f.StringVar(&networkFile, "network-config", "", "cloud-init network-config file for the seed")
	f.BoolVar(&wait, "wait", false, "wait until the machine is provisioned (exit 0) or failed (exit 1), printing each state")
	f.DurationVar(&timeout, "timeout", time.Hour, "with --wait: how long to wait")
	return cmd
}

// waitDeployment follows a deployment until it ends, printing each state the
// machine reaches.
func waitDeployment(cmd *cobra.Command, af *apiFlags, c *client.Client, m apitype.MachineInfo, deployment string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
	defer cancel()
	errOut := cmd.ErrOrStderr()
	last := ""
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		if line := stateLine(m.State, m.StateReason); line != last {
			fmt.Fprintf(errOut, "%s %s\n", stamp(m.StateChangedAt), line)
			last = line
		}
		switch {
		case m.Deployment != deployment:
			return fmt.Errorf("machines deploy: machine %s now runs deployment %s, not %s", m.ID, dash(m.Deployment), deployment)
		case m.State == apitype.MachineProvisioned:
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "machine %s provisioned: node %s\n", m.ID, m.Node)
			return err
		case m.State == apitype.MachineFailed:
			return fmt.Errorf("machines deploy: machine %s failed: %s (better-compute machines events %s)", m.ID, m.StateReason, m.ID)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("machines deploy: machine %s is still %s after %v (deployment %s goes on; better-compute machines events %s)",
				m.ID, m.State, timeout, deployment, m.ID)
		case <-t.C:
		}
		got, err := c.GetMachine(ctx, m.ID)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("machines deploy: %w", err)
		}
		m = got
	}
}

// stateLine is a machine's state with its reason.
func stateLine(state, reason string) string {
	if reason == "" {
		return state
	}
	return state + ": " + reason
}

func newMachinesCancelCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel M",
		Short: "Stop the machine's running deployment (the machine is failed: cancelled by operator)",
		Long: `Stop the machine's running deployment: the lifecycle leaves it, the machine is failed with
the reason "cancelled by operator", and the installed OS's unused join token is revoked. A
command an agent already runs is not called back. Deploy it again with machines deploy.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.CancelDeploy(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("machines cancel: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s: deployment %s cancelled; %s\n", m.ID, m.Deployment, stateLine(m.State, m.StateReason))
			return err
		},
	}
}

// deploySeedFlags reads the seed's files into in: the keys checked line by
// line, user-data and network-config as given (their bounds are checked by
// Validate).
func deploySeedFlags(in *apitype.DeployCreate, keysFile, userDataFile, networkFile string) error {
	read := func(flag, name string) (string, error) {
		if name == "" {
			return "", nil
		}
		b, err := readBounded(name, apitype.MaxSeedUserData)
		if err != nil {
			return "", cli.Usagef("machines deploy: %s %s: %v", flag, name, err)
		}
		return string(b), nil
	}
	keys, err := read("--ssh-authorized-keys", keysFile)
	if err != nil {
		return err
	}
	if keysFile != "" {
		if in.Seed.SSHAuthorizedKeys, err = apitype.ParseSSHAuthorizedKeys([]byte(keys)); err != nil {
			return cli.Usagef("machines deploy: --ssh-authorized-keys %s: %v", keysFile, err)
		}
	}
	if in.Seed.UserData, err = read("--user-data", userDataFile); err != nil {
		return err
	}
	if userDataFile != "" && in.Seed.UserData == "" {
		return cli.Usagef("machines deploy: --user-data %s: the file is empty", userDataFile)
	}
	if in.Seed.NetworkConfig, err = read("--network-config", networkFile); err != nil {
		return err
	}
	return nil
}

// readBounded reads a file of at most limit bytes.
func readBounded(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// imageFlags are machines deploy's flags that describe the image itself,
// which a catalog entry already has.
var imageFlags = []string{"url", "sha256", "size", "format", "image-size"}

// deployImageFlags puts the image machines deploy was given into in: a
// catalog entry's name (--image NAME alone), or the image's URL and digest
// (--url, or --image URL as before the catalog, with --sha256 and --size).
// A value of --image with "://" is a URL: a catalog name has neither ':'
// nor '/'.
func deployImageFlags(cmd *cobra.Command, in *apitype.DeployCreate, image, imageURL string) error {
	switch {
	case image != "" && !strings.Contains(image, "://"):
		var given []string
		for _, name := range imageFlags {
			if cmd.Flags().Changed(name) {
				given = append(given, "--"+name)
			}
		}
		if len(given) > 0 {
			return cli.Usagef("machines deploy: --image %s is a catalog entry, which has the image's url, sha256, size and format: "+
				"drop %s, or give --url instead of --image", image, strings.Join(given, ", "))
		}
		in.ImageName = image
		return nil
	case image != "" && imageURL != "":
		return cli.Usagef("machines deploy: --image %s and --url %s: give the image's URL once", protocol.RedactURL(image), protocol.RedactURL(imageURL))
	}
	in.Image.URL = firstNonEmpty(imageURL, image)
	if in.Image.URL == "" || in.Image.SHA256 == "" || in.Image.Size <= 0 {
		return cli.Usagef("machines deploy: give --image NAME (an entry of better-compute images list), or --url, --sha256 and --size")
	}
	return nil
}
