package protocol

import (
	"fmt"
	"path"
)

// Wipe modes of DiskWipeParams.Mode.
const (
	// WipeTables zeroes the first and last MiB of the disk: the MBR, both GPTs and
	// the first superblocks, so nothing boots or mounts from it.
	WipeTables = "tables"
	// WipeDiscard discards every block (BLKDISCARD), then zeroes the tables as
	// WipeTables does, since a discard need not read back as zeros.
	WipeDiscard = "discard"
)

// DiskWipeParams are the params of a disk.wipe command. A disk must be named: there
// is no default disk to wipe.
type DiskWipeParams struct {
	// Disk selects the disk: by Serial or by Path (a whole disk, not a partition).
	Disk DeployTarget `json:"disk"`
	// Mode is tables (the default) or discard.
	Mode string `json:"mode,omitempty"`
}

// Validate checks that a disk is named exactly one way and the mode is known.
func (p *DiskWipeParams) Validate() error {
	switch {
	case p.Disk.Serial == "" && p.Disk.Path == "":
		return fmt.Errorf("disk: name the disk to wipe by serial or path")
	case p.Disk.Serial != "" && p.Disk.Path != "":
		return fmt.Errorf("disk: give serial or path, not both")
	case p.Disk.Path != "" && (!path.IsAbs(p.Disk.Path) || path.Clean(p.Disk.Path) != p.Disk.Path):
		return fmt.Errorf("disk.path: want an absolute, clean path such as /dev/nvme0n1")
	}
	switch p.Mode {
	case "", WipeTables, WipeDiscard:
	default:
		return fmt.Errorf("mode: %q is not tables or discard", p.Mode)
	}
	return nil
}

// DiskWipeResult is the result of a disk.wipe that succeeded.
type DiskWipeResult struct {
	Disk   string `json:"disk"`
	Serial string `json:"serial,omitempty"`
	Mode   string `json:"mode"`
	// SizeBytes is the disk's size; Zeroed the bytes written with zeros.
	SizeBytes int64 `json:"size_bytes"`
	Zeroed    int64 `json:"zeroed"`
	Discarded bool  `json:"discarded,omitempty"`
}

// DiagDCGMParams are the params of a diag.dcgm command.
type DiagDCGMParams struct {
	// Level is dcgmi diag's run level, 1 (quick, the default) to 4 (long).
	Level int `json:"level,omitempty"`
}

// Validate checks the level.
func (p *DiagDCGMParams) Validate() error {
	if p.Level < 0 || p.Level > 4 {
		return fmt.Errorf("level: %d is not 1, 2, 3 or 4", p.Level)
	}
	return nil
}

// MachineKexecParams are the params of a machine.kexec command: which installed OS
// to boot. Empty fields mean what deploy.image's after.kexec would find on the disk.
type MachineKexecParams struct {
	// Target selects the disk as deploy.image's target does.
	Target DeployTarget `json:"target,omitempty"`
	// Kernel, Initrd, FS and Cmdline are as in DeployAfter.
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	FS      string `json:"fs,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
}

// Reasons of the statuses the ramdisk reports for its own kinds (deploy.image uses
// the DeployReason* constants).
const (
	RamdiskReasonInvalid        = "invalid-params"
	RamdiskReasonBusy           = "busy"
	RamdiskReasonNotImplemented = "not-implemented"
	RamdiskReasonToolMissing    = "tool-missing"
	RamdiskReasonFailed         = "failed"
	RamdiskReasonGoingDown      = "going-down"
)
