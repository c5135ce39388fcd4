package ramdisk

import (
	"github.com/better-compute/bcd/internal/efiboot"
	"github.com/u-root/u-root/pkg/efivarfs"

	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/ramdisk/kmod"
	"github.com/better-compute/bcd/ramdisk/netup"
)

// mountSpec is one filesystem the ramdisk needs.
type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

// mounts are what bcd ramdisk needs mounted. u-root's init mounts all of them; a
// different init may not, so each missing one is mounted here.
var mounts = []mountSpec{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
}

// EnsureProc mounts /proc when it is not mounted, so that /proc/cmdline can be read
// before anything else runs. On a machine with /proc it does nothing.
func EnsureProc() error {
	if _, err := os.Stat("/proc/self/mounts"); err == nil {
		return nil
	}
	m := mounts[0]
	if err := os.MkdirAll(m.target, 0o555); err != nil {
		return fmt.Errorf("mount %s: %w", m.target, err)
	}
	if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
		return fmt.Errorf("mount %s: %w", m.target, err)
	}
	return nil
}

// mountMissing mounts each of mounts that /proc/self/mounts does not list.
func mountMissing(log *slog.Logger) error {
	if err := EnsureProc(); err != nil {
		return err
	}
	have := map[string]bool{}
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) >= 2 {
			have[fl[1]] = true
		}
	}
	f.Close()
	var errs []error
	for _, m := range mounts {
		if have[m.target] {
			continue
		}
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			errs = append(errs, fmt.Errorf("mount %s: %w", m.target, err))
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil {
			errs = append(errs, fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err))
			continue
		}
		log.Info("mounted", "fstype", m.fstype, "target", m.target)
	}
	return errors.Join(errs...)
}

// HostSystem is the real machine the ramdisk runs on: it mounts what is missing, loads
// kernel modules by modalias, and brings the network up with DHCP.
type HostSystem struct {
	// ModulesDir is /lib/modules/<release>; "" is the running kernel's.
	ModulesDir string
	// ExtraModules load whatever the hardware: the filesystems deploy reads.
	// nil is ext4 and vfat (with their softdeps).
	ExtraModules []string
	// Net bounds the DHCP bring-up.
	Net netup.Config
}

// Prepare mounts what is missing and loads the hardware's kernel modules. A kernel
// without modules for this release is only worth a warning: its drivers may all be
// built in.
func (m *HostSystem) Prepare(ctx context.Context, log *slog.Logger) error {
	if err := mountMissing(log); err != nil {
		log.Warn("could not mount everything the ramdisk expects", "error", err.Error())
	}
	// Last, on every return: a built-in efivarfs needs no module index.
	defer mountEFIVars(log)
	dir := m.ModulesDir
	if dir == "" {
		rel, err := kmod.Release()
		if err != nil {
			return err
		}
		dir = filepath.Join("/lib/modules", rel)
	}
	ix, err := kmod.LoadIndex(dir)
	if err != nil {
		log.Warn("no kernel module index; relying on built-in drivers", "dir", dir, "error", err.Error())
		return nil
	}
	extra := m.ExtraModules
	if extra == nil {
		extra = []string{"ext4", "vfat"}
		if efiboot.Booted() {
			// Debian builds efivarfs as a module: a deploy writes the boot order through it.
			extra = append(extra, "efivarfs")
		}
	}
	start := time.Now()
	p := &kmod.Prober{Index: ix, Extra: extra, Log: log}
	rep, err := p.Run(ctx)
	log.Info("kernel modules loaded", "loaded", rep.Loaded, "failed", len(rep.Failed), "devices", rep.Devices,
		"unclaimed_devices", rep.Unclaimed, "rounds", rep.Rounds, "ms", time.Since(start).Milliseconds())
	return err
}

// Network runs DHCP on every NIC with a link and returns once one has an address.
func (m *HostSystem) Network(ctx context.Context, lg *slog.Logger) error {
	// u-root's dhclient logs with the standard logger: keep its lines, as JSON
	// debug records, instead of letting them interleave raw on the console.
	log.SetFlags(0)
	log.SetOutput(stdLogWriter{log: lg, source: "dhclient"})
	cfg := m.Net
	cfg.Log = lg
	nics, err := netup.Up(ctx, cfg)
	for _, n := range nics {
		if n.Addr == "" && n.Carrier {
			lg.Warn("network interface has a link but no address", "nic", n.Name, "mac", n.MAC, "error", n.Err)
		}
	}
	return err
}

// mountEFIVars mounts efivarfs on a UEFI machine, once its module is loaded.
func mountEFIVars(log *slog.Logger) {
	if !efiboot.Booted() {
		return
	}
	if _, err := efiboot.Open("", false); err == nil {
		return
	}
	if err := unix.Mount("efivarfs", efivarfs.DefaultVarFS, "efivarfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		log.Warn("could not mount efivarfs: a deploy cannot keep the UEFI boot order", "error", err.Error())
		return
	}
	log.Info("mounted", "fstype", "efivarfs", "target", efivarfs.DefaultVarFS)
}

// UEFIVars opens the firmware's boot variables for a deploy: nil, nil on BIOS.
func UEFIVars() (efivarfs.EFIVar, error) {
	if !efiboot.Booted() {
		return nil, nil
	}
	return efiboot.Open("", false)
}
