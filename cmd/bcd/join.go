package main

import (
	"os"
	"os/signal"
	"regexp"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/agent/join"
	"github.com/better-compute/bcd/agent/nodekey"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/protocol"
)

// joinHooks lets tests shorten the join's retries; the binary leaves it zero.
var joinHooks func(*join.Options)

func newJoinCmd() *cobra.Command {
	var o join.Options
	cmd := &cobra.Command{
		Use:   "join",
		Short: "Join this machine to the fleet (token from BCD_JOIN_TOKEN, standard input or --token-file)",
		Long: `bcd join makes the node key, seals the join token to the pinned join encryption key,
joins through the gateway over TLS pinned to the serving CA, verifies the signed answer
and stores node.key and identity.json under data_dir.

The token comes from BCD_JOIN_TOKEN, standard input, or --token-file; never from an
argument. On a machine that has already joined it prints "already joined as <node>"
and exits 0 without reading a token.`,
		Args: joinNoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			logger, err := agent.NewLogger(cmd.ErrOrStderr(), config.Log{Level: "info", Format: "auto"})
			if err != nil {
				return err
			}
			o.FakeHW = buildmode.FakeHW
			// One Host for the key and the evidence: a tpm join's node key
			// must be in the TPM that certifies it.
			host := &nodekey.Host{Logger: logger, RequireTPM: o.Attestor == protocol.AttestorTPM}
			defer host.Close()
			o.Keys, o.TPM = host, host
			o.Stdin = cmd.InOrStdin()
			o.Stdout = cmd.OutOrStdout()
			o.Logger = logger
			if joinHooks != nil {
				joinHooks(&o)
			}
			return join.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.ConfigPath, "config", config.DefaultPath, "config.toml; join-encryption.jwk is read from (or, bootstrapping, written to) its directory")
	f.StringVar(&o.DataDir, "data-dir", "", "where node.key and identity.json go (default: data_dir from config.toml, else "+config.DefaultDataDir+")")
	f.StringVar(&o.Role, "role", protocol.RoleNode, "role to join as: node or site")
	f.StringVar(&o.Attestor, "attestor", "", "how to prove the machine may join: join-token (default), provisioned (with --node-id) or tpm (the TPM proves the machine; no token)")
	f.StringVar(&o.NodeID, "node-id", "", "the node an installed OS was provisioned as (attestor provisioned; still needs its token)")
	f.StringVar(&o.TokenFile, "token-file", "", "read the token from this file (mode 0600 or 0400, at most 4 KiB); deleted once used")
	f.StringVar(&o.Server, "server", "", "control plane URL: fetch <server>/.well-known/better-compute when config.toml or join-encryption.jwk is missing")
	f.StringVar(&o.Pins.ServingCA, "serving-ca-pin", "", "serving CA pin (sha256/...), required with --server when there is no config.toml")
	f.StringVar(&o.Pins.JoinSigning, "join-signing-pin", "", "join signing key pin (sha256/...), required with --server when there is no config.toml")
	f.StringVar(&o.Pins.JoinEncryption, "join-encryption-pin", "", "join encryption key pin (sha256/...), required with --server when there is no config.toml")
	f.BoolVar(&o.Reset, "reset", false, "move node.key, identity.json and journal.db aside (root only; without --yes only show what would move), then join")
	f.BoolVar(&o.Yes, "yes", false, "confirm --reset")
	cmd.SetFlagErrorFunc(joinFlagError)
	return cmd
}

// joinNoArgs refuses positional arguments with the spec's two lines and without
// echoing them: the usual mistake is a token pasted where it would reach shell
// history and process listings.
func joinNoArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return cli.Usagef("%s: takes no positional arguments\n%s reads the join token from BCD_JOIN_TOKEN or stdin, never from arguments",
			cmd.CommandPath(), cmd.CommandPath())
	}
	return nil
}

var (
	shorthandRE = regexp.MustCompile(`unknown shorthand flag: '(.)' in .*`)
	valueRE     = regexp.MustCompile(`invalid argument ".*" for "(-[^"]*)" flag: .*`)
	syntaxRE    = regexp.MustCompile(`bad flag syntax: .*`)
)

// joinFlagError reports a bad flag without repeating the values around it, for the
// same reason as joinNoArgs: "-t bcjt_…" or "--reset=bcjt_…" would echo a token.
func joinFlagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	msg = shorthandRE.ReplaceAllString(msg, "unknown shorthand flag: '$1'")
	msg = valueRE.ReplaceAllString(msg, `invalid value for "$1"`)
	msg = syntaxRE.ReplaceAllString(msg, "bad flag syntax")
	return cli.Usagef("%s: %s", cmd.CommandPath(), msg)
}
