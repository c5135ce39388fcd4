package ramdisk

import (
	"context"
	"testing"

	"github.com/better-compute/bcd/protocol"
)

// TestExclusiveFreesTheDisksWithTheFinalStatus: the control plane sends the
// next command as soon as it reads a command's final status, so by then the
// disks must be free, even if the handler has not returned yet.
func TestExclusiveFreesTheDisksWithTheFinalStatus(t *testing.T) {
	a := &Agent{}
	reported := make(chan struct{})
	finish := make(chan struct{})
	first := a.exclusive(func(ctx context.Context, cmd protocol.Command, report reportFunc) error {
		if err := report(protocol.Status{State: protocol.StateSucceeded}); err != nil {
			return err
		}
		close(reported)
		<-finish // the handler's own tidying after its last status
		return nil
	})
	done := make(chan error, 1)
	go func() {
		done <- first(context.Background(), protocol.Command{Kind: protocol.KindDiskWipe}, func(protocol.Status) error { return nil })
	}()
	<-reported
	var got []protocol.Status
	second := a.exclusive(func(ctx context.Context, cmd protocol.Command, report reportFunc) error {
		return report(protocol.Status{State: protocol.StateSucceeded, Message: "ran"})
	})
	if err := second(context.Background(), protocol.Command{Kind: protocol.KindDiskWipe}, func(st protocol.Status) error {
		got = append(got, st)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	close(finish)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Message != "ran" {
		t.Fatalf("the command sent after the first one's final status got %+v, want it run", got)
	}
	// And a command that is still running holds the disks.
	hold := make(chan struct{})
	running := make(chan struct{})
	go func() {
		_ = a.exclusive(func(ctx context.Context, cmd protocol.Command, report reportFunc) error {
			_ = report(protocol.Status{State: protocol.StateRunning})
			close(running)
			<-hold
			return report(protocol.Status{State: protocol.StateSucceeded})
		})(context.Background(), protocol.Command{Kind: protocol.KindDeployImage}, func(protocol.Status) error { return nil })
	}()
	<-running
	got = nil
	_ = second(context.Background(), protocol.Command{Kind: protocol.KindDiskWipe}, func(st protocol.Status) error {
		got = append(got, st)
		return nil
	})
	close(hold)
	if len(got) != 1 || got[0].Reason != protocol.RamdiskReasonBusy {
		t.Fatalf("during a running deploy, disk.wipe got %+v, want busy", got)
	}
}
