package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/better-compute/bcd/nodeagent/helper"
	"github.com/better-compute/bcd/protocol"
)

// Rebooter restarts the machine. The real one does not return on success.
type Rebooter interface {
	Reboot() error
}

// RebooterFunc adapts a function to Rebooter.
type RebooterFunc func() error

// Reboot calls f.
func (f RebooterFunc) Reboot() error { return f() }

// Reasons of the statuses node.reboot reports.
const (
	ReasonRebooting   = "Rebooting"
	ReasonRebooted    = "Rebooted"
	ReasonNotRebooted = "NotRebooted"
	ReasonRebootError = "RebootFailed"
)

// stateReboot is the journal state key of a pending node.reboot.
const stateReboot = "node.reboot"

// pendingReboot is what the journal keeps across the reboot: which command asked,
// and the boot id it was asked in.
type pendingReboot struct {
	CommandID   string    `json:"command_id"`
	BootID      string    `json:"boot_id"`
	RequestedAt time.Time `json:"requested_at"`
}

// rebootAckWait is how long node.reboot waits for the gateway to acknowledge RUNNING
// before pulling the plug; the journal replays it after the boot either way.
const rebootAckWait = 3 * time.Second

func (n *Node) runReboot(ctx context.Context, cmd protocol.Command, report func(protocol.Status) error) error {
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonRebooting, Message: "rebooting the node"}); err != nil {
		return err
	}
	rec, err := json.Marshal(pendingReboot{CommandID: cmd.ID, BootID: n.bootID, RequestedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := n.journal.SetState(stateReboot, rec); err != nil {
		return fmt.Errorf("record the pending reboot: %w", err)
	}
	deadline := time.Now().Add(rebootAckWait)
	for n.journal.Len() > 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	n.log.Warn("rebooting the node", "command_id", cmd.ID)
	if err := n.rebooter.Reboot(); err != nil {
		if derr := n.journal.DeleteState(stateReboot); derr != nil {
			n.log.Error("could not clear the pending reboot", "error", derr.Error())
		}
		return fmt.Errorf("reboot: %w", err)
	}
	return nil
}

// finishReboot reports the end of a node.reboot the previous process started, on
// the first Welcome: a new boot id means the machine rebooted.
func (n *Node) finishReboot() {
	p := n.pending
	if p == nil {
		return
	}
	n.pending = nil
	st := protocol.Status{CommandID: p.CommandID}
	if p.BootID != n.bootID {
		st.State, st.Reason = protocol.StateSucceeded, ReasonRebooted
		st.Message = fmt.Sprintf("rebooted (boot id %s, was %s)", n.bootID, p.BootID)
	} else {
		st.State, st.Reason = protocol.StateFailed, ReasonNotRebooted
		st.Message = "the node did not reboot"
	}
	if err := n.session.ReportStatus(st); err != nil {
		n.log.Error("could not journal the end of node.reboot", "command_id", p.CommandID, "error", err.Error())
		return
	}
	if err := n.journal.DeleteState(stateReboot); err != nil {
		n.log.Error("could not clear the pending reboot", "error", err.Error())
	}
	n.log.Info("node.reboot finished", "command_id", p.CommandID, "state", st.State)
}

// helperRebooter is node.reboot on an unprivileged node: bcd helper syncs and
// reboots. The helper answers before it reboots, so a nil error means the
// machine is going down; an error, a dropped connection included, is returned
// as it is, since the node cannot tell a reboot under way from a helper that
// died.
func helperRebooter(c *helper.Client) Rebooter {
	return RebooterFunc(func() error {
		if err := c.Reboot(context.Background()); err != nil {
			return fmt.Errorf("through bcd helper: %w", err)
		}
		return nil
	})
}
