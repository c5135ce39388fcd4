package operator

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/apitype"
	"github.com/better-compute/bcd/internal/cli"
)

// maxEKFile bounds an EK file (a public key or its certificate).
const maxEKFile = 64 << 10

// ekFlags name an endorsement key: a file, or its SHA-256.
type ekFlags struct {
	file, sha256 string
}

func (e *ekFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&e.file, "ek-file", "", "the TPM's endorsement key: a PEM or DER public key (PKIX), or its EK certificate")
	f.StringVar(&e.sha256, "ek-sha256", "", "the SHA-256 (hex) of the endorsement key's PKIX DER, as bcd doctor and join errors show it")
}

// hash is the EK's SHA-256 from the flags.
func (e *ekFlags) hash(what string) (string, error) {
	switch {
	case (e.file == "") == (e.sha256 == ""):
		return "", cli.Usagef("%s: give --ek-file or --ek-sha256", what)
	case e.sha256 != "":
		h := strings.ToLower(strings.TrimSpace(e.sha256))
		if _, err := hex.DecodeString(h); err != nil || len(h) != 64 {
			return "", cli.Usagef("%s: --ek-sha256 %q: want 64 hex digits", what, e.sha256)
		}
		return h, nil
	}
	b, err := os.ReadFile(e.file)
	if err != nil {
		return "", fmt.Errorf("%s: --ek-file: %w", what, err)
	}
	if len(b) > maxEKFile {
		return "", fmt.Errorf("%s: --ek-file %s: over %d bytes", what, e.file, maxEKFile)
	}
	der, err := ekPKIX(b)
	if err != nil {
		return "", fmt.Errorf("%s: --ek-file %s: %w", what, e.file, err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}

// ekPKIX is the PKIX DER of the endorsement key in b: a public key or a
// certificate, PEM or DER.
func ekPKIX(b []byte) ([]byte, error) {
	der := b
	if blk, _ := pem.Decode(b); blk != nil {
		der = blk.Bytes
	}
	if _, err := x509.ParsePKIXPublicKey(der); err == nil {
		return der, nil
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("neither a PKIX public key nor a certificate, in PEM or DER")
	}
	return x509.MarshalPKIXPublicKey(cert.PublicKey)
}

func newMachinesEnrollTPMCmd(af *apiFlags) *cobra.Command {
	var ek ekFlags
	var pool string
	var clear bool
	cmd := &cobra.Command{
		Use:   "enroll-tpm M (--ek-file F | --ek-sha256 H) [--pool P] | enroll-tpm M --clear",
		Short: "Enroll the endorsement key of the machine's TPM: its tpm join enters the machine's site, bound to it",
		Long: `Enroll the endorsement key (EK) of a machine's TPM. A node that joins with bcd join
--attestor tpm and proves that EK joins the machine's site and --pool (default: the
default pool) as the machine's installed OS, and gets its node back after bcd join
--reset. A machine has one EK: enrolling another replaces it. --clear removes it.

Without an enrollment, a tpm join whose claims list one of a registered machine's MACs
waits until better-compute machines approve M, and its EK then becomes the machine's.`,
		Args: cli.ExactArgs(1, "the machine (id, name or MAC)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var h string
			if !clear {
				var err error
				if h, err = ek.hash("machines enroll-tpm"); err != nil {
					return err
				}
			} else if ek.file != "" || ek.sha256 != "" || pool != "" {
				return cli.Usagef("machines enroll-tpm: --clear takes no other flag")
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			var m apitype.MachineInfo
			if clear {
				m, err = c.ClearMachineTPM(cmd.Context(), args[0])
			} else {
				m, err = c.EnrollMachineTPM(cmd.Context(), args[0], apitype.MachineTPMSet{EKSHA256: h, Pool: pool})
			}
			if err != nil {
				return fmt.Errorf("machines enroll-tpm: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), m)
			}
			if clear {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s: no TPM enrolled\n", m.ID)
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "machine %s: TPM endorsement key %s enrolled (site %s, pool %s)\n", m.ID, m.TPMEKSHA256, m.Site,
				orDefaultPool(m.TPMPool))
			return err
		},
	}
	ek.add(cmd)
	cmd.Flags().StringVar(&pool, "pool", "", "pool the machine's tpm join enters (default: the default pool)")
	cmd.Flags().BoolVar(&clear, "clear", false, "remove the machine's enrollment")
	return cmd
}

func orDefaultPool(p string) string {
	if p == "" {
		return apitype.DefaultPool
	}
	return p
}

func newTPMCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "tpm",
		Short: "Enroll TPM endorsement keys for the tpm attestor (an allow-list per site and pool)",
		Long: `The tpm attestor admits a node whose TPM proves an enrolled endorsement key (EK). An EK
is enrolled for a machine (better-compute machines enroll-tpm M …) or, without one, as an
allow-list entry of a site and pool (tpm enroll). tpm list shows both; tpm revoke removes
either: later joins of that EK are refused (a node that joined stays until deleted).`,
	}
	addAPIFlags(cmd, &af)
	var ek ekFlags
	var in apitype.TPMEnrollmentCreate
	enroll := &cobra.Command{
		Use:   "enroll --site S --pool P (--ek-file F | --ek-sha256 H)",
		Short: "Let a TPM's endorsement key join a site and pool, without a machine",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if in.Site == "" || in.Pool == "" {
				return cli.Usagef("tpm enroll: --site and --pool are required")
			}
			h, err := ek.hash("tpm enroll")
			if err != nil {
				return err
			}
			in.EKSHA256 = h
			c, err := af.client()
			if err != nil {
				return err
			}
			e, err := c.EnrollTPM(cmd.Context(), in)
			if err != nil {
				return fmt.Errorf("tpm enroll: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), e)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "TPM endorsement key %s enrolled: site %s, pool %s\n", e.EKSHA256, e.Site, e.Pool)
			return err
		},
	}
	ek.add(enroll)
	enroll.Flags().StringVar(&in.Site, "site", "", "site the node joins (must exist)")
	enroll.Flags().StringVar(&in.Pool, "pool", "", "pool the node joins")

	list := &cobra.Command{
		Use:   "list",
		Short: "List enrolled endorsement keys, a machine's and allow-list entries",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			es, err := c.ListTPMEnrollments(cmd.Context())
			if err != nil {
				return fmt.Errorf("tpm list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), es)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EK SHA-256\tSITE\tPOOL\tMACHINE\tCREATED")
			for _, e := range es {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.EKSHA256, e.Site, orDefaultPool(e.Pool), dash(e.MachineID), stamp(e.CreatedAt))
			}
			return tw.Flush()
		},
	}

	revoke := &cobra.Command{
		Use:   "revoke H",
		Short: "Remove the enrollment of an endorsement key (its SHA-256)",
		Args:  cli.ExactArgs(1, "the endorsement key's SHA-256 (from tpm list)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			e, err := c.RevokeTPMEnrollment(cmd.Context(), strings.ToLower(args[0]))
			if err != nil {
				return fmt.Errorf("tpm revoke: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), e)
			}
			of := ""
			if e.MachineID != "" {
				of = " (machine " + e.MachineID + ")"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "TPM endorsement key %s%s no longer enrolled\n", e.EKSHA256, of)
			return err
		},
	}
	cmd.AddCommand(enroll, list, revoke)
	return cmd
}

func newPoolsCmd() *cobra.Command {
	var af apiFlags
	cmd := &cobra.Command{
		Use:   "pools",
		Short: "Set a pool's policy: the attestors a join into it may use, and its disruption budget",
		Long: `A pool's policy lists the attestors a join into it may use: join-token, provisioned,
discovery, tpm. A join with another attestor is refused with ATTESTOR_NOT_ALLOWED before
anything is written (a token stays unused). A pool without a policy admits every attestor.

It also holds the pool's disruption budget (--max-unavailable): how many of its nodes a
rollout may have updating or offline at once, nodes already offline included. A rollout
created without --max-unavailable keeps each pool within its budget (1 when none is set).`,
	}
	addAPIFlags(cmd, &af)
	var attestors string
	var maxUnavailable int
	set := &cobra.Command{
		Use:   "set-policy P [--join-attestors tpm[,join-token,…]] [--max-unavailable N]",
		Short: "Set the attestors a join into pool P may use ('' allows any) and its disruption budget (0 unsets it); what is not given stays",
		Args:  cli.ExactArgs(1, "the pool"),
		RunE: func(cmd *cobra.Command, args []string) error {
			setAttestors, setBudget := cmd.Flags().Changed("join-attestors"), cmd.Flags().Changed("max-unavailable")
			if !setAttestors && !setBudget {
				return cli.Usagef("pools set-policy: give --join-attestors ('' allows any attestor) or --max-unavailable (0 unsets the budget), or both")
			}
			if maxUnavailable < 0 {
				return cli.Usagef("pools set-policy: --max-unavailable %d: want 1 or more, or 0 to unset", maxUnavailable)
			}
			c, err := af.client()
			if err != nil {
				return err
			}
			// The api sets the whole policy: what the flags do not change is
			// kept from the policy as it is.
			cur, err := c.GetPoolPolicy(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("pools set-policy: %w", err)
			}
			in := apitype.PoolPolicySet{JoinAttestors: cur.JoinAttestors, MaxUnavailable: cur.MaxUnavailable}
			if setAttestors {
				in.JoinAttestors = []string{}
				for _, a := range strings.Split(attestors, ",") {
					if a = strings.TrimSpace(a); a != "" {
						in.JoinAttestors = append(in.JoinAttestors, a)
					}
				}
			}
			if setBudget {
				in.MaxUnavailable = maxUnavailable
			}
			p, err := c.SetPoolPolicy(cmd.Context(), args[0], in)
			if err != nil {
				return fmt.Errorf("pools set-policy: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), p)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "pool %s: %s; disruption budget %s\n", p.Pool, joinAttestors(p), budget(p))
			return err
		},
	}
	set.Flags().StringVar(&attestors, "join-attestors", "", "comma-separated attestors: join-token, provisioned, discovery, tpm")
	set.Flags().IntVar(&maxUnavailable, "max-unavailable", 0, "the pool's disruption budget: nodes a rollout may have updating or offline at once (0 unsets it)")

	show := &cobra.Command{
		Use:   "show P",
		Short: "Show a pool's policy",
		Args:  cli.ExactArgs(1, "the pool"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			p, err := c.GetPoolPolicy(cmd.Context(), args[0])
			if err != nil {
				return fmt.Errorf("pools show: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), p)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "POOL:\t%s\nJOIN ATTESTORS:\t%s\nDISRUPTION BUDGET:\t%s\nUPDATED:\t%s\n", p.Pool, joinAttestors(p), budget(p), stamp(p.UpdatedAt))
			return tw.Flush()
		},
	}

	list := &cobra.Command{
		Use:   "list",
		Short: "List the pools that have a policy",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			ps, err := c.ListPoolPolicies(cmd.Context())
			if err != nil {
				return fmt.Errorf("pools list: %w", err)
			}
			if af.json() {
				return printJSON(cmd.OutOrStdout(), ps)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "POOL\tJOIN ATTESTORS\tMAX UNAVAILABLE\tUPDATED")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Pool, joinAttestors(p), budget(p), stamp(p.UpdatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(set, show, list)
	return cmd
}

// budget is a pool's disruption budget as the tables say it.
func budget(p apitype.PoolPolicy) string {
	if p.MaxUnavailable == 0 {
		return "1 (not set)"
	}
	return strconv.Itoa(p.MaxUnavailable)
}

func joinAttestors(p apitype.PoolPolicy) string {
	if len(p.JoinAttestors) == 0 {
		return "any attestor (no policy)"
	}
	return strings.Join(p.JoinAttestors, ", ")
}
