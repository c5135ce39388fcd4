package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/config"
	"github.com/better-compute/bcd/internal/buildmode"
	"github.com/better-compute/bcd/internal/cli"
	"github.com/better-compute/bcd/nodeagent/helper"
)

// helperHooks lets tests change the server before it runs; the binary leaves
// it nil.
var helperHooks func(*helper.Server)

func newHelperCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:   "helper",
		Short: "Run bcd helper: the root half of an unprivileged bcd node",
		Long: `bcd helper runs as root (bcd-helper.service) beside bcd node running as the
[helper] user, and does the few things only root may do for it over the unix socket
[helper] socket: reboot, the self-update swap under its own [update] pins and floor
(with a watchdog that swaps back an update still unconfirmed 30 s after its deadline),
and the TPM node key. It serves only root or the [helper] user running an installed
bcd, and refuses to start on a config.toml, socket directory or slots path anyone but
root could change.`,
		Args: cli.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runHelper(cmd, path)
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	cmd.AddCommand(newHelperCallCmd())
	return cmd
}

func runHelper(cmd *cobra.Command, path string) error {
	if os.Geteuid() != 0 && !buildmode.FakeHW {
		return cli.Exit(1, errors.New("bcd helper runs as root"))
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	cfg, err := config.Load(path, configOptions())
	if err != nil {
		if config.IsInvalid(err) {
			return cli.Usagef("bcd helper: %w", err)
		}
		return cli.Exit(1, fmt.Errorf("bcd helper: %w", err))
	}
	logger, err := agent.NewLogger(cmd.ErrOrStderr(), cfg.LogOrDefault())
	if err != nil {
		return cli.Usagef("bcd helper: %w", err)
	}
	// Before anything touches the update records or arms a watchdog.
	if probs := helper.StartupProblems(cfg, path); len(probs) > 0 {
		return cli.Exit(1, helper.ProblemsError(probs))
	}
	srv, err := helper.NewServer(cfg, path, logger)
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd helper: %w", err))
	}
	if buildmode.FakeHW {
		// A development build never reboots the machine it runs on.
		srv.RebootReady = func() error {
			if os.Getenv(helper.EnvFakeHWRebootFile) == "" {
				return fmt.Errorf("a fakehw bcd helper never reboots the machine, and %s is not set to a file to record the reboot in", helper.EnvFakeHWRebootFile)
			}
			return nil
		}
		srv.Reboot = func() error {
			name := os.Getenv(helper.EnvFakeHWRebootFile)
			if name == "" {
				return fmt.Errorf("%s is not set", helper.EnvFakeHWRebootFile)
			}
			f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(f, "reboot %s\n", time.Now().UTC().Format(time.RFC3339Nano))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			return err
		}
	}
	if helperHooks != nil {
		helperHooks(srv)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err = srv.Run(ctx)
	if errors.Is(err, helper.ErrReExec) {
		stop()
		return cli.Exit(1, fmt.Errorf("bcd helper: %w", srv.ReExec()))
	}
	if err != nil {
		return cli.Exit(1, fmt.Errorf("bcd helper: %w", err))
	}
	return nil
}

// newHelperCallCmd is a diagnostic: one operation on the helper's socket,
// as the node would call it, with the calling process's own credentials.
func newHelperCallCmd() *cobra.Command {
	var path string
	cmd := &cobra.Command{
		Use:    "call <op>",
		Short:  "Diagnostic: send one request (JSON on standard input) to bcd helper and print the answer",
		Hidden: true,
		Args:   cli.ExactArgs(1, "the operation"),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(path, configOptions())
			if err != nil {
				if config.IsInvalid(err) {
					return cli.Usagef("bcd helper call: %w", err)
				}
				return cli.Exit(1, fmt.Errorf("bcd helper call: %w", err))
			}
			body, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), helper.MaxRequest+1))
			if err != nil {
				return cli.Exit(1, fmt.Errorf("bcd helper call: standard input: %w", err))
			}
			body = bytes.TrimSpace(body)
			if len(body) == 0 {
				body = []byte("{}")
			}
			if !json.Valid(body) {
				return cli.Usagef("bcd helper call: standard input is not JSON")
			}
			var out json.RawMessage
			if err := helper.NewClient(cfg.Helper).Call(cmd.Context(), args[0], json.RawMessage(body), &out); err != nil {
				var e *helper.Error
				if errors.As(err, &e) {
					return cli.Exit(1, fmt.Errorf("%s: %s", e.Code, e.Message))
				}
				return cli.Exit(1, fmt.Errorf("bcd helper call: %w", err))
			}
			fmt.Fprintln(cmd.OutOrStdout(), string(out))
			return nil
		},
	}
	cmd.Flags().StringVar(&path, "config", config.DefaultPath, "config.toml")
	return cmd
}
