package ramdisk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/bcd/agent"
	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// Reasons of the statuses the ramdisk reports besides deploy's.
const (
	ReasonCollected   = "collected"
	ReasonDeploying   = "deploying"
	ReasonDeployed    = "deployed"
	ReasonWiping      = "wiping"
	ReasonWiped       = "wiped"
	ReasonDiagnosing  = "diagnosing"
	ReasonDiagPassed  = "passed"
	ReasonKexec       = "kexec"
	ReasonRebooting   = "rebooting"
	ReasonPoweringOff = "powering-off"
	ReasonStarted     = "started"
)

// MsgNoDCGMI is the message of diag.dcgm's UNSUPPORTED when dcgmi is absent.
const MsgNoDCGMI = "dcgmi is not installed in this ramdisk"

// maxDiagOutput bounds what dcgmi's output is kept of; its JSON is a few tens of KiB.
const maxDiagOutput = 1 << 20

type reportFunc = func(protocol.Status) error

func (a *Agent) handlers() map[string]agent.Handler {
	return map[string]agent.Handler{
		protocol.KindInventory:     a.runInventory,
		protocol.KindDeployImage:   a.exclusive(a.runDeploy),
		protocol.KindDiskWipe:      a.exclusive(a.runWipe),
		protocol.KindDiagDCGM:      a.notGoingDown(a.runDiag),
		protocol.KindMachineKexec:  a.exclusive(a.runKexec),
		protocol.KindMachineReboot: a.exclusive(a.runReboot),
		protocol.KindMachineOff:    a.exclusive(a.runPowerOff),
	}
}

// exclusive runs h alone among the commands that use the disks or end the machine:
// a wipe during a deploy, or a reboot in the middle of one, is refused, not queued,
// so the control plane learns at once that it asked for two things.
func (a *Agent) exclusive(h agent.Handler) agent.Handler {
	return func(ctx context.Context, cmd protocol.Command, report reportFunc) error {
		if a.goingDown.Load() {
			return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.RamdiskReasonGoingDown,
				Message: "the machine is going down: a kexec, reboot or power off is under way"})
		}
		if !a.busy.TryLock() {
			other, _ := a.busyWith.Load().(string)
			return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.RamdiskReasonBusy,
				Message: fmt.Sprintf("a %s command is running; %s waits for it to end", other, cmd.Kind)})
		}
		a.busyWith.Store(cmd.Kind)
		// Free the disks before the final status leaves, not after the
		// handler returns: the control plane sends the next command as soon
		// as it reads that status, and found the lock still held (busy).
		var release sync.Once
		defer release.Do(a.busy.Unlock)
		return h(ctx, cmd, func(st protocol.Status) error {
			if protocol.Terminal(st.State) {
				release.Do(a.busy.Unlock)
			}
			return report(st)
		})
	}
}

// notGoingDown refuses h once the machine is going down; diagnostics may run beside
// a deploy, since they touch no disk.
func (a *Agent) notGoingDown(h agent.Handler) agent.Handler {
	return func(ctx context.Context, cmd protocol.Command, report reportFunc) error {
		if a.goingDown.Load() {
			return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.RamdiskReasonGoingDown,
				Message: "the machine is going down: a kexec, reboot or power off is under way"})
		}
		return h(ctx, cmd, report)
	}
}

func failed(report reportFunc, reason, format string, args ...any) error {
	return report(protocol.Status{State: protocol.StateFailed, Reason: reason, Message: fmt.Sprintf(format, args...)})
}

// decodeParams decodes a command's params strictly: a field the ramdisk does not
// know is refused rather than silently ignored. Absent params decode as zero.
func decodeParams(raw json.RawMessage, v any) error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("data after the params object")
	}
	return nil
}

func (a *Agent) runInventory(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonStarted, Message: "collecting the hardware inventory"}); err != nil {
		return err
	}
	c := a.claims(ctx)
	res, err := json.Marshal(c)
	if err != nil {
		return err
	}
	return report(protocol.Status{State: protocol.StateSucceeded, Reason: ReasonCollected,
		Message: fmt.Sprintf("%d MACs, %d disks, %d GPUs", len(c.MACs), len(c.Disks), len(c.GPUs)), Result: res})
}

