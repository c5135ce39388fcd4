// Command bcd-lab is `make demo`: it builds the QEMU lab of package testbed — a
// control plane on a management network, a site agent on a provisioning bridge, two
// machines with virtual BMCs (SeaBIOS + iPXE, and OVMF with a TPM) — deploys the
// test OS to both with one CLI command each, lets the control plane drive them to
// provisioned, power-cycles one into its installed disk, prints each machine's
// timeline and a summary, and tears everything down (KEEP=1 leaves it running).
//
// It expects the binaries, the ramdisk and the test OS image that `make demo`
// builds first; see the flags.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/testbed"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bcd-lab:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bcd-lab", flag.ContinueOnError)
	bin := fs.String("bin", "bin", "directory holding bcd, better-compute and bcx-ipmi")
	kernel := fs.String("kernel", ".cache/kernel/current/vmlinuz", "the ramdisk's kernel")
	ramdisk := fs.String("ramdisk", "bin/initramfs.xz", "the ramdisk (make initramfs)")
	image := fs.String("image", "bin/testos.img", "the OS image to deploy")
	dir := fs.String("dir", "", "working directory (default: a new temporary one)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" {
		d, err := os.MkdirTemp("", "bcd-lab-")
		if err != nil {
			return err
		}
		*dir = d
	}
	keep := os.Getenv("KEEP") == "1"
	if err := ensureImage(*image, *kernel, *bin+"/bcd", out); err != nil {
		return err
	}
	f := &testbed.Fleet{
		Dir: *dir, Kernel: *kernel, Ramdisk: *ramdisk, Image: *image, Log: out,
		Bin: testbed.FleetBinaries{Bcd: *bin + "/bcd", BetterCompute: *bin + "/better-compute", BcxIPMI: *bin + "/bcx-ipmi"},
		Machines: []*testbed.FleetMachine{
			{Name: "bios1", Firmware: testbed.BIOS, MAC: "52:54:00:30:00:01"},
			{Name: "uefi1", Firmware: testbed.UEFI, MAC: "52:54:00:30:00:02", TPM: true},
		},
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(out, "== building the lab in %s (accelerator %s)\n", *dir, testbed.Accelerator())
	if err := f.Start(ctx); err != nil {
		return err
	}
	if !keep {
		defer f.Close()
	}
	fmt.Fprintln(out, "== better-compute machines deploy, one command per machine")
	start := time.Now()
	for _, m := range f.Machines {
		id, err := f.Deploy(m)
		if err != nil {
			return fmt.Errorf("%w\n%s", err, f.Diagnostics())
		}
		fmt.Fprintf(out, "%s: deploy started: %s", m.Name, id)
	}
	for _, m := range f.Machines {
		if err := f.WaitState(ctx, m, "provisioned", 30*time.Minute); err != nil {
			return fmt.Errorf("%w\n%s", err, f.Diagnostics())
		}
		fmt.Fprintf(out, "%s: provisioned after %s\n", m.Name, time.Since(start).Round(time.Second))
	}
	if o, err := f.BC("nodes", "list"); err == nil {
		fmt.Fprint(out, o)
	}
	m := f.Machines[0]
	fmt.Fprintf(out, "== better-compute machines power %s cycle: the installed disk boots through the local-boot answer\n", m.Name)
	if o, err := f.BC("machines", "power", m.Name, "cycle"); err != nil {
		return err
	} else {
		fmt.Fprint(out, o)
	}
	if err := f.WaitNodeBack(ctx, m, 15*time.Minute); err != nil {
		return fmt.Errorf("%w\n%s", err, f.Diagnostics())
	}
	for _, m := range f.Machines {
		printTimeline(out, f, m)
	}
	if o, err := f.BC("machines", "list"); err == nil {
		fmt.Fprintln(out, "== summary")
		fmt.Fprint(out, o)
	}
	if keep {
		fmt.Fprintf(out, `== KEEP=1: the lab stays up. Look around:
  ip netns exec %[1]s ... (management network), better-compute with --token-file %[2]s/operator-token --pki %[2]s/pki --server https://10.10.0.1:8443:
    ip netns exec <mgmt ns> bin/better-compute machines list --token-file %[2]s/operator-token --pki %[2]s/pki --server https://10.10.0.1:8443
  serial consoles: %[2]s/bmc/<machine>/vm/serial.log
  logs: %[2]s/logs/
  ipmitool: ip netns exec <site ns> ipmitool -I lanplus -C 3 -H 127.0.0.1 -p 6231 -U admin -P password power status
Ctrl-C tears it down.
`, "bcdmgmt*", *dir)
		<-ctx.Done()
		f.Close()
	}
	return nil
}

// ensureImage builds the test OS image when it is missing or older than bcd.
func ensureImage(image, kernel, bcd string, out io.Writer) error {
	ii, err := os.Stat(image)
	bi, berr := os.Stat(bcd)
	if err == nil && berr == nil && ii.ModTime().After(bi.ModTime()) {
		return nil
	}
	mods, _ := filepath.Glob(filepath.Join(filepath.Dir(kernel), "lib/modules/*"))
	if len(mods) != 1 {
		return fmt.Errorf("no kernel modules beside %s (scripts/fetch-kernel.sh)", kernel)
	}
	fmt.Fprintf(out, "== building the test OS image %s\n", image)
	return testbed.TestOS{Kernel: kernel, ModulesDir: mods[0], Bcd: bcd,
		Cmdline: "console=ttyS0,115200 panic=30 bcd.proxy=" + testbed.ProxyURL}.Build(image)
}

// printTimeline prints a machine's events with their offsets from the first.
func printTimeline(out io.Writer, f *testbed.Fleet, m *testbed.FleetMachine) {
	o, err := f.BC("machines", "events", m.Name, "-o", "json")
	if err != nil {
		fmt.Fprintf(out, "%s: no timeline: %v\n", m.Name, err)
		return
	}
	formatTimeline(out, m.Name+" ("+m.Firmware+")", []byte(o))
}

// formatTimeline renders machines events -o json as offset, kind, message lines.
func formatTimeline(out io.Writer, title string, raw []byte) {
	var timeline struct {
		Events []struct {
			Time    time.Time `json:"time"`
			Kind    string    `json:"kind"`
			Message string    `json:"message"`
		} `json:"events"`
	}
	if err := json.Unmarshal(raw, &timeline); err != nil || len(timeline.Events) == 0 {
		fmt.Fprintf(out, "== timeline of %s\n%s\n", title, raw)
		return
	}
	fmt.Fprintf(out, "== timeline of %s\n", title)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	t0 := timeline.Events[0].Time
	for _, e := range timeline.Events {
		fmt.Fprintf(tw, "+%s\t%s\t%s\n", e.Time.Sub(t0).Round(100*time.Millisecond), e.Kind, strings.TrimSpace(e.Message))
	}
	tw.Flush()
}
