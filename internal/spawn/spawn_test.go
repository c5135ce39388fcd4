package spawn

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/better-compute/bcd/internal/testenv"
)

// TestStartKilledWithUsOutlivesTheStartingThread: children started from threads
// that then exit (as Netns.Do's do) live on. With the death signal bound to the
// starting thread, as plain cmd.Start binds it, they are killed as the thread ends
// (except on the main thread, which Go never ends).
func TestStartKilledWithUsOutlivesTheStartingThread(t *testing.T) {
	var exited []chan struct{}
	for range 3 {
		cmd := exec.Command("sleep", "60")
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			errc <- StartKilledWithUs(cmd)
		}()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		ch := make(chan struct{})
		go func() { cmd.Wait(); close(ch) }()
		t.Cleanup(func() { cmd.Process.Kill(); <-ch })
		exited = append(exited, ch)
	}
	deadline := time.After(time.Second)
	for i, ch := range exited {
		select {
		case <-ch:
			t.Fatalf("child %d died with the thread that asked for it", i)
		case <-deadline:
			return
		}
	}
}

// TestStartKilledWithUsNice: a child started with a delta runs at this process's
// nice value plus it, and the spawning thread goes back to its own: a child
// started after it without one runs at this process's.
func TestStartKilledWithUsNice(t *testing.T) {
	own, err := Nice(0)
	if err != nil {
		t.Fatal(err)
	}
	niceOf := func(t *testing.T, delta int) int {
		t.Helper()
		cmd := exec.Command("sleep", "60")
		var err error
		if delta == 0 {
			err = StartKilledWithUs(cmd)
		} else {
			err = StartKilledWithUsNice(cmd, delta)
		}
		if err != nil {
			if delta < 0 && os.Geteuid() != 0 {
				testenv.Skip(t, "a higher priority needs root: "+err.Error())
			}
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		n, err := Nice(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, delta := range []int{-10, 5, 0} {
		want := min(max(own+delta, -20), 19)
		if got := niceOf(t, delta); got != want {
			t.Errorf("delta %d: the child's nice is %d, want %d (this process's %d)", delta, got, want, own)
		}
	}
}
