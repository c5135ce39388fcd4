package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// VBMC is a virtual BMC for one machine: OpenIPMI's ipmi_sim serving IPMI v2.0 over
// LAN (RMCP+, cipher suite 3) on a namespace's loopback, whose chassis control
// really powers a QEMU VM on and off, resets it and sets the device it boots from.
//
// ipmi_sim runs a chassis program for every chassis command (`<program> <vmdir> get
// power boot`, `set power 0|1`, `set reset 1`, `set shutdown 1`, `set boot
// pxe|default|cdrom|bios`); Start writes that program as a shell script. Power on
// starts swtpm (with TPM) and QEMU, detached, with the command line VMConfig.Args
// gives for the current boot device: pxe boots the NIC first (PXEFirst), anything
// else the disk first. Power off kills QEMU, reset is QMP system_reset, soft off
// QMP system_powerdown. The boot device stays set until changed.
//
// Without a VM the machine is only a power state in a file, for tests of the IPMI
// path that need no guest.
type VBMC struct {
	Name string
	// Dir holds ipmi_sim's configuration and state; created if missing.
	Dir string
	// Port is ipmi_sim's UDP port on 127.0.0.1; 0 means 623.
	Port int
	// Username and Password of the BMC's admin user; empty means admin and
	// password. IPMI allows at most 16 and 20 bytes.
	Username, Password string
	// VM is the machine; nil means a power state in a file. Its Dir is where the
	// chassis program keeps its files (qemu.pid, serial.log, the command lines).
	VM *VMConfig
	// TPM gives the VM a TPM 2.0 from swtpm, started at every power on.
	TPM bool
	// Netns is where ipmi_sim and the VM run; nil means this namespace, which only
	// suits a VM without a NIC.
	Netns *Netns

	proc *Process
}

// sercon makes SeaBIOS print to the serial port, which it does not do by itself
// without -nographic: its fw_cfg file etc/sercon-port holds the port (0x3f8, in
// little-endian). Then the serial log shows which device it booted first.
var sercon = []byte{0xf8, 0x03}

// chassisScript is the chassis program; the VM's directory is its first argument.
const chassisScript = `#!/bin/sh
# chassis_control for ipmi_sim (written by bcd's testbed): $1 is the VM's directory,
# then "get power boot" or "set power 0|1 | reset 1 | shutdown 1 | boot DEV".
d=$1
shift
echo "$(date +%s.%N) $*" >>"$d/calls.log"
vm() { [ -f "$d/qemu-pxe.args" ]; }
running() {
	[ -s "$d/qemu.pid" ] || return 1
	pid=$(cat "$d/qemu.pid")
	[ "$(cat /proc/"$pid"/comm 2>/dev/null)" = qemu-system-x86 ] || return 1
	# A killed QEMU is a zombie until init reaps it: no longer running.
	! grep -q '^State:[[:space:]]*Z' /proc/"$pid"/status 2>/dev/null
}
power() {
	if vm; then
		if running; then echo 1; else echo 0; fi
	else
		cat "$d/power" 2>/dev/null || echo 0
	fi
}
boot() { cat "$d/boot" 2>/dev/null || echo default; }
qmp() {
	printf '{"execute":"qmp_capabilities"}\n{"execute":"%s"}\n' "$1" |
		socat -t 2 - UNIX-CONNECT:"$d/qmp.sock" >>"$d/qmp.log" 2>&1
}
on() {
	if ! vm; then echo 1 >"$d/power"; return 0; fi
	running && return 0
	case $(boot) in
	pxe) args=$d/qemu-pxe.args ;;
	*) args=$d/qemu-disk.args ;;
	esac
	set --
	while IFS= read -r a; do set -- "$@" "$a"; done <"$args"
	if [ -f "$d/tpm" ]; then
		mkdir -p "$d/tpm-state"
		swtpm socket --tpm2 --tpmstate dir="$d/tpm-state" --ctrl type=unixio,path="$d/swtpm.sock" \
			--pid file="$d/swtpm.pid" --daemon >>"$d/swtpm.log" 2>&1
	fi
	[ -f "$d/serial.log" ] && mv "$d/serial.log" "$d/serial.prev.log"
	rm -f "$d/qemu.pid"
	cp "$args" "$d/qemu.args.last"
	setsid qemu-system-x86_64 "$@" </dev/null >>"$d/qemu.log" 2>&1 &
	i=0
	while ! running && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
}
off() {
	if ! vm; then echo 0 >"$d/power"; return 0; fi
	running || return 0
	kill -KILL "$pid"
	i=0
	while running && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	[ -s "$d/swtpm.pid" ] && kill "$(cat "$d/swtpm.pid")" 2>/dev/null
	rm -f "$d/qemu.pid"
}
case $1 in
get)
	shift
	for k in "$@"; do
		case $k in
		power) echo "power:$(power)" ;;
		boot) echo "boot:$(boot)" ;;
		esac
	done
	;;
set)
	shift
	while [ $# -ge 2 ]; do
		case $1 in
		power) if [ "$2" = 1 ]; then on; else off; fi ;;
		reset) if vm && running; then qmp system_reset; fi ;;
		shutdown) if vm && running; then qmp system_powerdown; elif ! vm; then echo 0 >"$d/power"; fi ;;
		boot) echo "$2" >"$d/boot" ;;
		esac
		shift 2
	done
	;;
esac
exit 0
`

