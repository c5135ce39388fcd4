package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/better-compute/bcd/internal/spawn"
)

// Process is a service the lab started (dnsmasq, bcd site, better-compute serve),
// with its output in a log file a failing test prints.
type Process struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProcess starts cmd with its stdout and stderr in logPath, in a session of
// its own and killed (SIGKILL) when the process that started it dies, so a
// test or benchmark that is killed leaves no service behind (spawn.StartKilledWithUs).
// (ip netns exec and nsenter exec the command without forking: it keeps the death
// signal.)
func StartProcess(name string, cmd *exec.Cmd, logPath string) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testbed: %w", err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if err := spawn.StartKilledWithUs(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("testbed: start %s: %w", name, err)
	}
	p := &Process{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// PID of the process.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Exited is closed when the process ends.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Err is the process's exit error once Exited is closed.
func (p *Process) Err() error { return p.err }

// Stop ends the process (SIGTERM, then SIGKILL after grace) and waits for it.
func (p *Process) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Tail returns the last n lines of the process's log.
func (p *Process) Tail(n int) string {
	return fmt.Sprintf("--- %s log %s (last %d lines)\n%s\n", p.Name, p.Log, n, tailFile(p.Log, n))
}

// SiteDHCP is the provisioning network's own DHCP server: dnsmasq handing out
// addresses only (no PXE options), one reserved address per MAC — measured here, the
// 2019 iPXE never restarts discovery after a NAK, so simultaneous boots without
// reservations end in "Nothing to boot". It also sends IPv6 router advertisements,
// without which that iPXE stalls ~16 s in "Configuring (net0)".
type SiteDHCP struct {
	Iface  string            // the bridge
	Range  string            // e.g. "10.20.0.100,10.20.0.199"
	Router string            // optional option 3
	Hosts  map[string]string // MAC → reserved IPv4
	Dir    string            // config, leases and log
	IPv6RA bool
}

// Start runs dnsmasq inside ns.
func (d SiteDHCP) Start(ns *Netns) (*Process, error) {
	if err := os.MkdirAll(d.Dir, 0o755); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf("port=0\ninterface=%s\nbind-interfaces\nno-resolv\nno-hosts\nno-ping\ndhcp-authoritative\ndhcp-leasefile=%s\ndhcp-range=%s,255.255.255.0,1h\nlog-dhcp\n",
		d.Iface, filepath.Join(d.Dir, "leases"), d.Range)
	if d.Router != "" {
		conf += "dhcp-option=3," + d.Router + "\n"
	} else {
		conf += "dhcp-option=3\n"
	}
	conf += "dhcp-option=6\n"
	for mac, ip := range d.Hosts {
		conf += fmt.Sprintf("dhcp-host=%s,%s\n", mac, ip)
	}
	if d.IPv6RA {
		conf += fmt.Sprintf("enable-ra\ndhcp-range=::,constructor:%s,ra-only\n", d.Iface)
	}
	path := filepath.Join(d.Dir, "dnsmasq.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	cmd := ns.Command("dnsmasq", "--keep-in-foreground", "--log-facility=-", "--conf-file="+path, "--pid-file="+filepath.Join(d.Dir, "dnsmasq.pid"), "--user=root")
	return StartProcess("site-dhcp", cmd, filepath.Join(d.Dir, "dnsmasq.log"))
}
