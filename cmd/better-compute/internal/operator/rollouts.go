package operator

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
)

func newReleasesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "releases",
		Short: "Add signed bcd releases to the control plane, for rollouts and nodes upgrade",
	}
	addAPIFlags(cmd, &af)
	var urlBase string
	add := &cobra.Command{
		Use:   "add manifest.json [--url-base URL]",
		Short: "Add a release: its manifest is verified under serve's --release-pins",
		Long: `Add a signed release (manifest.json from better-compute release sign). serve verifies it under
its --release-pins and --release-threshold and refuses it without them. The release's bare
binaries bcd_<version>_linux_{amd64,arm64} are fetched by the nodes from
<url-base>/downloads/bcd/<version>/linux-<arch>; --url-base (https) defaults to the api URL
this command talks to. Adding the same manifest again is not an error; another manifest for
a version already added is ALREADY_EXISTS.`,
		Args: cli.ExactArgs(1, "the manifest file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			data, err := readManifest(args[0])
			if err != nil {
				return err
			}
			base := firstNonEmpty(urlBase, c.Server())
			rel, err := c.AddRelease(cmd.Context(), apitype.ReleaseAdd{Manifest: string(data), URLBase: base})
			if err != nil {
				return fmt.Errorf("releases add: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), rel)
			}
			if !rel.Added {
				fmt.Fprintf(cmd.ErrOrStderr(), "release %s was added before with this manifest; nothing changed\n", rel.Version)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "release %s (sequence %d) added\n", rel.Version, rel.Sequence)
			return err
		},
	}
	add.Flags().StringVar(&urlBase, "url-base", "", "https URL the binaries are served below (<url-base>/downloads/bcd/<version>/linux-<arch>; default: the api URL)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the releases added, highest sequence first",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			rels, err := c.ListReleases(cmd.Context())
			if err != nil {
				return fmt.Errorf("releases list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), rels)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tSEQUENCE\tEXPIRES\tARCHES\tURL BASE\tADDED")
			for _, r := range rels {
				var arches []string
				for _, b := range r.Binaries {
					arches = append(arches, b.Arch)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Version, r.Sequence, stamp(r.Expires), strings.Join(arches, ","), r.URLBase, stamp(r.AddedAt))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(add, list)
	return cmd
}

// parseWaves reads --waves: comma-separated percentages.
func parseWaves(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q is not a percentage", f)
		}
		out = append(out, v)
	}
	return out, nil
}

func newRolloutsCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "rollouts",
		Short: "Roll a release out to the fleet wave by wave, and watch, pause, resume or abort it",
	}
	addAPIFlags(cmd, &af)
	var (
		in             apitype.RolloutCreate
		waves, timeout string
		threshold      int
	)
	create := &cobra.Command{
		Use:   "create --version V [--pool P] [--site S] [--role node|site] [--waves 1,10,50,100] [--max-unavailable N] [--failure-threshold PCT] [--wave-timeout D]",
		Short: "Start a rollout of a release added with releases add; prints its id",
		Long: `Start a rollout: the nodes of --role (node) in --pool and --site (default any) get the
release as their daemon section wave by wave. --waves are cumulative percentages of them,
rising, the last 100; each wave has at least one node, and the next starts only when every
node of the one before succeeded or failed. In each pool at most --max-unavailable nodes
(default 1) are updating or offline at once. A node succeeds when it rejoins reporting the
version; it fails when its daemon section or daemon.upgrade reports FAILED or UNSUPPORTED,
or after --wave-timeout. When more than --failure-threshold percent of the finished nodes
failed, the rollout pauses with the reason. Only one running or paused rollout may cover a
node at a time.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if in.Version == "" {
				return cli.Usagef("rollouts create: --version is required")
			}
			if in.Role != "node" && in.Role != "site" {
				return cli.Usagef("INVALID_INPUT: rollouts create: --role %q: want node or site", in.Role)
			}
			w, err := parseWaves(waves)
			if err != nil {
				return cli.Usagef("INVALID_INPUT: rollouts create: --waves: %v", err)
			}
			d, err := time.ParseDuration(timeout)
			if err != nil {
				return cli.Usagef("INVALID_INPUT: rollouts create: --wave-timeout %q: want a duration like 30m", timeout)
			}
			in.Waves, in.WaveTimeout, in.FailureThreshold = w, d.String(), &threshold
			c, err := af.client()
			if err != nil {
				return err
			}
			ro, err := c.CreateRollout(cmd.Context(), in)
			if err != nil {
				return fmt.Errorf("rollouts create: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), ro)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\nrollout of bcd %s to %d node(s) started\n", ro.ID, ro.Version, len(ro.Nodes))
			return err
		},
	}
	f := create.Flags()
	f.StringVar(&in.Version, "version", "", "release to roll out (releases add)")
	f.StringVar(&in.Pool, "pool", "", "only nodes of this pool (default any)")
	f.StringVar(&in.Site, "site", "", "only nodes of this site (default any)")
	f.StringVar(&in.Role, "role", "node", "node or site (site agents)")
	f.StringVar(&waves, "waves", "1,10,50,100", "cumulative percentages of the nodes per wave, rising, ending at 100")
	f.IntVar(&in.MaxUnavailable, "max-unavailable", 0, "nodes of a pool updating or offline at once (default: each pool's disruption budget, pools set-policy --max-unavailable, else 1)")
	f.IntVar(&threshold, "failure-threshold", 10, "pause when more than this percentage of the finished nodes failed")
	f.StringVar(&timeout, "wave-timeout", "30m", "how long a node has to rejoin at the version")

	list := &cobra.Command{
		Use:   "list",
		Short: "List rollouts, newest first",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			rs, err := c.ListRollouts(cmd.Context())
			if err != nil {
				return fmt.Errorf("rollouts list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), rs)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tVERSION\tROLE\tPOOL\tSITE\tSTATE\tCREATED\tREASON")
			for _, r := range rs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Version, r.Role, anyOr(r.Pool), anyOr(r.Site), r.State, stamp(r.CreatedAt), dash(r.Reason))
			}
			return tw.Flush()
		},
	}

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a rollout: its settings, each node's state and the timeline",
		Args:  cli.ExactArgs(1, "the rollout id (ro_…)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			r, err := c.GetRollout(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("rollouts show: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), r)
			}
			w := cmd.OutOrStdout()
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{
				{"ID", r.ID}, {"VERSION", r.Version}, {"ROLE", r.Role}, {"POOL", anyOr(r.Pool)}, {"SITE", anyOr(r.Site)},
				{"WAVES", joinWaves(r.Waves)}, {"MAX UNAVAILABLE", maxUnavailable(r.MaxUnavailable)},
				{"FAILURE THRESHOLD", strconv.Itoa(r.FailureThreshold) + "%"}, {"WAVE TIMEOUT", r.WaveTimeout},
				{"STATE", r.State}, {"REASON", dash(r.Reason)}, {"CREATED", stamp(r.CreatedAt)},
			} {
				fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
			}
			tw.Flush()
			fmt.Fprintln(w)
			tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tPOOL\tWAVE\tSTATE\tSTARTED\tFINISHED\tREASON\tMESSAGE")
			for _, n := range r.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Pool, n.Wave, n.State, stamp(n.StartedAt), stamp(n.FinishedAt), dash(n.Reason), dash(n.Message))
			}
			tw.Flush()
			fmt.Fprintln(w)
			fmt.Fprintln(w, "TIMELINE")
			for _, e := range r.Timeline {
				fmt.Fprintf(w, "%s  %s\n", stamp(e.At), e.Message)
			}
			return nil
		},
	}

	act := func(action, short string) *cobra.Command {
		return &cobra.Command{
			Use:   action + " ID",
			Short: short,
			Args:  cli.ExactArgs(1, "the rollout id (ro_…)"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := af.client()
				if err != nil {
					return err
				}
				r, err := c.ActOnRollout(cmd.Context(), args[0], action)
				if err != nil {
					return fmt.Errorf("rollouts %s: %w", action, err)
				}
				if af.json() {
					return printJSON(cmd.OutOrStdout(), r)
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "rollout %s %s\n", r.ID, r.State)
				return err
			},
		}
	}
	cmd.AddCommand(create, list, show,
		act("pause", "Pause a rollout: no node starts; nodes updating finish"),
		act("resume", "Resume a paused rollout (failed nodes stay failed)"),
		act("abort", "Abort a rollout: no node starts again; nodes updating keep their target"))
	return cmd
}

func anyOr(s string) string {
	if s == "" {
		return "any"
	}
	return s
}

func joinWaves(ws []int) string {
	s := make([]string, len(ws))
	for i, w := range ws {
		s[i] = strconv.Itoa(w)
	}
	return strings.Join(s, ",")
}

// updateColumn is a node's daemon section report for the UPDATE column:
// "SUCCEEDED 0.1.1", "FAILED UpdateFailed", "-" for none.
func updateColumn(n apitype.NodeInfo) string {
	d := n.DaemonSection
	if d == nil {
		return "-"
	}
	switch {
	case d.Reason != "":
		return d.State + " " + d.Reason
	case d.Version != "":
		return d.State + " " + d.Version
	}
	return d.State
}

// maxUnavailable is a rollout's --max-unavailable as show says it: 0 keeps
// each pool within its own disruption budget.
func maxUnavailable(n int) string {
	if n == 0 {
		return "each pool's disruption budget (pools set-policy --max-unavailable; 1 when not set)"
	}
	return strconv.Itoa(n)
}
