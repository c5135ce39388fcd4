// Package spawn starts child processes that die with the process that started
// them, whichever of its threads started them, and optionally at a higher
// priority than it: the lab's services (testbed, simlab) and bcd sim's firmware
// child.
package spawn

import (
	"fmt"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// StartKilledWithUs starts cmd so that it is killed (SIGKILL) when this process
// dies, however it dies. The death signal (PR_SET_PDEATHSIG) fires when the thread
// that forked the child ends, not the process, and Go ends threads: Netns.Do's
// thread, left in another namespace, exits with its goroutine, and a service forked
// earlier from that thread died with it, at a random moment (a 10,000-session
// serve, mid-benchmark). So every such child is forked from one thread locked for
// the life of the process. cmd.SysProcAttr's other fields are kept.
func StartKilledWithUs(cmd *exec.Cmd) error {
	return start(cmd, 0)
}

// StartKilledWithUsNice is StartKilledWithUs with the child's nice value delta
// from this process's (negative: a higher priority, which needs CAP_SYS_NICE or
// RLIMIT_NICE room). A child inherits the nice value of the thread that forks it,
// so the spawning thread takes the child's for the fork and its own back after.
// When the priority cannot be set, nothing is started.
func StartKilledWithUsNice(cmd *exec.Cmd, delta int) error {
	return start(cmd, delta)
}

func start(cmd *exec.Cmd, delta int) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawner().reqs <- func() {
		if delta == 0 {
			done <- cmd.Start()
			return
		}
		tid := unix.Gettid()
		own, err := Nice(tid)
		if err != nil {
			done <- err
			return
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, own+delta); err != nil {
			done <- fmt.Errorf("spawn: nice %d for %s (this process's %d%+d): %w", own+delta, cmd.Path, own, delta, err)
			return
		}
		err = cmd.Start()
		// Back to this process's: raising a nice value is always allowed.
		unix.Setpriority(unix.PRIO_PROCESS, tid, own)
		done <- err
	}
	return <-done
}

// Nice is the nice value of thread (or process) id, 0 for the calling thread.
func Nice(id int) (int, error) {
	// The system call answers 20 - nice, so that no answer is negative.
	p, err := unix.Getpriority(unix.PRIO_PROCESS, id)
	if err != nil {
		return 0, fmt.Errorf("spawn: the nice value of %d: %w", id, err)
	}
	return 20 - p, nil
}

type spawnThread struct{ reqs chan func() }

var spawnOnce = sync.OnceValue(func() *spawnThread {
	t := &spawnThread{reqs: make(chan func())}
	go func() {
		// Never unlocked: the thread lives as long as the process. It is in the
		// process's own namespaces: only locked threads ever leave them, and
		// those exit.
		runtime.LockOSThread()
		for f := range t.reqs {
			f()
		}
	}()
	return t
})

func spawner() *spawnThread { return spawnOnce() }
