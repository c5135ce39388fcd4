package operator

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/controlplane/client"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/internal/secretfile"
	"github.com/better-compute/bcd/pki"
)

// Environment the api commands read.
const (
	envServer = "BETTER_COMPUTE_SERVER"
	envToken  = "BETTER_COMPUTE_TOKEN"
	envPKI    = "BETTER_COMPUTE_PKI"
)

const defaultServer = "https://127.0.0.1:8443"

// maxTokenFile bounds the operator token file.
const maxTokenFile = 4 << 10

// apiFlags are what every command that talks to the api takes. The operator
// token never comes from argv: argv ends up in shell history and ps.
type apiFlags struct {
	server    string
	tokenFile string
	pkiDir    string
	caFile    string
	output    string
}

func addAPIFlags(cmd *cobra.Command, f *apiFlags) {
	p := cmd.PersistentFlags()
	p.StringVar(&f.server, "server", "", "control plane api URL (default $"+envServer+", else "+defaultServer+")")
	p.StringVar(&f.tokenFile, "token-file", "", "file holding the operator token (default: $"+envToken+")")
	p.StringVar(&f.pkiDir, "pki", "", "trust the api's serving CA from this PKI bundle's public.json (default $"+envPKI+")")
	p.StringVar(&f.caFile, "ca-file", "", "trust the api's certificate chain from this PEM file")
	p.StringVarP(&f.output, "output", "o", "table", "output format: table or json")
}

// client builds the api client from the flags and environment.
func (f *apiFlags) client() (*client.Client, error) {
	if f.output != "table" && f.output != "json" {
		return nil, cli.Usagef("--output %q: want table or json", f.output)
	}
	server := firstNonEmpty(f.server, os.Getenv(envServer), defaultServer)
	tok, err := f.operatorToken()
	if err != nil {
		return nil, err
	}
	roots, err := f.roots()
	if err != nil {
		return nil, err
	}
	c, err := client.New(server, tok, roots)
	if err != nil {
		return nil, cli.Usagef("--server: %v", err)
	}
	return c, nil
}

func (f *apiFlags) operatorToken() (string, error) {
	if f.tokenFile == "" {
		tok := strings.TrimSpace(os.Getenv(envToken))
		if tok == "" {
			return "", cli.Usagef("no operator token: set %s or give --token-file (the token serve printed or wrote at its first start)", envToken)
		}
		return tok, nil
	}
	b, err := secretfile.Read(f.tokenFile, secretfile.Options{Limit: maxTokenFile, Private: true, What: "the operator token"})
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--token-file %s: empty", f.tokenFile)
	}
	return tok, nil
}

// roots is the CA pool the api is trusted under: --ca-file, --pki (or
// $BETTER_COMPUTE_PKI), else nil for the system roots.
func (f *apiFlags) roots() (*x509.CertPool, error) {
	if f.caFile != "" && f.pkiDir != "" {
		return nil, cli.Usagef("give --pki or --ca-file, not both")
	}
	if f.caFile != "" {
		b, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", f.caFile)
		}
		return pool, nil
	}
	dir := firstNonEmpty(f.pkiDir, os.Getenv(envPKI))
	if dir == "" {
		return nil, nil
	}
	pub, err := pki.LoadPublic(dir)
	if err != nil {
		return nil, fmt.Errorf("--pki: %w", err)
	}
	return pub.ServingCAPool(), nil
}

func (f *apiFlags) json() bool { return f.output == "json" }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// stamp formats a time for a table: UTC to the second, "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

// ago is how long ago t was, coarsely.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}
