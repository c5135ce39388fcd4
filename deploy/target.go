package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"
)

const (
	mib = 1 << 20
	// wipeSize is zeroed at both ends of a disk: the protective MBR and primary GPT
	// at the start, the backup GPT at the end.
	wipeSize = 1 * mib
	// align is what O_DIRECT needs of buffers, offsets and lengths on any disk
	// (4096-byte logical sectors included).
	align = 4096
	// zeroBlock is the granularity of zero skipping: fine enough to skip the free
	// blocks of a filesystem image, coarse enough that a run of data is one write.
	zeroBlock = 64 << 10
	// minSkip is the shortest zero gap between data worth a second write.
	minSkip = 256 << 10
)

// target is the disk (or, for tests and benchmarks, the file) being written.
type target struct {
	path  string
	block bool
	// direct has O_DIRECT where the device takes it; buffered is a second
	// descriptor for what O_DIRECT cannot write (unaligned pieces).
	direct, buffered *os.File
	size             int64 // the disk's size, or the file's
	sectorSize       int
	// zeroed: the image's whole range reads as zeros before the write, so zero
	// blocks need not be written.
	zeroed bool
	// wiped names the old signatures removed when the disk was opened.
	wiped []string
}

func (t *target) close() {
	if t.direct != nil {
		t.direct.Close()
	}
	if t.buffered != nil {
		t.buffered.Close()
	}
}

// alignedBuffer returns n bytes starting at an address O_DIRECT accepts.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+align)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & (align - 1))
	return b[off : off+n : off+n]
}

// writeAt writes p at off, through O_DIRECT when the write is aligned.
func (t *target) writeAt(p []byte, off int64) error {
	f := t.buffered
	if len(p) > 0 && off%align == 0 && len(p)%align == 0 && uintptr(unsafe.Pointer(&p[0]))%align == 0 {
		f = t.direct
	}
	for len(p) > 0 {
		n, err := f.WriteAt(p, off)
		if err != nil {
			return fmt.Errorf("write %s at %d: %w", t.path, off, err)
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// writeSkippingZeros writes the non-zero runs of p at off, on a target known to
// be zero; otherwise it writes p whole. Zeros are found in zeroBlock steps, and a
// zero gap shorter than minSkip between data is written rather than skipped: one
// larger write costs less than two.
func (t *target) writeSkippingZeros(p []byte, off int64, zeros []byte) (int64, error) {
	if !t.zeroed {
		return int64(len(p)), t.writeAt(p, off)
	}
	var written int64
	runStart, zeroStart := -1, -1
	flush := func(end int) error {
		if runStart < 0 {
			return nil
		}
		err := t.writeAt(p[runStart:end], off+int64(runStart))
		written += int64(end - runStart)
		runStart = -1
		return err
	}
	for i := 0; i < len(p); i += zeroBlock {
		end := min(i+zeroBlock, len(p))
		if bytes.Equal(p[i:end], zeros[:end-i]) {
			if zeroStart < 0 {
				zeroStart = i
			}
			continue
		}
		if zeroStart >= 0 {
			if runStart < 0 || i-zeroStart >= minSkip {
				if err := flush(zeroStart); err != nil {
					return written, err
				}
			}
			zeroStart = -1
		}
		if runStart < 0 {
			runStart = i
		}
	}
	if zeroStart >= 0 {
		return written, flush(zeroStart)
	}
	return written, flush(len(p))
}

func (t *target) sync() error {
	if err := t.buffered.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", t.path, err)
	}
	if err := t.direct.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", t.path, err)
	}
	return nil
}

// wipe makes a failed deploy unbootable: it zeros the first and last MiB of the
// disk (protective MBR, primary and backup GPT) and the last MiB of what the image
// covered (where its own backup GPT went), then syncs. It runs without the deploy's
// context, which may be what was cancelled.
func (t *target) wipe(imageEnd int64) error {
	zero := make([]byte, wipeSize)
	var errs []error
	ranges := [][2]int64{{0, min(wipeSize, t.size)}, {max(0, t.size-wipeSize), t.size}}
	if imageEnd > 0 && imageEnd < t.size {
		ranges = append(ranges, [2]int64{max(0, imageEnd-wipeSize), imageEnd})
	}
	for _, r := range ranges {
		if _, err := t.buffered.WriteAt(zero[:r[1]-r[0]], r[0]); err != nil {
			errs = append(errs, fmt.Errorf("zero %s at %d: %w", t.path, r[0], err))
		}
	}
	if err := t.buffered.Sync(); err != nil {
		errs = append(errs, fmt.Errorf("fsync %s: %w", t.path, err))
	}
	if t.block {
		// Let the kernel forget the partitions it may have read from the image.
		_ = rereadPartitions(t.direct)
	}
	return errors.Join(errs...)
}

// readAt reads through the buffered descriptor, which sees every write once synced.
func (t *target) ReadAt(p []byte, off int64) (int, error) { return t.buffered.ReadAt(p, off) }

// WriteAt writes through the buffered descriptor: small metadata writes.
func (t *target) WriteAt(p []byte, off int64) (int, error) { return t.buffered.WriteAt(p, off) }

var _ io.ReaderAt = (*target)(nil)
