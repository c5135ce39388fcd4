// Command fleetbench is make bench-fleet: a boot storm of N machines (default
// 1,000) played by bcd sim against one real bcd site and one real better-compute
// serve (simlab), optionally with faults (serve and the site agent restarted during
// the run). It prints the results and writes them to -out.
//
// A run prints a progress line every 30 s (the machines by the control plane's
// state and by the stage sim's machine has not finished), and one that does not
// settle within -timeout ends with the stuck machines and where each was. On
// SIGINT or SIGTERM fleetbench stops sim, serve and the site agent (its own
// children, by PID), removes the lab and its temporary directory, prints what
// the run had and exits 1; the children die with it even if it is killed.
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
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/better-compute/bcd/sim"
	"github.com/better-compute/bcd/sim/simlab"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are fleetbench's flags.
type options struct {
	bin          string
	machines     int
	storm        bool
	faults       bool
	out, dir     string
	timeout      time.Duration
	verbose      bool
	stdout, logs io.Writer
}

// grace is how long past its -timeout a run may take (adding the machines
// before it, the timeline checks after it) before fleetbench stops sim.
const grace = 5 * time.Minute

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := options{stdout: stdout, logs: stderr}
	fs.StringVar(&o.bin, "bin", "bin", "directory holding bcd, better-compute and bcx-ipmi (make build)")
	fs.IntVar(&o.machines, "machines", 1000, "machines in the storm")
	fs.BoolVar(&o.storm, "storm", true, "run the storm without faults")
	fs.BoolVar(&o.faults, "faults", true, "run the storm with serve and the site agent restarted during it (after the plain one)")
	fs.StringVar(&o.out, "out", "", "write the report here too")
	fs.StringVar(&o.dir, "dir", "", "the lab's directory (default: a temporary one, removed)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "each run's bound, from the first deploy: a run whose machines have not all settled by then ends with the stuck ones")
	fs.BoolVar(&o.verbose, "v", false, "print the services' and sim's log lines, not only the progress")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.machines <= 0 || !o.storm && !o.faults {
		fmt.Fprintln(stderr, "fleetbench: -machines must be positive, and -storm or -faults set")
		return 2
	}
	// The first SIGINT or SIGTERM stops the runs and cleans up; a second one
	// exits at once (the children still die with this process).
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		fmt.Fprintf(stderr, "fleetbench: %v: stopping sim, serve and the site agent\n", s)
		cancel(fmt.Errorf("signal %v", s))
		if s, ok := <-sigs; ok {
			fmt.Fprintf(stderr, "fleetbench: %v again: exiting now\n", s)
			os.Exit(1)
		}
	}()
	if err := bench(ctx, o); err != nil {
		fmt.Fprintln(stderr, "fleetbench:", err)
		return 1
	}
	return 0
}

func bench(ctx context.Context, o options) error {
	abs, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bcd-fleetbench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	}
	var all strings.Builder
	// say prints a part of the report as soon as it is known and keeps it for -out.
	say := func(format string, args ...any) {
		t := fmt.Sprintf(format, args...)
		fmt.Fprint(o.stdout, t)
		all.WriteString(t)
	}
	// Progress lines go to stderr; with -v every line does.
	logs, progress := io.Writer(nil), o.logs
	if o.verbose {
		logs, progress = o.logs, nil
	}
	say("# make bench-fleet, %s\n# %s, %d CPUs, %s/%s; bcd sim against one bcd site and one better-compute serve (sim/simlab)\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), hostKernel(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	l := &simlab.Lab{Dir: dir, Bin: simlab.Binaries{Bcd: filepath.Join(abs, "bcd"), BetterCompute: filepath.Join(abs, "better-compute"),
		BcxIPMI: filepath.Join(abs, "bcx-ipmi")}, Log: logs, Progress: progress}
	if err := l.Start(ctx, o.machines); err != nil {
		return err
	}
	defer l.Close()
	say("# kernel %d KiB, initrd %d KiB (synthetic), image 8 MiB raw; site agent log level error\n\n", l.KernelSize>>10, l.InitrdSize>>10)

	failed := false
	// one runs sim once, bounded by the run's timeout and its grace, and says
	// what it did.
	one := func(opts simlab.Options, title string) *sim.Result {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, o.timeout+grace)
		defer cancel()
		opts.Machines, opts.Timeout = o.machines, o.timeout
		r, err := l.Run(rctx, opts)
		say("## %s (wall %s)\n", title, time.Since(start).Round(time.Second))
		switch {
		case ctx.Err() != nil:
			say("INTERRUPTED (%v) after %s: what the run had then follows\n", context.Cause(ctx), time.Since(start).Round(time.Second))
			failed = true
		case rctx.Err() != nil:
			say("sim did not end within the run's bound (%s + %s); stopped\n", o.timeout, grace)
			failed = true
		}
		if r != nil {
			say("%s", r)
		}
		if err != nil && !errors.Is(err, simlab.ErrNotOK) || r == nil {
			say("RESULT: %v\n%s", err, l.Diagnostics())
			failed = true
		}
		return r
	}

	if o.storm {
		r := one(simlab.Options{Name: "storm"}, fmt.Sprintf("storm: %d machines deployed at once", o.machines))
		if r != nil && !r.OK() {
			failed = true
		}
		say("\n")
	}
	if o.faults && ctx.Err() == nil {
		fs := []sim.Fault{
			{Name: "restart better-compute serve", After: 20 * time.Second, Do: l.RestartServe},
			{Name: "restart bcd site", After: 50 * time.Second, Do: l.RestartSite},
		}
		r := one(simlab.Options{Name: "faults", Faults: fs},
			fmt.Sprintf("faults: %d machines, serve restarted at +20 s and the site agent at +50 s", o.machines))
		if r != nil {
			say("settled (every machine provisioned or failed with a reason, none stuck): %v\n", r.Settled())
			if len(r.Faults) < len(fs) {
				// The storm settled before a fault's time: it tested nothing.
				say("only %d of the %d faults happened during the run\n", len(r.Faults), len(fs))
				failed = true
			}
			if !r.Settled() {
				failed = true
			}
		}
		say("\n")
	}
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(all.String()), 0o644); err != nil {
			return err
		}
		fmt.Fprintln(o.stdout, "written to", o.out)
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted: %v", context.Cause(ctx))
	case failed:
		return errors.New("a run did not settle")
	}
	return nil
}

func hostKernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "linux"
	}
	return "kernel " + strings.TrimSpace(string(b))
}
