package testbed

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Firmware a VM boots with.
const (
	BIOS = "bios" // SeaBIOS with QEMU's iPXE option ROM
	UEFI = "uefi" // OVMF, q35
)

// OVMF files from Debian's ovmf package.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// VMConfig describes one VM. Zero values mean: BIOS, 512 MiB, no NIC, no disk.
type VMConfig struct {
	Name     string
	Dir      string // state: serial.log, qmp.sock, pid, OVMF vars; created if missing
	Firmware string // BIOS or UEFI
	MemoryMB int
	// Tap puts the VM's only NIC (virtio-net) on that tap, with MAC. Without a tap the
	// VM gets -nic none, so QEMU adds no user-mode NIC that could reach outside.
	Tap string
	MAC string
	// Kernel, Initrd and Append boot a kernel directly instead of firmware's boot order.
	Kernel, Initrd, Append string
	// Disk is a raw image attached as virtio-blk.
	Disk string
	// PXEFirst boots from the NIC before the disk.
	PXEFirst bool
	// NVRAMBootOrder gives neither device a bootindex, so OVMF keeps the
	// BootOrder in its variables (with a bootindex it re-sorts BootOrder at every
	// boot) and PXEFirst changes nothing: a machine whose BMC cannot set the boot
	// device, whose firmware boots what its NVRAM says.
	NVRAMBootOrder bool
	// NoNICROM leaves the NIC without QEMU's iPXE option ROM, so the firmware's own
	// PXE client boots (OVMF's EDK2 PXE, which fetches iPXE over TFTP).
	NoNICROM bool
	// Accel is "tcg" or "kvm"; empty means Accelerator()'s choice.
	Accel string
	// Reboots makes a guest's reboot restart the VM, as a machine without a
	// BMC does; by default QEMU exits (-no-reboot), so that a BMC's power on
	// decides what boots next.
	Reboots bool
	// Extra QEMU arguments.
	Extra []string
}

// VM is a running QEMU process.
type VM struct {
	Config  VMConfig
	Serial  string // path of the serial console log
	QMP     string // path of the QMP socket
	Started time.Time
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// Args returns the QEMU command line for c (without the binary).
func (c VMConfig) Args() ([]string, error) {
	if c.Name == "" || c.Dir == "" {
		return nil, errors.New("testbed: a VM needs a Name and a Dir")
	}
	mem := c.MemoryMB
	if mem == 0 {
		mem = 512
	}
	accel := c.Accel
	if accel == "" {
		accel = Accelerator()
	}
	a := []string{
		"-name", c.Name,
		"-m", fmt.Sprint(mem),
		"-smp", "1",
		"-nographic", // with -vga none, SeaBIOS and iPXE print to the serial console (fw_cfg sercon)
		"-vga", "none",
		"-serial", "file:" + filepath.Join(c.Dir, "serial.log"),
		"-monitor", "none",
		"-qmp", "unix:" + filepath.Join(c.Dir, "qmp.sock") + ",server=on,wait=off",
		"-pidfile", filepath.Join(c.Dir, "qemu.pid"),
		"-device", "virtio-rng-pci",
	}
	if !c.Reboots {
		a = append(a, "-no-reboot")
	}
	if accel == "kvm" {
		a = append(a, "-accel", "kvm", "-cpu", "host")
	} else {
		a = append(a, "-accel", "tcg,thread=multi", "-cpu", "max")
	}
	switch c.Firmware {
	case "", BIOS:
	case UEFI:
		vars := filepath.Join(c.Dir, "OVMF_VARS.fd")
		if _, err := os.Stat(vars); errors.Is(err, os.ErrNotExist) {
			if err := copyFile(ovmfVars, vars); err != nil {
				return nil, err
			}
		}
		a = append(a, "-machine", "q35",
			"-drive", "if=pflash,format=raw,readonly=on,file="+ovmfCode,
			"-drive", "if=pflash,format=raw,file="+vars)
	default:
		return nil, fmt.Errorf("testbed: unknown firmware %q", c.Firmware)
	}
	nicIndex, diskIndex := 2, 1
	if c.PXEFirst {
		nicIndex, diskIndex = 1, 2
	}
	if c.Tap != "" {
		if c.MAC == "" {
			return nil, errors.New("testbed: a VM with a tap needs a MAC")
		}
		rom := ""
		if c.NoNICROM {
			rom = ",romfile="
		}
		index := fmt.Sprintf(",bootindex=%d", nicIndex)
		if c.NVRAMBootOrder {
			index = ""
		}
		a = append(a, "-netdev", "tap,id=n0,ifname="+c.Tap+",script=no,downscript=no",
			"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=%s%s%s", c.MAC, index, rom))
	} else {
		a = append(a, "-nic", "none")
	}
	if c.Disk != "" {
		a = append(a, "-drive", "file="+c.Disk+",if=none,id=d0,format=raw,cache=unsafe",
			"-device", "virtio-blk-pci,drive=d0"+map[bool]string{false: fmt.Sprintf(",bootindex=%d", diskIndex)}[c.NVRAMBootOrder])
	}
	if c.Kernel != "" {
		a = append(a, "-kernel", c.Kernel)
		if c.Initrd != "" {
			a = append(a, "-initrd", c.Initrd)
		}
		if c.Append != "" {
			a = append(a, "-append", c.Append)
		}
	}
	return append(a, c.Extra...), nil
}

