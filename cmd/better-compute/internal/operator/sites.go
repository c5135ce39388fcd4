package operator

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/protocol"
)

func newSitesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "sites",
		Short: "Create and list sites (join tokens name one)",
	}
	addAPIFlags(cmd, &af)
	var approve string
	create := &cobra.Command{
		Use:   "create NAME [--approve auto|manual]",
		Short: "Create a site",
		Long: `Create a site. --approve says whether a machine's ramdisk joins on the boot nonce its site
agent minted (auto, the default) or waits until an operator runs machines approve (manual).`,
		Args: cli.ExactArgs(1, "the site name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if approve != apitype.ApprovalAuto && approve != apitype.ApprovalManual {
				return cli.Usagef("sites create: --approve %q: want auto or manual", approve)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSiteWith(cmd.Context(), apitype.SiteCreate{Name: args[0], Approval: approve})
			if err != nil {
				return fmt.Errorf("sites create: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), s)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "site %s created (approval %s)\n", s.Name, s.Approval)
			return err
		},
	}
	create.Flags().StringVar(&approve, "approve", apitype.ApprovalAuto, "auto or manual: how a machine's ramdisk is let in")
	list := &cobra.Command{
		Use:   "list",
		Short: "List sites",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			sites, err := c.ListSites(cmd.Context())
			if err != nil {
				return fmt.Errorf("sites list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), sites)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tAPPROVAL\tHTTP PROXY\tSPEC\tCREATED")
			for _, s := range sites {
				proxy := "-"
				if s.HTTPProxy != nil {
					proxy = s.HTTPProxy.Listen
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", s.Name, s.Approval, proxy, s.SpecRevision, stamp(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	var proxy protocol.HTTPProxySection
	var clearProxy bool
	setProxy := &cobra.Command{
		Use:   "set-proxy NAME --listen IP:PORT [--allow HOST:PORT]... | --clear",
		Short: "Run an HTTP proxy for the site's boot network on its site agents",
		Long: `Have the site's agents run an HTTP proxy on the provisioning network (site.httpProxy):
machines there reach the gateway and image servers only through it, and it forwards only
to the --allow destinations and the gateway's host:port, which is always allowed.
--clear removes it.`,
		Args: cli.ExactArgs(1, "the site name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if clearProxy == (proxy.Listen != "") || clearProxy && len(proxy.Allow) > 0 {
				return cli.Usagef("sites set-proxy: give --listen (and --allow), or --clear")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			p := &proxy
			if clearProxy {
				p = nil
			}
			s, err := c.SetSiteHTTPProxy(cmd.Context(), args[0], p)
			if err != nil {
				return fmt.Errorf("sites set-proxy: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), s)
			}
			if s.HTTPProxy == nil {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "site %s: no HTTP proxy\n", s.Name)
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "site %s: HTTP proxy on %s (spec revision %d)\n", s.Name, s.HTTPProxy.Listen, s.SpecRevision)
			return err
		},
	}
	setProxy.Flags().StringVar(&proxy.Listen, "listen", "", "IP:PORT the site agent listens on, on the boot network")
	setProxy.Flags().StringArrayVar(&proxy.Allow, "allow", nil, "a HOST:PORT the proxy forwards to (repeat); the gateway's is added")
	setProxy.Flags().BoolVar(&clearProxy, "clear", false, "remove the proxy")
	cmd.AddCommand(create, list, setProxy)
	return cmd
}
