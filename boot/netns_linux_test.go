package boot

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/internal/testenv"
)

// netns is a network namespace a test created; t.Cleanup deletes it and everything
// in it, so nothing a test does reaches the host's interfaces.
type netns string

func newNetns(t testing.TB, suffix string) netns {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "ip")
	name := fmt.Sprintf("bcdt%d%s", os.Getpid()%100000, suffix)
	ipCmd(t, "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	ns := netns(name)
	ns.ip(t, "link", "set", "lo", "up")
	return ns
}

func ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func (ns netns) ip(t testing.TB, args ...string) {
	t.Helper()
	ipCmd(t, append([]string{"-n", string(ns)}, args...)...)
}

// veth joins a and b with a veth pair named an (in a) and bn (in b), both up.
func veth(t testing.TB, a netns, an string, b netns, bn string) {
	t.Helper()
	ipCmd(t, "link", "add", an, "netns", string(a), "type", "veth", "peer", "name", bn, "netns", string(b))
	a.ip(t, "link", "set", an, "up")
	b.ip(t, "link", "set", bn, "up")
}

// do runs fn on a thread that has entered ns: sockets fn opens live in ns for good,
// wherever they are used afterwards.
func (ns netns) do(t testing.TB, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + string(ns))
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := setns(target); err != nil {
			errc <- fmt.Errorf("entering %s: %w", ns, err)
			return
		}
		ferr := fn()
		if err := setns(orig); err != nil {
			// Leave the thread locked: it dies with this goroutine, namespace and all.
			errc <- fmt.Errorf("leaving %s: %w", ns, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func setns(f *os.File) error { return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET) }
