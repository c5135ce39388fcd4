package operator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/human"
	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/protocol"
)

// envBMCPassword is where machines add and set-bmc read a BMC password
// when --bmc-password-file is not given. Never a flag: argv is public.
const envBMCPassword = "BETTER_COMPUTE_BMC_PASSWORD"

// maxPasswordFile bounds a BMC password file.
const maxPasswordFile = 4 << 10

func newMachinesCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "machines",
		Short: "Register bare-metal machines, boot them, drive their BMCs and deploy them",
		Long: `Machines are the bare-metal servers of a site, known by their MACs. A machine with a
boot mode is in its site agents' boot table (ramdisk: PXE-boot the ramdisk; local: boot
the disk); one with a BMC is in their BMC list, password included. M names a machine by
its id (m_…), its name or one of its MACs.

machines deploy starts a machine's lifecycle, which the control plane runs:
registered → pxe-booting → ramdisk → deploying → installing → provisioned, or failed with
the reason. machines list shows where each machine is; machines events its timeline.`,
	}
	addAPIFlags(cmd, &af)
	cmd.AddCommand(newMachinesAddCmd(&af), newMachinesListCmd(&af), newMachinesShowCmd(&af), newMachinesBootCmd(&af),
		newMachinesApproveCmd(&af), newMachinesEventsCmd(&af), newMachinesDeleteCmd(&af), newMachinesSetBMCCmd(&af),
		newMachinesPowerCmd(&af), newMachinesBootdevCmd(&af), newMachinesInventoryCmd(&af), newMachinesDeployCmd(&af),
		newMachinesCancelCmd(&af), newMachinesFirmwareCmd(&af), newMachinesEnrollTPMCmd(&af))
	return cmd
}

// bmcFlags are the BMC flags of add and set-bmc.
type bmcFlags struct {
	address, user, passwordFile string
	port, cipherSuite           int
}

func (b *bmcFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&b.address, "bmc-address", "", "BMC IP address or host name (no port)")
	f.IntVar(&b.port, "bmc-port", 0, "BMC RMCP port (default 623)")
	f.StringVar(&b.user, "bmc-user", "", "BMC user name")
	f.StringVar(&b.passwordFile, "bmc-password-file", "", "file holding the BMC password (mode 0600; default: $"+envBMCPassword+")")
	f.IntVar(&b.cipherSuite, "bmc-cipher-suite", 0, "IPMI cipher suite: 0 (automatic), 3 or 17")
}

func (b *bmcFlags) given() bool {
	return b.address != "" || b.user != "" || b.passwordFile != "" || b.port != 0 || b.cipherSuite != 0
}

// input is the BMC the flags give; the password is nil when neither the
// file nor the environment has one.
func (b *bmcFlags) input() (*apitype.MachineBMCInput, error) {
	if b.address == "" || b.user == "" {
		return nil, cli.Usagef("--bmc-address and --bmc-user go together")
	}
	in := &apitype.MachineBMCInput{Address: b.address, Port: b.port, Username: b.user, CipherSuite: b.cipherSuite}
	pw, err := bmcPassword(b.passwordFile)
	if err != nil {
		return nil, err
	}
	in.Password = pw
	return in, nil
}

// bmcPassword reads the password from file (its owner's alone), else from
// the environment; nil when neither gives one. Errors never quote it.
func bmcPassword(file string) (*string, error) {
	if file == "" {
		if v, ok := os.LookupEnv(envBMCPassword); ok && v != "" {
			return &v, nil
		}
		return nil, nil
	}
	b, err := secretfile.Read(file, secretfile.Options{Limit: maxPasswordFile, Private: true, What: "the password"})
	if err != nil {
		return nil, fmt.Errorf("--bmc-password-file: %w", err)
	}
	// Only the line end an editor adds: spaces may be part of a password.
	pw := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if pw == "" {
		return nil, fmt.Errorf("--bmc-password-file %s: empty", file)
	}
	return &pw, nil
}

