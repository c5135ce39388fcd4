package ramdisk

import (
	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// This file is deploy's wire edge: deploy.image's and machine.kexec's params become
// deploy's own request types here, and deploy's result and progress become what a
// Status carries. deploy itself knows no wire type.

// deployRequest is deploy.image's params as deploy takes them.
func deployRequest(p protocol.DeployImageParams) deploy.Request {
	r := deploy.Request{
		Image:  deploy.Image(p.Image),
		Target: deploy.Target(p.Target),
		After:  deploy.After(p.After),
		Proxy:  p.Proxy, RootPartition: p.RootPartition, ESPPartition: p.ESPPartition,
	}
	if p.NodeAgent != nil {
		r.NodeAgent = (*deploy.NodeAgent)(p.NodeAgent)
	}
	for _, f := range p.Files {
		r.Files = append(r.Files, deploy.File{FS: f.FS, Path: f.Path, Mode: uint32(f.Mode), UID: f.UID, GID: f.GID,
			Content: deploy.Content(f.Content)})
	}
	return r
}

// kexecRequest is machine.kexec's params as deploy.Deployer.LoadInstalled takes them.
func kexecRequest(p protocol.MachineKexecParams) (deploy.Target, deploy.After) {
	return deploy.Target(p.Target), deploy.After{Action: protocol.AfterKexec, Kernel: p.Kernel, Initrd: p.Initrd, FS: p.FS, Cmdline: p.Cmdline}
}

// deployResult is a deploy's result as a Status carries it.
func deployResult(r deploy.Result) protocol.DeployImageResult {
	w := protocol.DeployImageResult{
		Target:    protocol.DeployTarget{Path: r.Target.Path, Serial: r.Target.Serial},
		ChosenBy:  r.Target.ChosenBy,
		ImageSize: r.ImageSize, Size: r.Size, SHA256: r.SHA256, DurationMS: r.Duration.Milliseconds(), Files: r.Files,
		Kernel: r.Kernel, Initrd: r.Initrd, Cmdline: r.Cmdline, After: r.After, Warnings: r.Warnings,
		Wiped: r.Wiped, BootOrder: r.BootOrder,
	}
	if r.RootFound {
		w.RootPartition, w.RootPartUUID = r.Root.Number, r.PartUUID
	}
	w.ESPPartition = r.ESP.Number
	return w
}

// deployProgress is a deploy's progress as a Status carries it.
func deployProgress(p deploy.Progress) *protocol.Progress {
	return &protocol.Progress{Done: p.Done, Total: p.Total, Unit: "bytes", Rate: p.Rate}
}
