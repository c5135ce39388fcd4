package testbed

import (
	"os/exec"
	"runtime"
	"testing"
	"time"
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