func newMachinesAddCmd(af *apiFlags) *cobra.Command {
	var in apitype.MachineCreate
	var bmc bmcFlags
	var efi bool
	cmd := &cobra.Command{
		Use:   "add --site S --mac M [--mac M2] [--name N] [--efi] [--bmc-address A --bmc-user U [--bmc-password-file F]]",
		Short: "Register a machine by its MACs, with its BMC",
		Long: `Register a machine of a site by its MACs (one or more, each unique across machines), with an
optional name (unique in the site), boot mode and BMC. The BMC password comes from
--bmc-password-file (mode 0600) or $` + envBMCPassword + `, never from the command line; the
control plane keeps it in its store and hands it only to the site's agents.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if in.Site == "" || len(in.MACs) == 0 {
				return cli.Usagef("machines add: --site and at least one --mac are required")
			}
			if efi {
				in.Firmware = "uefi"
			}
			if bmc.given() {
				b, err := bmc.input()
				if err != nil {
					return err
				}
				in.BMC = b
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.CreateMachine(cmd.Context(), in)
			if err != nil {
				return fmt.Errorf("machines add: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s added to site %s (%s)\n", m.ID, m.Site, strings.Join(m.MACs, ", "))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Site, "site", "", "the machine's site")
	f.StringArrayVar(&in.MACs, "mac", nil, "a MAC address of the machine (repeat for each NIC)")
	f.StringVar(&in.Name, "name", "", "a name, unique in the site")
	f.StringVar(&in.BootMode, "boot", "", "boot mode: ramdisk or local (default: none, the site does not answer its PXE requests)")
	f.BoolVar(&efi, "efi", false, "the machine boots UEFI: its BMC is told to PXE-boot it under EFI (default: legacy BIOS)")
	bmc.add(cmd)
	return cmd
}

func newMachinesFirmwareCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "firmware M bios|uefi",
		Short: "Say whether the machine boots legacy BIOS or UEFI (how its BMC is told to PXE-boot it)",
		Args:  cli.ExactArgs(2, "the machine and its firmware (bios or uefi)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] != "bios" && args[1] != "uefi" {
				return cli.Usagef("machines firmware: %q: want bios or uefi", args[1])
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.SetFirmware(cmd.Context(), args[0], args[1])
			if err != nil {
				return fmt.Errorf("machines firmware: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s: firmware %s\n", m.ID, m.Firmware)
			return err
		},
	}
}

func newMachinesListCmd(af *apiFlags) *cobra.Command {
	var site string
	cmd := &cobra.Command{
		Use:   "list [--site S]",
		Short: "List machines with their lifecycle state (and a failed one's reason), last boot step and nodes",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			ms, err := c.ListMachines(cmd.Context(), site)
			if err != nil {
				return fmt.Errorf("machines list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), ms)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSITE\tMAC\tBOOT\tSTATE\tLAST BOOT EVENT\tRAMDISK NODE\tNODE")
			for _, m := range ms {
				mac := "-"
				if len(m.MACs) > 0 {
					mac = m.MACs[0]
					if len(m.MACs) > 1 {
						mac += fmt.Sprintf(" (+%d)", len(m.MACs)-1)
					}
				}
				last := "-"
				if m.LastBootStage != "" {
					last = m.LastBootStage + " " + ago(m.LastBootAt, now)
				}
				state := m.State
				if m.State == apitype.MachineFailed && m.StateReason != "" {
					state += ": " + m.StateReason
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, dash(m.Name), m.Site, mac, dash(m.BootMode), state,
					last, connectedNode(m.RamdiskNode, m.RamdiskConnected), connectedNode(m.Node, m.NodeConnected))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&site, "site", "", "only this site's machines")
	return cmd
}

func connectedNode(id string, connected bool) string {
	switch {
	case id == "":
		return "-"
	case connected:
		return id
	}
	return id + " (offline)"
}

func newMachinesShowCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "show M",
		Short: "Show a machine: MACs, BMC (never its password), nodes, inventory",
		Args:  cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.GetMachine(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("machines show: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			w := cmd.OutOrStdout()
			bmc := "-"
			if m.BMC != nil {
				port := m.BMC.Port
				if port == 0 {
					port = 623
				}
				bmc = fmt.Sprintf("%s port %d user %s, password %s, cipher suite %s", m.BMC.Address, port, m.BMC.Username,
					map[bool]string{true: "set", false: "none"}[m.BMC.HasPassword], cipher(m.BMC.CipherSuite))
			}
			approval := "no"
			switch {
			case m.Approved:
				approval = "yes"
			case m.SiteApproval == "auto":
				approval = "not needed (site approves automatically)"
			}
			state := m.State
			if m.StateReason != "" {
				state += ": " + m.StateReason
			}
			last := "-"
			if m.LastBootStage != "" {
				last = m.LastBootStage + " at " + stamp(m.LastBootAt)
			}
			deployment := "-"
			if d := m.CurrentDeployment; d != nil {
				deployment = fmt.Sprintf("%s (%s), step %s, %d power cycles, %d deploy attempts", d.ID, d.Spec.Image.URL, d.Step,
					d.BootAttempts, d.DeployAttempts)
				if t := d.Spec.Target; t.RootDevice != "" {
					deployment += ", disk by hints " + t.RootDevice
					if t.FirstMatch {
						deployment += " (first match)"
					}
				}
				if !d.Deadline.IsZero() && !d.Finished() {
					deployment += ", step deadline " + stamp(d.Deadline)
				}
				if d.Finished() {
					deployment += ", ended " + d.Outcome + " at " + stamp(d.FinishedAt)
				}
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{
				{"ID", m.ID}, {"NAME", dash(m.Name)}, {"SITE", m.Site}, {"MACS", strings.Join(m.MACs, ", ")},
				{"BOOT", dash(m.BootMode)}, {"FIRMWARE", dash(m.Firmware)}, {"STATE", state + " since " + stamp(m.StateChangedAt)},
				{"DEPLOYMENT", deployment}, {"APPROVED", approval}, {"TPM EK", tpmEK(m)},
				{"BMC", bmc}, {"LAST BOOT EVENT", last},
				{"RAMDISK NODE", connectedNode(m.RamdiskNode, m.RamdiskConnected)}, {"NODE", connectedNode(m.Node, m.NodeConnected)},
				{"CREATED", stamp(m.CreatedAt)}, {"UPDATED", stamp(m.UpdatedAt)}, {"INVENTORY", stamp(m.InventoryAt)},
			} {
				fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
			}
			disk, bootOrder, notes := lastDeployReport(cmd.Context(), c, m)
			if disk != "" {
				fmt.Fprintf(tw, "DISK:\t%s\n", disk)
			}
			if bootOrder != "" {
				fmt.Fprintf(tw, "UEFI BOOT:\t%s\n", bootOrder)
			}
			for _, n := range notes {
				fmt.Fprintf(tw, "NOTE:\t%s\n", n)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(m.Inventory) > 0 {
				var v any
				if json.Unmarshal(m.Inventory, &v) == nil {
					b, _ := json.MarshalIndent(v, "  ", "  ")
					fmt.Fprintf(w, "  %s\n", b)
				}
			}
			return nil
		},
	}
}

func tpmEK(m apitype.MachineInfo) string {
	if m.TPMEKSHA256 == "" {
		return "-"
	}
	return m.TPMEKSHA256 + " (pool " + orDefaultPool(m.TPMPool) + ")"
}

func cipher(n int) string {
	if n == 0 {
		return "automatic"
	}
	return fmt.Sprint(n)
}

func newMachinesBootCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "boot M ramdisk|local|none",
		Short: "Set what the site answers when the machine PXE-boots",
		Long: `Set a machine's boot mode. ramdisk: the site's boot server hands it the ramdisk (with a
boot nonce its ramdisk joins with); local: it is told to boot its disk; none: the site
does not answer its PXE requests at all. The site's agents get the change at once.`,
		Args: cli.ExactArgs(2, "the machine and the boot mode (ramdisk, local or none)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch args[1] {
			case "ramdisk", "local", "none":
			default:
				return cli.Usagef("machines boot: %q: want ramdisk, local or none", args[1])
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.SetBootMode(cmd.Context(), args[0], args[1])
			if err != nil {
				return fmt.Errorf("machines boot: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s boots %s\n", m.ID, args[1])
			return err
		},
	}
}

func newMachinesApproveCmd(af *apiFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "approve M",
		Short: "Let the machine's ramdisk join in a site that approves manually, and its TPM's first tpm join",
		Args:  cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			m, err := c.ApproveMachine(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("machines approve: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s approved\n", m.ID)
			return err
		},
	}
}

