package ramdisk

import (
	"context"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// wipeSpan is what WipeDisk zeroes at each end of a disk: the MBR and primary GPT
// (with room for a 4K-sector GPT's 128 entries) at the start, the backup GPT at the
// end, and whatever superblocks fall inside.
const wipeSpan = 1 << 20

// WipeDisk wipes d: in mode tables it zeroes its first and last MiB; in mode
// discard it first discards every block. The disk is opened O_EXCL, so a disk that
// is mounted or otherwise in use is refused by the kernel. A regular file (a test's
// disk image) is wiped the same way, without the ioctls.
func WipeDisk(ctx context.Context, d deploy.Disk, mode string) (protocol.DiskWipeResult, error) {
	res := protocol.DiskWipeResult{Disk: d.Path, Serial: d.Serial, Mode: mode}
	if mode != protocol.WipeTables && mode != protocol.WipeDiscard {
		return res, fmt.Errorf("wipe mode %q: want tables or discard", mode)
	}
	fi, err := os.Stat(d.Path)
	if err != nil {
		return res, err
	}
	block := fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
	if !block && !fi.Mode().IsRegular() {
		return res, fmt.Errorf("%s is neither a block device nor a file", d.Path)
	}
	flags := os.O_RDWR | unix.O_CLOEXEC
	if block {
		flags |= unix.O_EXCL
	}
	f, err := os.OpenFile(d.Path, flags, 0)
	if err != nil {
		return res, fmt.Errorf("open %s (is it in use?): %w", d.Path, err)
	}
	defer f.Close()
	size := fi.Size()
	if block {
		var n uint64
		if err := ioctl(f, unix.BLKGETSIZE64, unsafe.Pointer(&n)); err != nil {
			return res, fmt.Errorf("%s: size: %w", d.Path, err)
		}
		size = int64(n)
	}
	res.SizeBytes = size
	if mode == protocol.WipeDiscard {
		if !block {
			return res, fmt.Errorf("%s is not a block device: nothing to discard", d.Path)
		}
		r := [2]uint64{0, uint64(size)}
		if err := ioctl(f, unix.BLKDISCARD, unsafe.Pointer(&r)); err != nil {
			return res, fmt.Errorf("%s: discard: %w", d.Path, err)
		}
		res.Discarded = true
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	zeros := make([]byte, wipeSpan)
	head := min(int64(wipeSpan), size)
	if _, err := f.WriteAt(zeros[:head], 0); err != nil {
		return res, fmt.Errorf("%s: zero the start: %w", d.Path, err)
	}
	res.Zeroed = head
	if tail := min(int64(wipeSpan), size-head); tail > 0 {
		if _, err := f.WriteAt(zeros[:tail], size-tail); err != nil {
			return res, fmt.Errorf("%s: zero the end: %w", d.Path, err)
		}
		res.Zeroed += tail
	}
	if err := f.Sync(); err != nil {
		return res, fmt.Errorf("%s: fsync: %w", d.Path, err)
	}
	if block {
		// The kernel forgets the old partitions; a disk with partitions in use
		// refuses, which the O_EXCL open has ruled out.
		_ = ioctl(f, unix.BLKRRPART, nil)
	}
	return res, nil
}

func ioctl(f *os.File, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}
