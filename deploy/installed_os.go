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
// Result jumps to it. after says where the kernel is, as for a deploy; its Action
// is kexec whatever it says.
func (d *Deployer) LoadInstalled(ctx context.Context, sel Target, after After) (Result, error) {
	start := time.Now()
	res := Result{After: protocol.AfterKexec}
	after.Action = protocol.AfterKexec
	if err := after.Validate(); err != nil {
		return res, failf(reasonInvalid, "machine.kexec: %v", err)
	}
	if sel.Serial != "" && sel.Path != "" {
		return res, failf(reasonInvalid, "machine.kexec: target: give serial or path, not both")
	}
	path, disk, block, err := d.selectTarget(sel, 1)
	if err != nil {
		return res, err
	}
	res.Target = disk
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
