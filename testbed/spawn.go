package testbed

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

// StartKilledWithUs starts cmd so that it is killed (SIGKILL) when this process
// dies, however it dies. The death signal (PR_SET_PDEATHSIG) fires when the thread
// that forked the child ends, not the process, and Go ends threads: Netns.Do's
// thread, left in another namespace, exits with its goroutine, and a service forked
// earlier from that thread died with it, at a random moment (a 10,000-session
// serve, mid-benchmark). So every such child is forked from one thread locked for
// the life of the process. cmd.SysProcAttr's other fields are kept.
func StartKilledWithUs(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	spawner().reqs <- func() { done <- cmd.Start() }
	return <-done
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
