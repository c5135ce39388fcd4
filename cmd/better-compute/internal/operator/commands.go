package operator

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
)

func newCommandsCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "commands",
		Short: "Read commands sent to nodes",
	}
	addAPIFlags(cmd, &af)
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a command and its latest status",
		Args:  cli.ExactArgs(1, "the command id (cmd_…)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			out, err := c.GetCommand(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("commands get: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{
				{"ID", out.ID}, {"NODE", out.NodeID}, {"KIND", out.Kind}, {"STATE", out.State},
				{"REASON", dash(out.Reason)}, {"MESSAGE", dash(out.Message)},
				{"PARAMS", dash(string(out.Params))}, {"PROGRESS", dash(string(out.Progress))}, {"RESULT", dash(string(out.Result))},
				{"CREATED", stamp(out.CreatedAt)}, {"SENT", stamp(out.SentAt)}, {"UPDATED", stamp(out.UpdatedAt)},
			} {
				fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(get)
	return cmd
}
