// Command sessionbench is make bench-sessions: N node sessions (default
// 10,000) of agent.Session, bcd node's client, held by one better-compute
// serve, the shipped binary, with serve's memory per session, its CPU while
// the sessions only heartbeat, and whether any dropped (simlab.SessionBench).
// It prints the report and writes it to -out.
//
// sessionbench loadgen is its load generator, which it runs inside the
// bench's network namespace (simlab.RunLoadgen).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/sim/simlab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessionbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "loadgen" {
		return simlab.RunLoadgen(ctx, args[1:], stdin, stdout)
	}
	fs := flag.NewFlagSet("sessionbench", flag.ContinueOnError)
	var (
		bin      = fs.String("bin", "bin", "directory holding better-compute (make build)")
		sessions = fs.Int("sessions", 10000, "node sessions to hold")
		joinW    = fs.Int("join-workers", 8, "token creations and joins in flight")
		connW    = fs.Int("connect-workers", 100, "sessions dialling at once (a slot is freed by its Welcome)")
		loadgens = fs.Int("loadgens", 0, "load generator processes (default: as few as RLIMIT_NOFILE allows)")
		settle   = fs.Duration("settle", 10*time.Second, "wait after serve's restart before its baseline")
		quiet    = fs.Duration("quiet", 20*time.Second, "wait after the last Welcome before the steady window")
		steady   = fs.Duration("steady", 60*time.Second, "the steady window")
		timeout  = fs.Duration("timeout", 90*time.Minute, "the whole run's bound")
		out      = fs.String("out", "", "write the report here too")
		dir      = fs.String("dir", "", "the bench's directory, kept (default: a temporary one, removed)")
		verbose  = fs.Bool("v", true, "print progress to stderr")
	)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sessions <= 0 {
		return errors.New("-sessions must be positive")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	serve, err := filepath.Abs(filepath.Join(*bin, "better-compute"))
	if err != nil {
		return err
	}
	if *dir == "" {
		if *dir, err = os.MkdirTemp("", "bcd-sessionbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(*dir)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	b := &simlab.SessionBench{Dir: *dir, BetterCompute: serve, Loadgen: self, Sessions: *sessions,
		JoinWorkers: *joinW, ConnectWorkers: *connW, Loadgens: *loadgens, Settle: *settle, Quiet: *quiet, Steady: *steady}
	if *verbose {
		b.Log = stderr
	}
	start := time.Now()
	var report strings.Builder
	fmt.Fprintf(&report, "# make bench-sessions, %s\n", start.UTC().Format("2006-01-02 15:04 MST"))
	r, err := b.Run(ctx)
	if r != nil {
		r.Report(&report)
		fmt.Fprintf(&report, "(the whole run: %s)\n", time.Since(start).Round(time.Second))
	}
	if err != nil {
		fmt.Fprintf(&report, "RESULT: %v\n", err)
		fmt.Fprint(stderr, b.Diagnostics())
	}
	io.WriteString(stdout, report.String())
	if *out != "" {
		if werr := os.WriteFile(*out, []byte(report.String()), 0o644); werr != nil {
			return werr
		}
		fmt.Fprintln(stdout, "written to", *out)
	}
	if err != nil {
		return err
	}
	if !r.OK() {
		return errors.New("a check did not hold")
	}
	return nil
}