func newMachinesEventsCmd(af *apiFlags) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "events M",
		Short: "Show a machine's timeline: states, boot steps, nonces, joins, commands and their progress (-o json for scripts)",
		Args:  cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 || limit > 10000 {
				return cli.Usagef("machines events: --limit %d: want 1 to 10000", limit)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			out, err := c.MachineEvents(cmd.Context(), args[0], limit)
			if err != nil {
				return fmt.Errorf("machines events: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), out)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tKIND\tNODE\tCOMMAND\tDETAIL")
			for _, e := range out.Events {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Time.UTC().Format("2006-01-02T15:04:05.000Z"), e.Kind, dash(e.NodeID),
					dash(e.CommandID), eventDetail(e.Message, e.Data))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 0, "show the latest N events (default 1000)")
	return cmd
}

// eventDetail is an event's message, with a command's progress spelled out.
func eventDetail(msg string, data json.RawMessage) string {
	var d struct {
		Result *struct {
			Power string `json:"power"`
		} `json:"result"`
		Progress *struct {
			Done  int64   `json:"done"`
			Total int64   `json:"total"`
			Unit  string  `json:"unit"`
			Rate  float64 `json:"rate"`
		} `json:"progress"`
	}
	if json.Unmarshal(data, &d) == nil && d.Result != nil && d.Result.Power != "" {
		msg += " (power " + d.Result.Power + ")"
	}
	if d.Progress != nil {
		p := d.Progress
		switch {
		case p.Unit == "bytes" && p.Total > 0 && p.Rate > 0:
			msg += fmt.Sprintf(" (%s of %s, %d%%, %.1f MB/s)", human.Size(p.Done), human.Size(p.Total), p.Done*100/p.Total, p.Rate/1e6)
		case p.Unit == "bytes" && p.Total > 0:
			msg += fmt.Sprintf(" (%s of %s, %d%%)", human.Size(p.Done), human.Size(p.Total), p.Done*100/p.Total)
		case p.Total > 0:
			msg += fmt.Sprintf(" (%d of %d %s)", p.Done, p.Total, p.Unit)
		default:
			msg += fmt.Sprintf(" (%d %s)", p.Done, p.Unit)
		}
	}
	return dash(msg)
}