// StartVM starts QEMU inside ns (nil: in this namespace, which only makes sense for a
// VM without a NIC).
func StartVM(ns *Netns, c VMConfig) (*VM, error) {
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	args, err := c.Args()
	if err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(c.Dir, "serial.log"))
	var cmd *exec.Cmd
	if ns != nil {
		cmd = ns.Command("qemu-system-x86_64", args...)
	} else {
		cmd = exec.Command("qemu-system-x86_64", args...)
	}
	log, err := os.Create(filepath.Join(c.Dir, "qemu.log"))
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own session: a test's Ctrl-C must not hit QEMU before the test's cleanup can.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	vm := &VM{Config: c, Serial: filepath.Join(c.Dir, "serial.log"), QMP: filepath.Join(c.Dir, "qmp.sock"), cmd: cmd, done: make(chan struct{})}
	vm.Started = time.Now()
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("testbed: start qemu: %w", err)
	}
	go func() {
		vm.waitErr = cmd.Wait()
		log.Close()
		close(vm.done)
	}()
	return vm, nil
}

// PID of the QEMU process (ip netns exec execs it, so it is the child itself).
func (vm *VM) PID() int { return vm.cmd.Process.Pid }

// Exited is closed when QEMU ends.
func (vm *VM) Exited() <-chan struct{} { return vm.done }

// Stop kills QEMU and waits for it.
func (vm *VM) Stop() {
	select {
	case <-vm.done:
		return
	default:
	}
	vm.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-vm.done:
	case <-time.After(5 * time.Second):
		vm.cmd.Process.Kill()
		<-vm.done
	}
}

// WaitConsole waits until the serial console matches re, QEMU exits, or ctx ends. It
// returns the first match.
func (vm *VM) WaitConsole(ctx context.Context, re *regexp.Regexp) (string, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		b, _ := os.ReadFile(vm.Serial)
		if m := re.Find(b); m != nil {
			return string(m), nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("testbed: %s: no console line matching %q: %w", vm.Config.Name, re, ctx.Err())
		case <-vm.done:
			b, _ := os.ReadFile(vm.Serial)
			if m := re.Find(b); m != nil {
				return string(m), nil
			}
			return "", fmt.Errorf("testbed: %s: qemu exited (%v) before a console line matched %q", vm.Config.Name, vm.waitErr, re)
		case <-tick.C:
		}
	}
}

// Tail returns the last n lines of the serial console and of QEMU's own output, for
// a failing test to print.
func (vm *VM) Tail(n int) string {
	var b strings.Builder
	for _, f := range []string{vm.Serial, filepath.Join(vm.Config.Dir, "qemu.log")} {
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", f, n, tailFile(f, n))
	}
	return b.String()
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("testbed: copy %s: %w", src, err)
	}
	return out.Close()
}