func (a *Agent) runDeploy(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	var p protocol.DeployImageParams
	if err := decodeParams(cmd.Params, &p); err != nil {
		return failed(report, protocol.DeployReasonInvalid, "deploy.image params: %v", err)
	}
	if err := p.Validate(); err != nil {
		return failed(report, protocol.DeployReasonInvalid, "deploy.image params: %v", err)
	}
	img := protocol.RedactURL(p.Image.URL)
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonDeploying,
		Message: "deploying " + img}); err != nil {
		return err
	}
	a.log.Info("deploy.image started", "command_id", cmd.ID, "image", img, "size", p.Image.Size, "after", p.After.Action)
	progress := func(pr deploy.Progress) {
		// deploy calls this at most every ProgressInterval (250ms) and at each
		// stage: a few statuses a second, each journaled until acknowledged.
		if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonDeploying,
			Message: pr.Stage, Progress: deployProgress(pr)}); err != nil {
			a.console.Warn("could not journal deploy progress", "error", err.Error())
		}
	}
	res, err := a.deployer.Deploy(ctx, deployRequest(p), progress)
	if err != nil {
		a.log.Error("deploy.image failed", "command_id", cmd.ID, "reason", deploy.Reason(err), "error", err.Error())
		return failed(report, deploy.Reason(err), "%v", err)
	}
	wire, err := json.Marshal(deployResult(res))
	if err != nil {
		return err
	}
	st := protocol.Status{State: protocol.StateSucceeded, Reason: ReasonDeployed, Result: wire,
		Message: fmt.Sprintf("wrote %d bytes to %s (sha256 %s); after: %s", res.ImageSize, res.Target.Path, res.SHA256, res.After)}
	a.log.Info("deploy.image succeeded", "command_id", cmd.ID, "disk", res.Target.Path, "bytes", res.ImageSize,
		"seconds", res.Duration.Seconds(), "after", res.After)
	if res.Kernel != "" {
		a.kexecLoaded.Store(true)
	}
	switch res.After {
	case protocol.AfterKexec, protocol.AfterReboot, protocol.AfterPowerOff:
		return a.handOver(ctx, report, st, res.After, func() error { return a.deployer.Finish(res) })
	}
	return report(st)
}

func (a *Agent) runWipe(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	var p protocol.DiskWipeParams
	if err := decodeParams(cmd.Params, &p); err != nil {
		return failed(report, protocol.RamdiskReasonInvalid, "disk.wipe params: %v", err)
	}
	if err := p.Validate(); err != nil {
		return failed(report, protocol.RamdiskReasonInvalid, "disk.wipe params: %v", err)
	}
	mode := p.Mode
	if mode == "" {
		mode = protocol.WipeTables
	}
	list := a.Disks
	if list == nil {
		list = deploy.SysBlock{}.List
	}
	disks, err := list()
	if err != nil {
		return failed(report, protocol.DeployReasonNoDisk, "disk.wipe: %v", err)
	}
	disk, err := deploy.SelectDisk(disks, deploy.Target(p.Disk), 0)
	if err != nil {
		return failed(report, protocol.DeployReasonNoDisk, "disk.wipe: %v", err)
	}
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonWiping,
		Message: fmt.Sprintf("wiping %s (%s)", disk.Path, mode)}); err != nil {
		return err
	}
	wipe := a.Wipe
	if wipe == nil {
		wipe = WipeDisk
	}
	a.log.Warn("disk.wipe started", "command_id", cmd.ID, "disk", disk.Path, "serial", disk.Serial, "mode", mode)
	res, err := wipe(ctx, disk, mode)
	if err != nil {
		a.log.Error("disk.wipe failed", "command_id", cmd.ID, "disk", disk.Path, "error", err.Error())
		return failed(report, protocol.DeployReasonWrite, "disk.wipe %s: %v", disk.Path, err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	a.log.Info("disk.wipe succeeded", "command_id", cmd.ID, "disk", disk.Path, "mode", mode)
	return report(protocol.Status{State: protocol.StateSucceeded, Reason: ReasonWiped, Result: b,
		Message: fmt.Sprintf("wiped %s (%s)", disk.Path, mode)})
}

func (a *Agent) dcgmi() (string, bool) {
	switch a.DCGMI {
	case "-":
		return "", false
	case "":
		p, err := exec.LookPath("dcgmi")
		return p, err == nil
	}
	return a.DCGMI, true
}

// diagTimeouts bound dcgmi diag by run level: level 4 runs for hours on big GPUs.
var diagTimeouts = map[int]time.Duration{1: 10 * time.Minute, 2: 30 * time.Minute, 3: 2 * time.Hour, 4: 6 * time.Hour}

func (a *Agent) runDiag(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	var p protocol.DiagDCGMParams
	if err := decodeParams(cmd.Params, &p); err != nil {
		return failed(report, protocol.RamdiskReasonInvalid, "diag.dcgm params: %v", err)
	}
	if err := p.Validate(); err != nil {
		return failed(report, protocol.RamdiskReasonInvalid, "diag.dcgm params: %v", err)
	}
	bin, ok := a.dcgmi()
	if !ok {
		return report(protocol.Status{State: protocol.StateUnsupported, Reason: agent.ReasonUnsupported, Message: MsgNoDCGMI})
	}
	level := p.Level
	if level == 0 {
		level = 1
	}
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonDiagnosing,
		Message: fmt.Sprintf("dcgmi diag -r %d", level)}); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, diagTimeouts[level])
	defer cancel()
	var stdout, stderr capped
	c := exec.CommandContext(dctx, bin, "diag", "-r", strconv.Itoa(level), "-j")
	c.Stdout, c.Stderr = &stdout, &stderr
	c.WaitDelay = 10 * time.Second
	err := c.Run()
	out := bytes.TrimSpace(stdout.Bytes())
	var result json.RawMessage
	if json.Valid(out) && len(out) > 0 {
		result = out
	} else if len(out) > 0 {
		result, _ = json.Marshal(map[string]string{"output": string(out)})
	}
	if err != nil {
		msg := firstLine(stderr.String())
		if msg == "" {
			msg = firstLine(string(out))
		}
		if dctx.Err() != nil && ctx.Err() == nil {
			msg = fmt.Sprintf("timed out after %s", diagTimeouts[level])
		}
		a.log.Warn("diag.dcgm failed", "command_id", cmd.ID, "level", level, "error", err.Error(), "detail", msg)
		return report(protocol.Status{State: protocol.StateFailed, Reason: protocol.RamdiskReasonFailed,
			Message: fmt.Sprintf("dcgmi diag -r %d: %v: %s", level, err, msg), Result: result})
	}
	return report(protocol.Status{State: protocol.StateSucceeded, Reason: ReasonDiagPassed,
		Message: fmt.Sprintf("dcgmi diag -r %d passed", level), Result: result})
}

