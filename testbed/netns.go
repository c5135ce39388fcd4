package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// Netns is a network namespace this process created; Close deletes it.
type Netns struct {
	Name string
}

// NewNetns creates a network namespace with its loopback up. The name should be
// unique to the caller (tests add their PID) so parallel runs never share one.
func NewNetns(name string) (*Netns, error) {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testbed: ip netns add %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	n := &Netns{Name: name}
	if err := n.Run("ip", "link", "set", "lo", "up"); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// Close deletes the namespace. Processes still inside it keep it alive until they end,
// so stop them first.
func (n *Netns) Close() error {
	if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: ip netns del %s: %v: %s", n.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// Command returns a command that runs inside the namespace.
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// CommandSameMounts returns a command that runs in the namespace's network only.
// ip netns exec also gives the command a fresh /sys, which hides the cgroup tree
// (/sys/fs/cgroup) a site agent prepares its plugins' cgroups in; nsenter --net
// keeps this process's mounts.
func (n *Netns) CommandSameMounts(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=/var/run/netns/" + n.Name, "--", name}, args...)...)
}

// Run runs a command inside the namespace and returns its output in the error.
func (n *Netns) Run(name string, args ...string) error {
	out, err := n.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testbed: in %s: %s %s: %v: %s", n.Name, name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// Do runs fn on an OS thread switched into the namespace. Sockets fn opens belong to
// the namespace and keep working from any goroutine afterwards, which is how a Go
// server under test binds inside the lab.
func (n *Netns) Do(fn func() error) error {
	target, err := os.Open("/var/run/netns/" + n.Name)
	if err != nil {
		return fmt.Errorf("testbed: open netns %s: %w", n.Name, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		// This goroutine's thread is never handed back to the scheduler: a thread left
		// in another namespace would leak it into unrelated goroutines.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- fmt.Errorf("testbed: unshare: %w", err)
			return
		}
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("testbed: setns %s: %w", n.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// AddBridge creates a bridge with addr (CIDR) and brings it up.
func (n *Netns) AddBridge(name, addr string) error {
	steps := [][]string{
		{"ip", "link", "add", name, "type", "bridge"},
		{"ip", "link", "set", name, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"ip", "addr", "add", addr, "dev", name},
		{"ip", "link", "set", name, "up"},
	}
	for _, s := range steps {
		if err := n.Run(s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// AddTap creates a tap device attached to bridge, for one VM's NIC.
func (n *Netns) AddTap(name, bridge string) error {
	for _, s := range [][]string{
		{"ip", "tuntap", "add", "dev", name, "mode", "tap"},
		{"ip", "link", "set", name, "master", bridge},
		{"ip", "link", "set", name, "up"},
	} {
		if err := n.Run(s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// AddAddr adds another address (CIDR) to dev, e.g. a second IP for the site agent.
func (n *Netns) AddAddr(dev, addr string) error {
	return n.Run("ip", "addr", "add", addr, "dev", dev)
}

// Veth joins two namespaces with a veth pair, addressing each end.
func Veth(a *Netns, aName, aAddr string, b *Netns, bName, bAddr string) error {
	tmp := fmt.Sprintf("vt%d", os.Getpid()%100000)
	if out, err := exec.Command("ip", "link", "add", tmp+"a", "type", "veth", "peer", "name", tmp+"b").CombinedOutput(); err != nil {
		return fmt.Errorf("testbed: veth: %v: %s", err, bytes.TrimSpace(out))
	}
	var errs []error
	for _, s := range [][]string{
		{"ip", "link", "set", tmp + "a", "netns", a.Name, "name", aName},
		{"ip", "link", "set", tmp + "b", "netns", b.Name, "name", bName},
	} {
		if out, err := exec.Command(s[0], s[1:]...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%v: %s", err, bytes.TrimSpace(out)))
		}
	}
	if len(errs) > 0 {
		exec.Command("ip", "link", "del", tmp+"a").Run()
		return fmt.Errorf("testbed: veth: %w", errors.Join(errs...))
	}
	for _, side := range []struct {
		ns         *Netns
		name, addr string
	}{{a, aName, aAddr}, {b, bName, bAddr}} {
		if side.addr != "" {
			if err := side.ns.Run("ip", "addr", "add", side.addr, "dev", side.name); err != nil {
				return err
			}
		}
		if err := side.ns.Run("ip", "link", "set", side.name, "up"); err != nil {
			return err
		}
	}
	return nil
}
