package deploy

import (
	"context"
	"os"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// LoadInstalled loads, for machine.kexec, the kernel of an OS already on a disk:
// the disk is chosen like deploy.image's target (with no size to fit), found and
// read exactly as after a deploy (see findBoot), and never written. Finish with the
// Result jumps to it.
func (d *Deployer) LoadInstalled(ctx context.Context, p protocol.MachineKexecParams) (Result, error) {
	start := time.Now()
	res := Result{After: protocol.AfterKexec}
	after := protocol.DeployAfter{Action: protocol.AfterKexec, Kernel: p.Kernel, Initrd: p.Initrd, FS: p.FS, Cmdline: p.Cmdline}
	if err := after.Validate(); err != nil {
		return res, failf(reasonInvalid, "machine.kexec: %v", err)
	}
	if p.Target.Serial != "" && p.Target.Path != "" {
		return res, failf(reasonInvalid, "machine.kexec: target: give serial or path, not both")
	}
	path, disk, block, err := d.selectTarget(p.Target, 1)
	if err != nil {
		return res, err
	}
	res.Target, res.Disk = path, disk
	t := &target{path: path, block: block}
	f, err := os.Open(path)
	if err != nil {
		return res, failf(reasonNoDisk, "%v", err)
	}
	t.direct, t.buffered = f, f
	defer f.Close()
	if block {
		if t.size, t.sectorSize, err = blockSize(f); err != nil {
			return res, failf(reasonNoDisk, "%s: %v", path, err)
		}
	} else {
		fi, err := f.Stat()
		if err != nil {
			return res, failf(reasonNoDisk, "%v", err)
		}
		t.size = fi.Size()
	}
	table, err := ReadPartitionTable(t, t.size, t.sectorSize)
	if err != nil {
		return res, failf(reasonPartitions, "%s: %v", path, err)
	}
	tmp, err := os.MkdirTemp(d.TempDir, "bcd-kexec-")
	if err != nil {
		return res, failf(reasonKernel, "private temp dir: %v", err)
	}
	defer os.RemoveAll(tmp)
	in, err := findInstalled(ctx, t, table, 0, 0, tmp, &res)
	if err != nil {
		return res, err
	}
	if err := d.loadKernel(ctx, in, after, tmp, &res); err != nil {
		return res, err
	}
	res.Duration = time.Since(start)
	return res, nil
}