func (a *Agent) runKexec(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	var p protocol.MachineKexecParams
	if err := decodeParams(cmd.Params, &p); err != nil {
		return failed(report, protocol.RamdiskReasonInvalid, "machine.kexec params: %v", err)
	}
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonKexec, Message: "loading the installed kernel"}); err != nil {
		return err
	}
	if l, ok := a.deployer.(InstalledLoader); ok {
		sel, after := kexecRequest(p)
		res, err := l.LoadInstalled(ctx, sel, after)
		if err != nil {
			return failed(report, deploy.Reason(err), "machine.kexec: %v", err)
		}
		a.kexecLoaded.Store(true)
		st := protocol.Status{State: protocol.StateSucceeded, Reason: ReasonKexec,
			Message: fmt.Sprintf("jumping to %s", res.Kernel)}
		return a.handOver(ctx, report, st, protocol.AfterKexec, func() error { return a.deployer.Finish(res) })
	}
	if a.kexecLoaded.Load() && p == (protocol.MachineKexecParams{}) {
		st := protocol.Status{State: protocol.StateSucceeded, Reason: ReasonKexec, Message: "jumping to the kernel a deploy loaded"}
		return a.handOver(ctx, report, st, protocol.AfterKexec, a.machine.KexecExec)
	}
	return failed(report, protocol.RamdiskReasonNotImplemented,
		"machine.kexec: this deployer cannot load a kernel from an installed disk; use deploy.image with after.action kexec")
}

func (a *Agent) runReboot(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonRebooting, Message: "rebooting"}); err != nil {
		return err
	}
	st := protocol.Status{State: protocol.StateSucceeded, Reason: ReasonRebooting, Message: "rebooting now"}
	return a.handOver(ctx, report, st, protocol.AfterReboot, a.machine.Reboot)
}

func (a *Agent) runPowerOff(ctx context.Context, cmd protocol.Command, report reportFunc) error {
	if err := report(protocol.Status{State: protocol.StateRunning, Reason: ReasonPoweringOff, Message: "powering off"}); err != nil {
		return err
	}
	st := protocol.Status{State: protocol.StateSucceeded, Reason: ReasonPoweringOff, Message: "powering off now"}
	return a.handOver(ctx, report, st, protocol.AfterPowerOff, a.machine.PowerOff)
}

// handOver reports st (the command's success), waits a bounded time for the gateway
// to acknowledge it and everything before it, then runs action, which takes the
// machine down. Nothing replays the journal once the machine is gone, so the ack
// comes first; a gateway that does not answer in FlushTimeout does not keep the
// machine up. If action returns (it failed, or the machine is a fake), the agent
// says so; a fake's return ends Run.
func (a *Agent) handOver(ctx context.Context, report reportFunc, st protocol.Status, what string, action func() error) error {
	if !a.goingDown.CompareAndSwap(false, true) {
		return failed(report, protocol.RamdiskReasonGoingDown, "the machine is already going down")
	}
	if err := report(st); err != nil {
		a.goingDown.Store(false)
		return err
	}
	timeout := a.FlushTimeout
	if timeout <= 0 {
		timeout = DefaultFlushTimeout
	}
	fctx, cancel := context.WithTimeout(ctx, timeout)
	err := a.session.Flush(fctx)
	cancel()
	if err != nil {
		a.console.Warn("going down before the gateway acknowledged the last statuses", "action", what, "error", err.Error())
	} else {
		a.console.Info("the gateway acknowledged; handing the machine over", "action", what)
	}
	if err := action(); err != nil {
		a.goingDown.Store(false)
		// The command already reported success: the failure is an error event,
		// and the ramdisk stays up for the next command.
		a.log.Error("the machine did not go down", "action", what, "error", err.Error())
		return nil
	}
	a.finish()
	return nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

type capped struct{ bytes.Buffer }

func (c *capped) Write(p []byte) (int, error) {
	if room := maxDiagOutput - c.Len(); room < len(p) {
		if room > 0 {
			c.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Buffer.Write(p)
}
