package operator

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/protocol"
)

func newNodesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List, cordon, reboot and delete joined nodes",
	}
	addAPIFlags(cmd, &af)

	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			nodes, err := c.ListNodes(cmd.Context())
			if err != nil {
				return fmt.Errorf("nodes list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), nodes)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tROLE\tSITE\tPOOL\tSTATE\tCONNECTED\tVERSION\tUPDATE\tLAST SEEN\tCERT EXPIRES")
			for _, n := range nodes {
				connected, seen := "no", ago(n.LastSeenAt, now)
				if n.Connected {
					connected, seen = "yes", "now"
				}
				expires := "-"
				if !n.CertNotAfter.IsZero() {
					expires = n.CertNotAfter.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.Role, n.Site, n.Pool, nodeState(n), connected,
					dash(n.DaemonVersion), updateColumn(n), seen, expires)
			}
			return tw.Flush()
		},
	}

	var yes bool
	del := &cobra.Command{
		Use:   "delete NODE --yes",
		Short: "Delete a node: its certificate stops working and its session ends",
		Long: `Delete a node. Its identity is revoked: the gateway ends its session and refuses
its certificate, its open commands fail, and a machine with its hardware can then join
as a new node. Without --yes it says what it would delete and exits 2.`,
		Args: cli.ExactArgs(1, "the node id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if !yes {
				n, err := c.GetNode(cmd.Context(), args[0])
				if err != nil {
					return fmt.Errorf("nodes delete: %w", err)
				}
				return cli.Usagef("nodes delete: would delete node %s (role %s, site %s, pool %s, %s): its certificate stops working and it cannot open a session; rerun with --yes",
					n.ID, n.Role, n.Site, n.Pool, nodeState(n))
			}
			n, err := c.DeleteNode(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("nodes delete: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), n)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %s deleted\n", n.ID)
			return err
		},
	}
	del.Flags().BoolVar(&yes, "yes", false, "really delete")

	cordon := func(on bool) *cobra.Command {
		verb := "uncordon"
		short := "Let work be scheduled on a node again"
		if on {
			verb = "cordon"
			short = "Mark a node so nothing new is scheduled on it"
		}
		return &cobra.Command{
			Use:   verb + " NODE",
			Short: short,
			Args:  cli.ExactArgs(1, "the node id"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := af.client()
				if err != nil {
					return err
				}
				n, err := c.Cordon(cmd.Context(), args[0], on)
				if err != nil {
					return fmt.Errorf("nodes %s: %w", verb, err)
				}
				if af.json() {
					return printJSON(cmd.OutOrStdout(), n)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "node %s %sed\n", n.ID, verb)
				return err
			},
		}
	}

	reboot := &cobra.Command{
		Use:   "reboot NODE",
		Short: "Ask a node to reboot (command node.reboot); prints the command id",
		Args:  cli.ExactArgs(1, "the node id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			out, err := c.CreateCommand(cmd.Context(), args[0], apitype.CommandCreate{Kind: protocol.KindNodeReboot})
			if err != nil {
				return fmt.Errorf("nodes reboot: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.ID)
			return err
		},
	}
	var upVersion, upManifest, upURL string
	upgrade := &cobra.Command{
		Use:   "upgrade NODE (--version V | --manifest FILE [--url URL])",
		Short: "Send a node daemon.upgrade now; prints the command id",
		Long: `Send one node a daemon.upgrade now, outside any rollout. With --version the release comes
from releases add (verified under serve's --release-pins) and the binary for the node's arch
from its URL base. With --manifest the control plane checks only the manifest's form and that
it lists the node's bare binary bcd_<version>_linux_<arch>, not its signatures: the node
verifies them under its own [update] release pins and refuses what they do not vouch for.
--url (https) is where the node downloads the binary; the default is
<api url>/downloads/bcd/<version>/linux-<arch>. Follow it with commands get ID.`,
		Args: cli.ExactArgs(1, "the node id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (upVersion == "") == (upManifest == "") {
				return cli.Usagef("nodes upgrade: give --version V or --manifest FILE, one of them")
			}
			if upURL != "" && upManifest == "" {
				return cli.Usagef("nodes upgrade: --url goes with --manifest")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			in := apitype.NodeUpgrade{Version: upVersion, URL: upURL}
			if upManifest != "" {
				data, err := readManifest(upManifest)
				if err != nil {
					return err
				}
				in.Manifest, in.URLBase = string(data), c.Server()
			}
			out, err := c.UpgradeNode(cmd.Context(), args[0], in)
			if err != nil {
				return fmt.Errorf("nodes upgrade: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.ID)
			return err
		},
	}
	uf := upgrade.Flags()
	uf.StringVar(&upVersion, "version", "", "a release added with releases add")
	uf.StringVar(&upManifest, "manifest", "", "a signed manifest.json (its form is checked here, its signatures by the node)")
	uf.StringVar(&upURL, "url", "", "with --manifest: https URL of the node's binary (default <api url>/downloads/bcd/<version>/linux-<arch>)")
	cmd.AddCommand(list, del, cordon(true), cordon(false), reboot, upgrade)
	return cmd
}

func nodeState(n apitype.NodeInfo) string {
	if n.Cordoned {
		return n.State + ",cordoned"
	}
	return n.State
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
