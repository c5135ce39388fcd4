package deploy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

func ioctlPtr(f *os.File, req uintptr, arg unsafe.Pointer) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if cerr := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg))
	}); cerr != nil {
		return cerr
	}
	if errno != 0 {
		return errno
	}
	return nil
}

// blockSize returns a block device's size in bytes and its logical sector size.
func blockSize(f *os.File) (int64, int, error) {
	var size uint64
	if err := ioctlPtr(f, unix.BLKGETSIZE64, unsafe.Pointer(&size)); err != nil {
		return 0, 0, fmt.Errorf("BLKGETSIZE64: %w", err)
	}
	var ss int32
	if err := ioctlPtr(f, unix.BLKSSZGET, unsafe.Pointer(&ss)); err != nil {
		return 0, 0, fmt.Errorf("BLKSSZGET: %w", err)
	}
	if ss < 512 || ss > 65536 || ss&(ss-1) != 0 {
		return 0, 0, fmt.Errorf("BLKSSZGET: logical sector size %d", ss)
	}
	return int64(size), int(ss), nil
}

// zeroOut has the device zero [off, off+n): with REQ_OP_WRITE_ZEROES (an unmap on
// most SSDs, a hole punch under a loop device) this takes moments whatever n is.
func zeroOut(f *os.File, off, n int64) error {
	r := [2]uint64{uint64(off), uint64(n)}
	if err := ioctlPtr(f, unix.BLKZEROOUT, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("BLKZEROOUT: %w", err)
	}
	return nil
}

// rereadPartitions asks the kernel to re-read the partition table. Through our own
// exclusive descriptor the kernel needs no further claim on the disk.
func rereadPartitions(f *os.File) error {
	var err error
	for i := 0; i < 5; i++ {
		if err = ioctlPtr(f, unix.BLKRRPART, nil); !errors.Is(err, unix.EBUSY) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("BLKRRPART: %w", err)
	}
	return nil
}

// sysfsDir returns /sys/dev/block/MAJ:MIN for a block device.
func sysfsDir(f *os.File) (string, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}

// writeZeroesOffloaded reports whether the device zeroes ranges without writing
// them: only then is zeroing the image's range first cheaper than writing zeros.
func writeZeroesOffloaded(f *os.File) bool {
	dir, err := sysfsDir(f)
	if err != nil {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "queue/write_zeroes_max_bytes"))
	if err != nil {
		return false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return err == nil && n > 0
}

// blockDiskName resolves a block device node to its kernel name and whether it is
// a partition rather than a whole disk.
func blockDiskName(path string) (name string, partition bool, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return "", false, fmt.Errorf("%s is not a block device", path)
	}
	dir := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", false, fmt.Errorf("%s: %w", path, err)
	}
	_, perr := os.Stat(filepath.Join(real, "partition"))
	return filepath.Base(real), perr == nil, nil
}

// openBlock opens a whole disk for writing: exclusively, so that it fails while any
// of its partitions is mounted or held, and with O_DIRECT where the device takes it.
func openBlock(path string) (direct, buffered *os.File, err error) {
	flags := os.O_RDWR | unix.O_EXCL | unix.O_CLOEXEC
	direct, err = os.OpenFile(path, flags|unix.O_DIRECT, 0)
	if errors.Is(err, unix.EINVAL) {
		direct, err = os.OpenFile(path, flags, 0)
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, nil, fmt.Errorf("open %s: in use (a partition is mounted or held): %w", path, err)
		}
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	// A second, buffered descriptor for writes O_DIRECT cannot take (an unaligned
	// tail, a GPT header); it shares the device's page cache with debugfs and mtools.
	buffered, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		direct.Close()
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	return direct, buffered, nil
}

// openFileTarget makes path a fresh sparse file of size bytes: a hole reads as
// zeros, so zero blocks of the image need no write.
func openFileTarget(path string, size int64) (direct, buffered *os.File, err error) {
	buffered, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := buffered.Truncate(0); err != nil {
		buffered.Close()
		return nil, nil, fmt.Errorf("truncate %s: %w", path, err)
	}
	if err := buffered.Truncate(size); err != nil {
		buffered.Close()
		return nil, nil, fmt.Errorf("truncate %s: %w", path, err)
	}
	direct, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if err != nil {
		// tmpfs before 6.6 and some FUSE filesystems refuse O_DIRECT.
		direct, err = os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			buffered.Close()
			return nil, nil, fmt.Errorf("open %s: %w", path, err)
		}
	}
	return direct, buffered, nil
}

func isDirect(f *os.File) bool {
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	return err == nil && fl&unix.O_DIRECT != 0
}