func newMachinesDeleteCmd(af *apiFlags) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "delete M --yes",
		Short: "Remove a machine, its MACs and its timeline",
		Long: `Remove a machine. Its site's agents drop its boot entry and BMC at once; its nodes are
not deleted (better-compute nodes delete). Without --yes it says what it would delete and
exits 2.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			if !yes {
				m, err := c.GetMachine(cmd.Context(), args[0])
				if err != nil {
					return fmt.Errorf("machines delete: %w", err)
				}
				return cli.Usagef("machines delete: would delete machine %s (%s, site %s, %s); rerun with --yes",
					m.ID, dash(m.Name), m.Site, strings.Join(m.MACs, ", "))
			}
			m, err := c.DeleteMachine(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("machines delete: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s deleted\n", m.ID)
			return err
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete")
	return cmd
}

func newMachinesSetBMCCmd(af *apiFlags) *cobra.Command {
	var bmc bmcFlags
	var clear bool
	cmd := &cobra.Command{
		Use:   "set-bmc M --bmc-address A --bmc-user U [--bmc-password-file F] | --clear",
		Short: "Set or remove a machine's BMC",
		Long: `Set a machine's BMC. Without --bmc-password-file or $` + envBMCPassword + ` the machine keeps the
password it has. --clear removes the BMC.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if clear == bmc.given() {
				return cli.Usagef("machines set-bmc: give the BMC flags or --clear")
			}
			var in *apitype.MachineBMCInput
			if !clear {
				var err error
				if in, err = bmc.input(); err != nil {
					return err
				}
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			var m apitype.MachineInfo
			if clear {
				m, err = c.ClearBMC(cmd.Context(), args[0])
			} else {
				m, err = c.SetBMC(cmd.Context(), args[0], *in)
			}
			if err != nil {
				return fmt.Errorf("machines set-bmc: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			if clear {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s has no BMC\n", m.ID)
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s: BMC %s\n", m.ID, m.BMC.Address)
			return err
		},
	}
	bmc.add(cmd)
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the BMC")
	return cmd
}

// lastDeployReport is what the current deployment's deploy.image reported,
// from the last deploy.done event since the deployment started: the disk it
// wrote and why that one ("/dev/vdb, chosen by hints serial=S2; wiped: lvm2 on
// old partition 2"), and its notes, what went wrong without failing the deploy
// ("cloud-init was not found in the image: …"), and on UEFI how it left the
// boot order.
func lastDeployReport(ctx context.Context, c *client.Client, m apitype.MachineInfo) (disk, bootOrder string, notes []string) {
	d := m.CurrentDeployment
	if d == nil {
		return "", "", nil
	}
	evs, err := c.MachineEvents(ctx, m.ID, 500)
	if err != nil {
		return "", "", []string{"deploy report unavailable: " + err.Error()}
	}
	for _, e := range evs.Events {
		if e.Kind != protocol.MachineEventDeployDone || e.Time.Before(d.CreatedAt) {
			continue
		}
		var data struct {
			Disk      string   `json:"disk"`
			ChosenBy  string   `json:"chosen_by"`
			Wiped     []string `json:"wiped"`
			Warnings  []string `json:"warnings"`
			BootOrder string   `json:"boot_order"`
		}
		if json.Unmarshal(e.Data, &data) != nil {
			continue
		}
		disk, bootOrder, notes = data.Disk, data.BootOrder, data.Warnings
		if data.ChosenBy != "" {
			disk += ", chosen by " + data.ChosenBy
		}
		if len(data.Wiped) > 0 {
			disk += "; wiped: " + strings.Join(data.Wiped, ", ")
		}
	}
	return disk, bootOrder, notes
}
