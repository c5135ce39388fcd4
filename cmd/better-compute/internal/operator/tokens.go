package operator

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
)

func newTokensCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "tokens",
		Short: "Create, list and revoke single-use join tokens (bcjt_…)",
	}
	addAPIFlags(cmd, &af)

	var in apitype.TokenCreate
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create --pool P --site S --role node|site",
		Short: "Create a join token; prints only the token on stdout",
		Long: `Create a single-use join token for a pool, site and role. Standard output gets the token
and nothing else, so TOKEN=$(better-compute tokens create …) captures it; the details go
to standard error. The token is shown once: the control plane keeps only its hash.

--node-id binds the token to a node id for the provisioned attestor: an installed OS
joins with it and bcd join --node-id (and gets that id).

--allow-reclaim lets a join whose hardware (TPM EK, system UUID) an existing node
holds take that node over, but only with proof: the old node's key, which bcd join
signs with after bcd join --reset moved it aside. Claims alone are refused
(RECLAIM_NOT_ALLOWED). A node whose TPM the tpm attestor proved is reclaimed only by
the same TPM (bcd join --attestor tpm) or by a token bound to it: --allow-reclaim
--node-id N, the operator's decision for node N, used with bcd join --node-id N.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if in.Pool == "" || in.Site == "" || in.Role == "" {
				return cli.Usagef("tokens create: --pool, --site and --role are required")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			if ttl <= 0 {
				return cli.Usagef("tokens create: --ttl %v: want a positive duration", ttl)
			}
			in.TTLSeconds = int64(ttl / time.Second)
			out, err := c.CreateToken(cmd.Context(), in)
			if err != nil {
				return fmt.Errorf("tokens create: %w", err)
			}
			bound := ""
			if out.NodeID != "" {
				bound = ", bound to node " + out.NodeID
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "join token %s: role %s, pool %s, site %s%s, allow reclaim %v, expires %s (single use)\n",
				out.ID, out.Role, out.Pool, out.Site, bound, out.AllowReclaim, stamp(out.ExpiresAt))
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.Token)
			return err
		},
	}
	cf := create.Flags()
	cf.StringVar(&in.Pool, "pool", "", "pool the node joins")
	cf.StringVar(&in.Site, "site", "", "site the node joins (must exist: better-compute sites create)")
	cf.StringVar(&in.Role, "role", "", "node or site")
	cf.DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token can be used")
	cf.BoolVar(&in.AllowReclaim, "allow-reclaim", false, "let a join of hardware an existing node holds take that node over, with the old node's key as proof (bcd join after --reset); with --node-id, for that node without it")
	cf.StringVar(&in.NodeID, "node-id", "", "bind the token to this node id (provisioned attestor)")

	list := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (never their secrets)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			toks, err := c.ListTokens(cmd.Context())
			if err != nil {
				return fmt.Errorf("tokens list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), toks)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPOOL\tSITE\tROLE\tCREATED\tEXPIRES\tSTATE")
			for _, t := range toks {
				state := t.State
				if state == apitype.TokenUsed && t.UsedBy != "" {
					state += " by " + t.UsedBy
				}
				if t.NodeID != "" {
					state += " (node " + t.NodeID + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, t.Pool, t.Site, t.Role, stamp(t.CreatedAt), stamp(t.ExpiresAt), state)
			}
			return tw.Flush()
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token by its id (jt_…)",
		Args:  cli.ExactArgs(1, "the token id (jt_…, from tokens list)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			t, err := c.RevokeToken(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("tokens revoke: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), t)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "join token %s revoked\n", t.ID)
			return err
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}
