package boot

import (
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sys/unix"
)

// pinAndRaise locks the calling goroutine to its thread and sets that thread's
// nice value, so that the kernel runs it ahead of the process's other threads
// and of other work on the machine when a packet wakes it. Without
// CAP_SYS_NICE a negative value is refused: the error says so, and the thread
// runs at the process's priority. The caller defers restore, which puts the
// thread's nice value back and unlocks it before the goroutine ends: a thread
// that ended locked would hand its P to a thread it creates on the way out,
// and a thread inherits its creator's nice value, so the priority would pass
// to goroutines that were never meant to have it.
func pinAndRaise(nice int) (restore func(), err error) {
	runtime.LockOSThread()
	tid := unix.Gettid()
	// The system call's value is 20 - nice (1 to 40), not nice itself.
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return runtime.UnlockOSThread, fmt.Errorf("getpriority: %w", err)
	}
	orig := 20 - prio
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil {
		return runtime.UnlockOSThread, fmt.Errorf("setpriority %d: %w", nice, err)
	}
	return func() {
		if unix.Setpriority(unix.PRIO_PROCESS, tid, orig) == nil {
			runtime.UnlockOSThread()
		}
		// Else (lowering a nice value needs the privilege too) the thread
		// stays locked and ends with the goroutine.
	}, nil
}

// readyWaiter blocks its own thread until a socket has a datagram, instead of
// parking the goroutine in the runtime's network poller: the kernel then wakes
// this thread, whose priority pinAndRaise set, rather than whichever thread
// polls the network, which hands the goroutine on.
type readyWaiter struct {
	fds [2]unix.PollFd
}

// newReadyWaiter waits on c's socket and on stop, an eventfd that Serve
// signals before it closes the sockets.
func newReadyWaiter(c *net.UDPConn, stop int) (*readyWaiter, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	w := &readyWaiter{}
	if err := rc.Control(func(fd uintptr) { w.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN} }); err != nil {
		return nil, err
	}
	w.fds[1] = unix.PollFd{Fd: int32(stop), Events: unix.POLLIN}
	return w, nil
}

// wait returns when the socket is readable (true) or the server is stopping
// (false). The stop eventfd is never drained, so every waiter sees it.
func (w *readyWaiter) wait() bool {
	for {
		w.fds[0].Revents, w.fds[1].Revents = 0, 0
		_, err := unix.Ppoll(w.fds[:], nil, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || w.fds[1].Revents != 0 {
			return false
		}
		if w.fds[0].Revents != 0 {
			return true
		}
	}
}

func newStopFD() (int, error) {
	return unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
}

func signalStop(fd int) {
	one := [8]byte{1}
	for {
		if _, err := unix.Write(fd, one[:]); err != unix.EINTR {
			return
		}
	}
}

func closeStopFD(fd int) { unix.Close(fd) }