func (b *VBMC) port() int {
	if b.Port == 0 {
		return 623
	}
	return b.Port
}

// Addr is the BMC's address in its namespace.
func (b *VBMC) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port()) }

// User returns the BMC's admin user and password.
func (b *VBMC) User() (string, string) {
	u, p := b.Username, b.Password
	if u == "" {
		u = "admin"
	}
	if p == "" {
		p = "password"
	}
	return u, p
}

// vmDir is where the chassis program keeps the machine's files.
func (b *VBMC) vmDir() string {
	if b.VM != nil && b.VM.Dir != "" {
		return b.VM.Dir
	}
	return filepath.Join(b.Dir, "machine")
}

// Start writes the configuration and starts ipmi_sim; it returns once the BMC
// answers.
func (b *VBMC) Start() error {
	if b.Name == "" || b.Dir == "" {
		return errors.New("testbed: a VBMC needs a Name and a Dir")
	}
	user, pass := b.User()
	for _, v := range []string{b.Name, user, pass} {
		if strings.ContainsAny(v, "\"\\\n") || v == "" {
			return fmt.Errorf("testbed: vbmc %s: %q cannot go into lan.conf", b.Name, v)
		}
	}
	vmDir := b.vmDir()
	for _, d := range []string{b.Dir, filepath.Join(b.Dir, "state"), vmDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	if b.VM != nil {
		if err := b.writeArgs(vmDir); err != nil {
			return err
		}
	}
	emu := "mc_setbmc 0x20\n" +
		"mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n" +
		"sel_enable 0x20 1000 0x0a\n" +
		"mc_enable 0x20\n"
	program := filepath.Join(b.Dir, "chassis")
	var auths strings.Builder
	for _, role := range []string{"callback", "user", "operator", "admin"} {
		fmt.Fprintf(&auths, "    allowed_auths_%s none md2 md5 straight\n", role)
	}
	lan := fmt.Sprintf("name \"%s\"\n"+
		"set_working_mc 0x20\n"+
		"  startlan 1\n"+
		"    addr 127.0.0.1 %d\n"+
		"    priv_limit admin\n"+
		"%s"+
		"    guid %032x\n"+
		"  endlan\n"+
		"  chassis_control \"%s %s\"\n"+
		"  user 2 true \"%s\" \"%s\" admin 10 none md2 md5 straight\n",
		b.Name, b.port(), auths.String(), guidFor(b.Name), program, vmDir, user, pass)
	files := []struct {
		path string
		data string
		mode os.FileMode
	}{
		{filepath.Join(b.Dir, "bmc.emu"), emu, 0o644},
		// lan.conf holds the BMC password: the lab's own, but kept private anyway.
		{filepath.Join(b.Dir, "lan.conf"), lan, 0o600},
		{program, chassisScript, 0o755},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, []byte(f.data), f.mode); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	args := []string{"-n", "-c", filepath.Join(b.Dir, "lan.conf"), "-f", filepath.Join(b.Dir, "bmc.emu"), "-s", filepath.Join(b.Dir, "state")}
	var cmd *exec.Cmd
	if b.Netns != nil {
		cmd = b.Netns.Command("ipmi_sim", args...)
	} else {
		cmd = exec.Command("ipmi_sim", args...)
	}
	p, err := StartProcess("ipmi_sim "+b.Name, cmd, filepath.Join(b.Dir, "ipmi_sim.log"))
	if err != nil {
		return err
	}
	b.proc = p
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		if _, err := b.Ipmitool(ctx, "mc", "info"); err == nil {
			return nil
		} else if ctx.Err() != nil {
			b.Stop()
			return fmt.Errorf("testbed: vbmc %s never answered: %v\n%s", b.Name, err, p.Tail(20))
		}
		select {
		case <-p.Exited():
			return fmt.Errorf("testbed: ipmi_sim %s exited: %v\n%s", b.Name, p.Err(), p.Tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeArgs records the VM's two command lines, one argument a line: the NIC
// first and the disk first. Both let a guest reboot reset the VM, as a machine
// would, where VMConfig.Args makes QEMU exit (-no-reboot), and have SeaBIOS print
// on the serial port.
func (b *VBMC) writeArgs(vmDir string) error {
	vm := *b.VM
	vm.Dir = vmDir
	if err := os.WriteFile(filepath.Join(vmDir, "sercon"), sercon, 0o644); err != nil {
		return fmt.Errorf("testbed: %w", err)
	}
	extra := []string{"-action", "reboot=reset"}
	if vm.Firmware == "" || vm.Firmware == BIOS {
		extra = append(extra, "-fw_cfg", "name=etc/sercon-port,file="+filepath.Join(vmDir, "sercon"))
	}
	if b.TPM {
		extra = append(extra, "-chardev", "socket,id=chrtpm,path="+filepath.Join(vmDir, "swtpm.sock"),
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm", "-device", "tpm-tis,tpmdev=tpm0")
		if err := os.WriteFile(filepath.Join(vmDir, "tpm"), nil, 0o644); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	vm.Extra = append(append([]string(nil), vm.Extra...), extra...)
	for _, first := range []struct {
		file string
		pxe  bool
	}{{"qemu-pxe.args", true}, {"qemu-disk.args", false}} {
		vm.PXEFirst = first.pxe
		args, err := vm.Args()
		if err != nil {
			return err
		}
		for _, a := range args {
			if strings.Contains(a, "\n") {
				return fmt.Errorf("testbed: vbmc %s: a QEMU argument holds a newline: %q", b.Name, a)
			}
		}
		if err := os.WriteFile(filepath.Join(vmDir, first.file), []byte(strings.Join(args, "\n")+"\n"), 0o644); err != nil {
			return fmt.Errorf("testbed: %w", err)
		}
	}
	return nil
}

// guidFor gives each BMC a stable GUID of its own.
func guidFor(name string) [16]byte {
	var g [16]byte
	copy(g[:], "bcd-vbmc")
	for i, c := range []byte(name) {
		g[8+i%8] ^= c
	}
	return g
}

// Ipmitool runs ipmitool against the BMC (lanplus, cipher suite 3) in its
// namespace. The password goes through the environment (-E), never argv.
func (b *VBMC) Ipmitool(ctx context.Context, args ...string) (string, error) {
	user, pass := b.User()
	full := append([]string{"-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", strconv.Itoa(b.port()), "-U", user, "-E", "-N", "1", "-R", "2"}, args...)
	var cmd *exec.Cmd
	if b.Netns != nil {
		cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", b.Netns.Name, "ipmitool"}, full...)...)
	} else {
		cmd = exec.CommandContext(ctx, "ipmitool", full...)
	}
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+pass)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("ipmitool %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// QEMUPID returns the VM's QEMU process while it runs.
func (b *VBMC) QEMUPID() (int, bool) {
	raw, err := os.ReadFile(filepath.Join(b.vmDir(), "qemu.pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil || strings.TrimSpace(string(comm)) != "qemu-system-x86" || !ProcessRunning(pid) {
		return 0, false
	}
	return pid, true
}

// ProcessRunning reports whether pid exists and has not exited: a process that
// exited but that init has not reaped yet (a zombie) is not running.
func ProcessRunning(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "State:"); ok {
			return !strings.HasPrefix(strings.TrimSpace(v), "Z")
		}
	}
	return false
}

// QEMUCmdline is the running QEMU's command line, from /proc.
func (b *VBMC) QEMUCmdline() ([]string, error) {
	pid, ok := b.QEMUPID()
	if !ok {
		return nil, fmt.Errorf("testbed: vbmc %s: QEMU is not running", b.Name)
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), nil
}

// BootDevice is the boot device ipmi_sim last set ("default" until one is).
func (b *VBMC) BootDevice() string {
	raw, err := os.ReadFile(filepath.Join(b.vmDir(), "boot"))
	if err != nil {
		return "default"
	}
	return strings.TrimSpace(string(raw))
}

// Calls are the chassis program's invocations so far, one a line.
func (b *VBMC) Calls() string {
	raw, _ := os.ReadFile(filepath.Join(b.vmDir(), "calls.log"))
	return string(raw)
}

// Serial is the path of the running (or last) VM's serial console log.
func (b *VBMC) Serial() string { return filepath.Join(b.vmDir(), "serial.log") }

// WaitSerial waits until the VM's serial console matches re.
func (b *VBMC) WaitSerial(ctx context.Context, re *regexp.Regexp) (string, error) {
	for {
		if raw, err := os.ReadFile(b.Serial()); err == nil {
			if m := re.Find(raw); m != nil {
				return string(m), nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("testbed: vbmc %s: no serial line matching %q: %w", b.Name, re, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Stop powers the VM off and stops ipmi_sim.
func (b *VBMC) Stop() {
	if pid, ok := b.QEMUPID(); ok {
		syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 50; i++ {
			if _, ok := b.QEMUPID(); !ok {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if raw, err := os.ReadFile(filepath.Join(b.vmDir(), "swtpm.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	if b.proc != nil {
		b.proc.Stop(3 * time.Second)
	}
}

// Tail returns the end of the BMC's and the VM's logs, for a failing test.
func (b *VBMC) Tail(n int) string {
	var s strings.Builder
	if b.proc != nil {
		s.WriteString(b.proc.Tail(n))
	}
	for _, f := range []string{"calls.log", "qemu.log", "qmp.log", "serial.log"} {
		p := filepath.Join(b.vmDir(), f)
		fmt.Fprintf(&s, "--- %s (last %d lines)\n%s\n", p, n, tailFile(p, n))
	}
	return s.String()
}
