package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/nodeagent"
)

func newUpdateCmd() *cobra.Command {
	var (
		path, output          string
		clearFailed, rollback bool
	)
	cmd := &cobra.Command{
		Use:   "update",
		Short: "Show self-update's slots, release floor, pending update and failed versions",
		Long: `bcd update shows the slots (bcd-a, bcd-b, current, previous), the release floor, an
update awaiting its first Welcome and the versions that failed, from [update]
slots_dir (run it as root on a helper node, whose records are root's).

--clear-failed empties the failed list, so a version that did not start may be
tried again. --rollback is what bcd-rollback.service runs after an unconfirmed
update crash-looped: it points current back at the previous slot, only while
upgrade.json exists, and exits 1 when there was nothing to roll back (a
confirmed update is never undone).`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return cli.Usagef("bcd update: -o %q: want table or json", output)
			}
			if clearFailed && rollback {
				return cli.Usagef("bcd update: give --clear-failed or --rollback, not both")
			}
			cfg, err := config.Load(path, configOptions())
			if err != nil {
				if config.IsInvalid(err) {
					return cli.Usagef("bcd update: %w", err)
				}
				return fmt.Errorf("bcd update: %w", err)
			}
			m, err := nodeagent.UpdateManager(cfg, path)
			if err != nil {
				return fmt.Errorf("bcd update: %w", err)
			}
			out := cmd.OutOrStdout()
			switch {
			case rollback:
				done, err := m.Rollback()
				if err != nil {
					return fmt.Errorf("bcd update --rollback: %w", err)
				}
				if !done {
					// bcd-rollback.service restarts bcd.service only after exit 0.
					return cli.Exit(1, fmt.Errorf("bcd update --rollback: nothing to roll back: no unconfirmed update is swapped in"))
				}
				fmt.Fprintln(out, "rolled back: current points at the previous slot again")
				return nil
			case clearFailed:
				n, err := m.ClearFailed()
				if err != nil {
					return fmt.Errorf("bcd update --clear-failed: %w", err)
				}
				fmt.Fprintf(out, "cleared %d failed version(s)\n", n)
				return nil
			}
			st, err := m.Status()
			if err != nil {
				return fmt.Errorf("bcd update: %w", err)
			}
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return nodeagent.WriteUpdateStatus(out, st)
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "config", config.DefaultPath, "config.toml")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.BoolVar(&clearFailed, "clear-failed", false, "forget the versions that failed, so they may be tried again")
	f.BoolVar(&rollback, "rollback", false, "restore the previous slot of an unconfirmed update (bcd-rollback.service)")
	return cmd
}
