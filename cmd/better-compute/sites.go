package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
)

func newSitesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "sites",
		Short: "Create and list sites (join tokens name one)",
	}
	addAPIFlags(cmd, &af)
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a site",
		Args:  cli.ExactArgs(1, "the site name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			s, err := c.CreateSite(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("sites create: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), s)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "site %s created\n", s.Name)
			return err
		},
	}
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
			fmt.Fprintln(tw, "NAME\tCREATED")
			for _, s := range sites {
				fmt.Fprintf(tw, "%s\t%s\n", s.Name, stamp(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(create, list)
	return cmd
}
