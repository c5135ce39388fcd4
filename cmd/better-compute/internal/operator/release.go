package operator

import (
	"crypto/ecdsa"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/pki"
)

// releaseClock is the clock release commands and install-script check
// expiries against; tests may replace it.
var releaseClock = time.Now

func newReleaseCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Sign and verify release manifests (manifest.json) and make release signing keys",
	}
	cmd.AddCommand(newReleaseKeygenCmd(), newReleaseSignCmd(), newReleaseVerifyCmd())
	return cmd
}

func newReleaseKeygenCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "keygen --out FILE",
		Short: "Make a P-256 release signing key (PKCS#8 PEM, mode 0600) and print its pin",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return cli.Usagef("%s: --out FILE is required", cmd.CommandPath())
			}
			pin, err := pki.GenerateReleaseKey(out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote release signing key %s (mode 0600); its pin, for --release-pins and [update] release_pins:\n", out)
			_, err = fmt.Fprintln(cmd.OutOrStdout(), pin)
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write the private key to (refuses to replace one)")
	return cmd
}

func newReleaseSignCmd() *cobra.Command {
	var (
		product, version, expires string
		sequence                  int64
		keyFiles                  []string
	)
	cmd := &cobra.Command{
		Use:   "sign --product bcd --version V --sequence N --expires RFC3339|DURATION --key K [--key K2 ...] DIST",
		Short: "Write DIST/manifest.json: every file of DIST with its size and SHA-256, signed by each key",
		Args:  cli.ExactArgs(1, "the release directory DIST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := cmd.CommandPath()
			if product == "" || version == "" || expires == "" || len(keyFiles) == 0 || !cmd.Flags().Changed("sequence") {
				return cli.Usagef("%s: --product, --version, --sequence, --expires and at least one --key are required", path)
			}
			if !pki.ValidReleaseVersion(version) {
				return cli.Usagef("INVALID_INPUT: %s: --version %q is not a semantic version", path, version)
			}
			if sequence < 1 {
				return cli.Usagef("INVALID_INPUT: %s: --sequence must be 1 or more", path)
			}
			t := releaseClock()
			exp, err := parseExpiry(expires, t)
			if err != nil {
				return cli.Usagef("INVALID_INPUT: %s: --expires: %w", path, err)
			}
			if !exp.After(t) {
				return cli.Usagef("INVALID_INPUT: %s: --expires %s is not in the future", path, exp.UTC().Format(time.RFC3339))
			}
			var keys []*ecdsa.PrivateKey
			for _, f := range keyFiles {
				k, err := pki.LoadReleaseKey(f)
				if err != nil {
					return err
				}
				keys = append(keys, k)
			}
			dist := args[0]
			arts, err := pki.ArtifactsOf(dist)
			if err != nil {
				return err
			}
			data, err := pki.SignRelease(pki.Release{
				Product: product, Version: version, Sequence: sequence, Expires: exp, Artifacts: arts,
			}, keys)
			if err != nil {
				return err
			}
			// The manifest is public; 0644 like the artifacts beside it.
			target := filepath.Join(dist, pki.ManifestFile)
			if err := pki.WriteFileAtomic(target, data, 0o644); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %s sequence %d, %d artifacts, %d signature(s), expires %s\n",
				target, product, version, sequence, len(arts), len(keys), exp.UTC().Format(time.RFC3339))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&product, "product", "", "product released (bcd)")
	f.StringVar(&version, "version", "", "release version, as in the artifact names (0.1.0)")
	f.Int64Var(&sequence, "sequence", 0, "release sequence: higher than every earlier release of the product")
	f.StringVar(&expires, "expires", "", "when the signatures expire: an RFC 3339 time or a duration from now (720h, 90d)")
	f.StringArrayVar(&keyFiles, "key", nil, "release signing key file (repeat for more signers)")
	return cmd
}

// parseExpiry reads an RFC 3339 time or a duration from now. Days are
// accepted because release lifetimes are counted in them and Go's durations
// stop at hours.
func parseExpiry(s string, from time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseUint(d, 10, 16)
		if err != nil || n == 0 {
			return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
		}
		return from.Add(time.Duration(n) * 24 * time.Hour), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a positive duration", s)
	}
	return from.Add(d), nil
}

func newReleaseVerifyCmd() *cobra.Command {
	var (
		pins, product, version string
		threshold              int
		minSequence            int64
	)
	cmd := &cobra.Command{
		Use:   "verify --pins P1,P2 --threshold N [--product bcd] [--version V] [--min-sequence N] manifest.json",
		Short: "Verify a release manifest's signatures, product, version, expiry and sequence",
		Args:  cli.ExactArgs(1, "the manifest file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := cmd.CommandPath()
			pinList, err := splitPins(pins)
			if err != nil {
				return cli.Usagef("INVALID_INPUT: %s: --pins: %w", path, err)
			}
			if threshold < 1 || threshold > len(pinList) {
				return cli.Usagef("INVALID_INPUT: %s: --threshold %d: want 1 to %d (the number of --pins)", path, threshold, len(pinList))
			}
			data, err := readManifest(args[0])
			if err != nil {
				return err
			}
			r, err := pki.VerifyRelease(data, pki.ReleasePolicy{
				Pins: pinList, Threshold: threshold, Product: product, Version: version,
				MinSequence: minSequence, Now: releaseClock(),
			})
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "OK: %s %s sequence %d, %d artifacts, signed by at least %d pinned key(s), expires %s\n",
				r.Product, r.Version, r.Sequence, len(r.Artifacts), threshold, r.Expires.UTC().Format(time.RFC3339))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&pins, "pins", "", "comma-separated SPKI pins (sha256/...) of the trusted release keys")
	f.IntVar(&threshold, "threshold", 1, "how many distinct pinned keys must have signed")
	f.StringVar(&product, "product", "bcd", "product the release must be for")
	f.StringVar(&version, "version", "", "version the release must be (default: any)")
	f.Int64Var(&minSequence, "min-sequence", 0, "refuse a release whose sequence is lower")
	return cmd
}

// splitPins reads a comma-separated pin list; duplicates are refused since
// they would inflate what a threshold seems to require.
func splitPins(s string) ([]string, error) {
	if s == "" {
		return nil, errors.New("at least one pin is required")
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		if _, err := pki.ParsePin(p); err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, fmt.Errorf("pin %s given twice", p)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}

// readManifest reads a manifest file of bounded size.
func readManifest(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("release manifest: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("release manifest: %w", err)
	}
	if !fi.Mode().IsRegular() || fi.Size() > pki.MaxManifestSize {
		return nil, fmt.Errorf("release manifest %s: not a regular file of at most %d bytes", path, pki.MaxManifestSize)
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil && fi.Size() > 0 {
		return nil, fmt.Errorf("release manifest %s: %w", path, err)
	}
	return data, nil
}
