// Command fleetbench is make bench-fleet: a boot storm of N machines (default
// 1,000) played by bcd sim against one real bcd site and one real better-compute
// serve (simlab), optionally with faults (serve and the site agent restarted during
// the run). It prints the results and writes them to -out.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/better-compute/bcd/sim"
	"github.com/better-compute/bcd/sim/simlab"
)

func main() {
	var (
		bin      = flag.String("bin", "bin", "directory holding bcd, better-compute and bcx-ipmi (make build)")
		machines = flag.Int("machines", 1000, "machines in the storm")
		faults   = flag.Bool("faults", true, "also run the storm again with serve and the site agent restarted during it")
		out      = flag.String("out", "", "write the report here too")
		dir      = flag.String("dir", "", "the lab's directory (default: a temporary one, removed)")
		timeout  = flag.Duration("timeout", 25*time.Minute, "each run's bound")
		verbose  = flag.Bool("v", false, "print the services' and sim's progress")
	)
	flag.Parse()
	if *machines <= 0 {
		fmt.Fprintln(os.Stderr, "fleetbench: -machines must be positive")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *bin, *machines, *faults, *out, *dir, *timeout, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "fleetbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, bin string, n int, faults bool, out, dir string, timeout time.Duration, verbose bool) error {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return err
	}
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
		fmt.Print(t)
		all.WriteString(t)
	}
	var progress io.Writer = io.Discard
	if verbose {
		progress = os.Stderr
	}
	say("# make bench-fleet, %s\n# %s, %d CPUs, %s/%s; bcd sim against one bcd site and one better-compute serve (sim/simlab)\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), hostKernel(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH)
	l := &simlab.Lab{Dir: dir, Bin: simlab.Binaries{Bcd: filepath.Join(abs, "bcd"), BetterCompute: filepath.Join(abs, "better-compute"),
		BcxIPMI: filepath.Join(abs, "bcx-ipmi")}, Log: progress}
	if err := l.Start(ctx, n); err != nil {
		return err
	}
	defer l.Close()
	say("# kernel %d KiB, initrd %d KiB (synthetic), image 8 MiB raw; site agent log level error\n\n", l.KernelSize>>10, l.InitrdSize>>10)

	failed := false
	start := time.Now()
	r, err := l.Run(ctx, simlab.Options{Machines: n, Name: "storm", Timeout: timeout})
	say("## storm: %d machines deployed at once (wall %s)\n", n, time.Since(start).Round(time.Second))
	if r != nil {
		say("%s\n", r)
	}
	if err != nil {
		say("RESULT: %v\n%s\n", err, l.Diagnostics())
		failed = true
	}

	if faults {
		start = time.Now()
		fs := []sim.Fault{
			{Name: "restart better-compute serve", After: 20 * time.Second, Do: l.RestartServe},
			{Name: "restart bcd site", After: 50 * time.Second, Do: l.RestartSite},
		}
		r, err := l.Run(ctx, simlab.Options{Machines: n, Name: "faults", Timeout: timeout, Faults: fs})
		say("## faults: %d machines, serve restarted at +20 s and the site agent at +50 s (wall %s)\n", n, time.Since(start).Round(time.Second))
		if r != nil {
			say("%s", r)
			say("settled (every machine provisioned or failed with a reason, none stuck): %v\n", r.Settled())
			if len(r.Faults) < len(fs) {
				// The storm settled before a fault's time: it tested nothing.
				say("only %d of the %d faults happened during the run\n", len(r.Faults), len(fs))
				failed = true
			}
			say("\n")
			if !r.Settled() {
				failed = true
			}
		} else {
			say("RESULT: %v\n%s\n", err, l.Diagnostics())
			failed = true
		}
	}
	if out != "" {
		if err := os.WriteFile(out, []byte(all.String()), 0o644); err != nil {
			return err
		}
		fmt.Println("written to", out)
	}
	if failed {
		return fmt.Errorf("a run did not settle")
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
