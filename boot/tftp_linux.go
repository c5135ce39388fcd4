package boot

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// currentNetns opens the network namespace of the calling thread.
func currentNetns() (*os.File, error) {
	f, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("TFTP: finding the network namespace: %w", err)
	}
	return f, nil
}

// serveInNetns runs serve on a thread inside ns. The TFTP library opens a socket
// for each transfer on the thread that reads the requests, so that thread must be
// in the namespace Listen ran in: a caller that entered a namespace only to Listen
// (as the testbed does) would otherwise open transfer sockets in its own.
func serveInNetns(ns *os.File, serve func() error) error {
	runtime.LockOSThread()
	here, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: finding the network namespace: %w", err)
	}
	want, err := ns.Stat()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: network namespace: %w", err)
	}
	a, b := here.Sys().(*syscall.Stat_t), want.Sys().(*syscall.Stat_t)
	if a.Dev == b.Dev && a.Ino == b.Ino {
		runtime.UnlockOSThread()
		return serve()
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("TFTP: entering the network namespace Listen ran in: %w", err)
	}
	// The thread stays locked: it belongs to ns now and ends with this goroutine.
	return serve()
}
