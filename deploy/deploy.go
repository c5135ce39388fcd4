package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/better-compute/bcd/internal/efiboot"
	"github.com/better-compute/bcd/protocol"
	"github.com/u-root/u-root/pkg/efivarfs"
)

// Deployer runs deploy.image commands. The zero value deploys onto this machine's
// disks with its kernel; the fields inject what a test replaces.
type Deployer struct {
	// Disks lists the disks a target by serial or by size is chosen from; nil reads
	// /sys/block (SysBlock{}.List).
	Disks func() ([]Disk, error)
	// Transport fetches the image; nil is an http.Transport that dials through the
	// proxy (params.Proxy, else Proxy) with TLSConfig.
	Transport http.RoundTripper
	// TLSConfig verifies https image servers; nil means the system roots.
	TLSConfig *tls.Config
	// Proxy is the HTTP proxy used when the params name none: the ramdisk passes the
	// site agent's (bcd.proxy). nil dials directly.
	Proxy *url.URL
	// NodeAgentTrust, when set, also accepts the server certificate chain
	// of a node agent download that the system roots do not: the ramdisk
	// checks it against the serving CA pin, since the control plane serves
	// releases under its own CA.
	NodeAgentTrust func(chain []*x509.Certificate, serverName string) error
	// AllowHTTP permits http:// image URLs. The ramdisk sets it only when it fetches
	// through its site proxy, and in a fakehw build: the digest still guards the
	// bytes, but https keeps the image private on the way.
	AllowHTTP bool
	// AllowFileTarget lets target.path name a regular file, which becomes exactly
	// the image (tests, benchmarks, building a disk image). A ramdisk leaves it off.
	AllowFileTarget bool
	// Machine kexecs, reboots and powers off; nil is HostMachine.
	Machine Machine
	// TempDir holds the private directory for files handed to debugfs and mtools
	// and the kernel read back from the disk; "" is os.TempDir().
	TempDir string
	// ProcCmdline is read for console= parameters to carry into a command line the
	// image does not provide; "" is /proc/cmdline.
	ProcCmdline string
	// Log receives one line per step, never a file's content; nil discards.
	Log *slog.Logger
	// BufferSize and Buffers size the ring between download and disk (default 8
	// buffers of 4 MiB); Writers is how many writes are in flight (default 2).
	BufferSize, Buffers, Writers int
	// StallTimeout cancels a download that receives nothing for this long (default
	// one minute).
	StallTimeout time.Duration
	// PureGoXZ decodes xz in Go even when the xz tool is on PATH.
	PureGoXZ bool
	// QCOW2Hold bounds the memory that holds a qcow2 image's clusters which
	// arrive before the table that maps them (default DefaultQCOW2Hold, 64 MiB);
	// an image whose layout needs more is refused.
	QCOW2Hold int64
	// SkipFsck skips the e2fsck -fn that follows writing into the root filesystem.
	SkipFsck bool
	// ProgressInterval is the least time between two progress calls (default 250ms).
	ProgressInterval time.Duration
	// UEFI is the firmware's boot variables (internal/efiboot): on a UEFI
	// machine a deploy leaves network boot first, then one entry for the OS it
	// installed. nil is a BIOS machine, or one whose variables could not be
	// opened: UEFIErr says why, and the deploy warns.
	UEFI    efivarfs.EFIVar
	UEFIErr error
	// NICs are the machine's MACs: the network entry to put first is one of
	// theirs when BootCurrent names none.
	NICs []net.HardwareAddr
}

// Stages a deploy reports progress in.
const (
	StageSelect     = "select"
	StageWrite      = "write"
	StageVerify     = "verify"
	StagePartitions = "partitions"
	StageFiles      = "files"
	StageKernel     = "kernel"
	StageDone       = "done"
)

// Progress is a deploy's progress, at most every ProgressInterval and at each
// stage.
type Progress struct {
	Stage string
	// Done of Total image bytes are written; Received bytes have been downloaded.
	Done, Total int64
	Received    int64
	// Rate is image bytes per second since the write began.
	Rate    float64
	Elapsed time.Duration
}

type reporter struct {
	fn          func(Progress)
	stage       string
	total       int64
	start, last time.Time
	every       time.Duration
	done, rcvd  int64
}

func (r *reporter) setStage(s string) {
	r.stage = s
	r.update(r.done, r.rcvd, true)
}

func (r *reporter) update(done, received int64, force bool) {
	r.done, r.rcvd = done, received
	if r.fn == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(r.last) < r.every {
		return
	}
	r.last = now
	el := now.Sub(r.start)
	var rate float64
	if el > 0 {
		rate = float64(done) / el.Seconds()
	}
	r.fn(Progress{Stage: r.stage, Done: done, Total: r.total, Received: received, Rate: rate, Elapsed: el})
}

// Result is a deploy that succeeded. Finish carries out its After. Its fields are
// named as the Request names the same things (Target, ImageSize, Size, SHA256).
type Result struct {
	// Target is the disk (or file) written: Target.Path always, the rest where
	// the disk reports it.
	Target Disk
	// ImageSize bytes of image were written from Size served bytes whose SHA-256
	// is SHA256.
	ImageSize int64
	Size      int64
	SHA256    string
	Duration  time.Duration
	// Root and ESP are the partitions found (ESP.Number 0: none).
	Root, ESP Partition
	RootFound bool
	PartUUID  string
	// Files are the files written, as fs:path.
	Files []string
	// Kernel, Initrd and Cmdline are what was loaded for kexec, and where they
	// came from.
	Kernel, Initrd, Cmdline, KernelSource string
	// Direct says the image was written with O_DIRECT; SkippedZeros that zero
	// blocks were skipped on a target zeroed first.
	Direct, SkippedZeros bool
	// Wiped names the old signatures removed from the disk before the write:
	// "gpt", "lvm2 on old partition 2", "md 1.2 on old partition 3".
	Wiped []string
	// After is the action Finish takes.
	After string
	// BootOrder says how a UEFI machine's boot order was left (efiboot's
	// summary); empty on BIOS or where it could not be kept (a warning says why).
	BootOrder string
	// Warnings are what went wrong without failing the deploy.
	Warnings []string
}

func (d *Deployer) machine() Machine {
	if d.Machine != nil {
		return d.Machine
	}
	return HostMachine{}
}

func (d *Deployer) log() *slog.Logger {
	if d.Log != nil {
		return d.Log
	}
	return slog.New(slog.DiscardHandler)
}

func parseProxy(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("proxy: want an http:// or https:// URL")
	}
	return u, nil
}

// Deploy streams the image onto the selected disk, verifies it, writes the files
// into the installed filesystems and, for a kexec, loads the installed kernel. It
// does not reboot or jump: the caller reports the result first, then calls Finish.
//
// On any failure after the disk was opened, the disk is wiped at both ends (see
// target.wipe) before Deploy returns, so a half-written image never boots.
func (d *Deployer) Deploy(ctx context.Context, p Request, progress func(Progress)) (res Result, err error) {
	start := time.Now()
	if err := p.Validate(); err != nil {
		return res, failf(reasonInvalid, "%v", err)
	}
	if err := d.policy(&p); err != nil {
		return res, err
	}
	img := p.Image
	imageSize := img.ImageSize
	if imageSize == 0 {
		imageSize = img.Size
	}
	every := d.ProgressInterval
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	rep := &reporter{fn: progress, total: imageSize, start: start, every: every}
	rep.setStage(StageSelect)
	log := d.log().With("url", protocol.RedactURL(img.URL))

	path, disk, block, err := d.selectTarget(p.Target, imageSize)
	if err != nil {
		return res, err
	}
	res.Target, res.After = disk, p.After.Action
	if res.After == "" {
		res.After = protocol.AfterNone
	}
	log = log.With("target", path)

	// Start the download before touching the disk: a missing image or a refusing
	// server leaves the machine's disk as it was.
	dlCtx, dlCancel := context.WithCancel(ctx)
	defer dlCancel()
	resp, err := d.fetch(dlCtx, &p)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	stallDur := d.StallTimeout
	if stallDur <= 0 {
		stallDur = time.Minute
	}
	var stalled atomic.Bool
	src := &source{body: resp.Body, hash: sha256.New(), limit: img.Size, stallDur: stallDur,
		deferHash: true}
	src.stall = time.AfterFunc(stallDur, func() { stalled.Store(true); dlCancel() })
	defer src.stall.Stop()
	br := bufio.NewReaderSize(src, 1<<20)
	magic, _ := br.Peek(8)
	format := img.Format
	if format == "" {
		format = sniffFormat(magic)
	}
	pending, _ := br.Peek(br.Buffered())
	// stream is what the decoder reads. A raw image goes from the socket straight
	// into the ring's buffers once the peeked bytes are out: through br, every
	// chunk's last part would be copied twice.
	stream := io.Reader(br)
	if format == protocol.FormatRaw {
		stream = io.MultiReader(bytes.NewReader(pending), src)
	} else {
		// Compressed: the decoder reads the served bytes, which are hashed as read.
		if err := src.hashInline(pending); err != nil {
			return res, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
		}
	}
	streamErr := func(reason, problem string, cause error) error {
		st := src.state()
		return &Error{Reason: reason, Err: &StreamError{URL: protocol.RedactURL(img.URL), Problem: problem,
			ExpectedSHA256: img.SHA256, ActualSHA256: st.sum, Received: st.hashed, ExpectedSize: img.Size, Err: cause}}
	}
	if len(magic) > 0 {
		if err := checkMagic(format, magic); err != nil {
			return res, streamErr(reasonDecompress, "wrong format", err)
		}
	}
	var qh *qcow2Header
	if format == protocol.FormatQCOW2 {
		// The header says the virtual size and whether the image can be
		// converted at all: refused here, the disk is left as it was.
		hb, _ := br.Peek(qcow2HeaderPeek)
		if qh, err = parseQCOW2Header(hb); err != nil {
			qe := err.(*qcow2Error)
			return res, &Error{Reason: qe.reason, Err: fmt.Errorf("deploy: image %s: %w", protocol.RedactURL(img.URL), err)}
		}
		if img.ImageSize != 0 && img.ImageSize != qh.size {
			return res, failf(reasonInvalid, "image.image_size: %d differs from the qcow2 header's virtual size %d", img.ImageSize, qh.size)
		}
		if imageSize != qh.size {
			// The disk was chosen for the served size: choose again for the
			// virtual one.
			imageSize = qh.size
			rep.total = imageSize
			if path, disk, block, err = d.selectTarget(p.Target, imageSize); err != nil {
				return res, err
			}
			res.Target = disk
			log = log.With("target", path)
		}
	} else if format != protocol.FormatRaw && img.ImageSize == 0 {
		return res, failf(reasonInvalid, "image.image_size: required for a %s image", format)
	}
	if format == protocol.FormatRaw && img.ImageSize != 0 && img.ImageSize != img.Size {
		return res, failf(reasonInvalid, "image.image_size: %d differs from image.size %d for a raw image", img.ImageSize, img.Size)
	}

	t, err := d.openTarget(path, block, imageSize)
	if err != nil {
		return res, err
	}
	defer t.close()
	defer func() {
		if err == nil {
			return
		}
		log.Error("deploy failed; wiping the disk's partition tables", "err", err)
		if werr := t.wipe(imageSize); werr != nil {
			err = fmt.Errorf("%w (and wiping the disk failed: %v)", err, werr)
		}
	}()
	res.Direct, res.SkippedZeros = isDirect(t.direct), t.zeroed
	res.Wiped = t.wiped
	if len(t.wiped) > 0 {
		log.Info("deploy: removed old signatures", "wiped", strings.Join(t.wiped, ", "))
	}
	log.Info("deploy: writing", "format", format, "image_size", imageSize, "direct", res.Direct, "skip_zeros", t.zeroed)

	rep.setStage(StageWrite)
	writeStart := time.Now()
	var head []byte
	if qh != nil {
		head, err = d.writeQCOW2(dlCtx, qh, stream, t, imageSize, img.Size, rep, src)
		if err != nil {
			dlCancel()
		} else {
			_, _ = io.Copy(io.Discard, stream) // a failure is recorded by the source
		}
	} else {
		dec, derr := d.newDecoder(dlCtx, format, stream)
		if derr != nil {
			if _, ok := derr.(*Error); ok {
				return res, derr
			}
			return res, streamErr(reasonDecompress, "corrupt compressed stream", derr)
		}
		head, err = d.copyRaw(ctx, dec, t, imageSize, rep, src, dlCancel, stream)
	}
	src.stall.Stop()
	st := src.state()
	received, sum, srcErr := st.hashed, st.sum, st.err
	var se *sizeError
	var de *decodeError
	var short *shortError
	var qe *qcow2Error
	switch {
	case err == nil && srcErr == nil:
	case ctx.Err() != nil:
		return res, streamErr(reasonCancelled, "cancelled", ctx.Err())
	case st.tooLong:
		return res, streamErr(reasonSize, "longer than promised", srcErr)
	case stalled.Load():
		return res, streamErr(reasonDownload, "download failed", fmt.Errorf("nothing received for %s", stallDur))
	case srcErr != nil:
		return res, streamErr(reasonDownload, "download failed", srcErr)
	case st.eof && received < img.Size:
		return res, streamErr(reasonSize, "truncated", err)
	case errors.As(err, &se), errors.As(err, &short):
		return res, streamErr(reasonSize, "size mismatch", err)
	case errors.As(err, &de):
		return res, streamErr(reasonDecompress, "corrupt compressed stream", err)
	case errors.As(err, &qe):
		return res, &Error{Reason: qe.reason, Err: fmt.Errorf("deploy: image %s: %w", protocol.RedactURL(img.URL), err)}
	default:
		return res, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %s: %w", path, err)}
	}
	rep.setStage(StageVerify)
	res.Size, res.SHA256, res.ImageSize = received, sum, imageSize
	if received != img.Size {
		return res, streamErr(reasonSize, "truncated", nil)
	}
	if sum != img.SHA256 {
		return res, streamErr(reasonDigest, "sha256 mismatch", nil)
	}
	// Verified: now the partition table may exist.
	streamed := time.Since(writeStart)
	if err := t.writeAt(head, 0); err != nil {
		return res, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
	}
	syncStart := time.Now()
	if err := t.sync(); err != nil {
		return res, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
	}
	rep.update(imageSize, received, true)

	// The stream and the final fsync apart: where a slow deploy spent its time.
	log.Info("deploy: image written and verified", "bytes", imageSize, "sha256", res.SHA256, "seconds", time.Since(start).Seconds(),
		"stream_seconds", streamed.Seconds(), "fsync_seconds", time.Since(syncStart).Seconds())

	rep.setStage(StagePartitions)
	// A private (0700) directory for what debugfs and mtools read and write.
	tmp, err := os.MkdirTemp(d.TempDir, "bcd-deploy-")
	if err != nil {
		return res, &Error{Reason: reasonFiles, Err: fmt.Errorf("deploy: private temp dir: %w", err)}
	}
	defer os.RemoveAll(tmp)
	inst, err := d.openInstalled(ctx, t, imageSize, &p, tmp, &res)
	if err != nil {
		return res, err
	}
	rep.setStage(StageFiles)
	files := p.Files
	var links []extWrite
	if p.NodeAgent != nil {
		agent, err := d.fetchNodeAgent(ctx, &p, tmp)
		if err != nil {
			return res, err
		}
		var add []File
		proxy := ""
		if u := d.proxyFor(&p); u != nil {
			proxy = u.String()
		}
		if add, links, err = nodeAgentFiles(agent, proxy); err != nil {
			return res, err
		}
		files = append(add, files...)
	}
	boot := d.planBoot(ctx, inst, &p, &res)
	if boot != nil && inst.root != nil {
		files = append(files, File{FS: protocol.FSRoot, Path: efiboot.RecordPath, Mode: 0o644, Content: boot.RecordFile()})
	}
	if err := d.writeFiles(ctx, inst, files, links, tmp, &res); err != nil {
		return res, err
	}
	if w := d.checkCloudInit(ctx, inst, files, tmp); w != "" {
		res.Warnings = append(res.Warnings, w)
	}
	if p.After.Action == protocol.AfterKexec {
		rep.setStage(StageKernel)
		if err := d.loadKernel(ctx, inst, p.After, tmp, &res); err != nil {
			return res, err
		}
	}
	if err := t.sync(); err != nil {
		return res, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
	}
	// The boot order last: only a disk that is good gets an entry.
	d.applyBoot(boot, &res)
	res.Duration = time.Since(start)
	rep.setStage(StageDone)
	log.Info("deploy: done", "seconds", res.Duration.Seconds(), "after", res.After)
	return res, nil
}

// copyRaw writes a raw or compressed raw image through dec, and drains what the
// server sends after its end.
func (d *Deployer) copyRaw(ctx context.Context, dec *decoder, t *target, imageSize int64, rep *reporter, src *source, dlCancel func(), stream io.Reader) ([]byte, error) {
	head, _, err := d.copyImage(ctx, dec, t, imageSize, rep, src, dlCancel)
	var short *shortError
	if err == nil || errors.As(err, &short) {
		// The decoder's output ended: xz has exited, and its status says whether
		// the stream was whole.
		if ferr := dec.finish(); ferr != nil {
			err = &decodeError{ferr}
		}
	}
	if err != nil {
		dlCancel()
	}
	// Nothing may read the source once we look at it: the zstd decoder reads ahead
	// in goroutines of its own, and Close waits for them.
	dec.close()
	if err == nil {
		// What the server still sends after the image's end counts for the digest.
		_, _ = io.Copy(io.Discard, stream) // a failure is recorded by the source
	}
	return head, err
}

// policy applies what the agent allows on top of the params' own validity.
func (d *Deployer) policy(p *Request) error {
	u, _ := url.Parse(p.Image.URL)
	if u.Scheme == "http" && !d.AllowHTTP {
		return failf(reasonInvalid, "image %s: http is not allowed here, want https", protocol.RedactURL(p.Image.URL))
	}
	if p.Proxy != "" {
		if _, err := parseProxy(p.Proxy); err != nil {
			return failf(reasonInvalid, "%v", err)
		}
	}
	return nil
}

// selectTarget finds the disk: by path (a block device, or a file when allowed), by
// serial, or the smallest that fits.
func (d *Deployer) selectTarget(sel Target, imageSize int64) (path string, disk Disk, block bool, err error) {
	list := d.Disks
	if list == nil {
		list = SysBlock{}.List
	}
	if sel.Path != "" {
		real, err := filepath.EvalSymlinks(sel.Path)
		if errors.Is(err, os.ErrNotExist) && d.AllowFileTarget {
			// A new image file.
			dir, derr := filepath.EvalSymlinks(filepath.Dir(sel.Path))
			if derr != nil {
				return "", Disk{}, false, failf(reasonNoDisk, "target.path %s: %v", sel.Path, derr)
			}
			real := filepath.Join(dir, filepath.Base(sel.Path))
			return real, Disk{Path: real}, false, nil
		}
		if err != nil {
			return "", Disk{}, false, failf(reasonNoDisk, "target.path %s: %v", sel.Path, err)
		}
		st, err := os.Stat(real)
		if err != nil {
			return "", Disk{}, false, failf(reasonNoDisk, "target.path %s: %v", sel.Path, err)
		}
		if st.Mode().IsRegular() {
			if !d.AllowFileTarget {
				return "", Disk{}, false, failf(reasonNoDisk, "target.path %s is a file, not a disk", sel.Path)
			}
			return real, Disk{Path: real}, false, nil
		}
		name, part, err := blockDiskName(real)
		if err != nil {
			return "", Disk{}, false, failf(reasonNoDisk, "target.path %s: %v", sel.Path, err)
		}
		if part {
			return "", Disk{}, false, failf(reasonNoDisk, "target.path %s is a partition, not a whole disk", sel.Path)
		}
		disk, err := SysBlock{}.Disk(name)
		if err != nil {
			return "", Disk{}, false, failf(reasonNoDisk, "target.path %s: %v", sel.Path, err)
		}
		disk.Path = real
		if disk, err = checkDisk(disk, imageSize); err != nil {
			return "", Disk{}, false, failf(reasonNoDisk, "%v", err)
		}
		disk.ChosenBy = "path " + sel.Path
		return real, disk, true, nil
	}
	disks, err := list()
	if err != nil {
		return "", Disk{}, false, failf(reasonNoDisk, "%v", err)
	}
	disk, why, err := SelectDiskWhy(disks, sel, imageSize)
	if err != nil {
		return "", Disk{}, false, failf(reasonNoDisk, "%v", err)
	}
	disk.ChosenBy = why
	return disk.Path, disk, true, nil
}

// openTarget opens the disk and prepares it: old signatures removed (see
// target.wipeOld), both ends zeroed at once, so that an
// interrupted deploy (power lost mid-write) leaves no partition table either, and
// the image's range zeroed where the device does that cheaply, so that zero blocks
// of the image need no write.
func (d *Deployer) openTarget(path string, block bool, imageSize int64) (*target, error) {
	t := &target{path: path, block: block}
	var err error
	if !block {
		t.direct, t.buffered, err = openFileTarget(path, imageSize)
		if err != nil {
			return nil, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
		}
		t.size, t.sectorSize, t.zeroed = imageSize, 0, true
		return t, nil
	}
	t.direct, t.buffered, err = openBlock(path)
	if err != nil {
		return nil, &Error{Reason: reasonNoDisk, Err: fmt.Errorf("deploy: %w", err)}
	}
	t.size, t.sectorSize, err = blockSize(t.direct)
	if err != nil {
		t.close()
		return nil, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %s: %w", path, err)}
	}
	if t.size < imageSize {
		t.close()
		return nil, failf(reasonNoDisk, "%s holds %d bytes, the image needs %d", path, t.size, imageSize)
	}
	if t.wiped, err = t.wipeOld(); err != nil {
		t.close()
		return nil, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
	}
	if err := t.wipe(0); err != nil {
		t.close()
		return nil, &Error{Reason: reasonWrite, Err: fmt.Errorf("deploy: %w", err)}
	}
	if writeZeroesOffloaded(t.direct) {
		n := (imageSize + int64(t.sectorSize) - 1) / int64(t.sectorSize) * int64(t.sectorSize)
		if err := zeroOut(t.direct, 0, min(n, t.size)); err == nil {
			t.zeroed = true
		}
	}
	return t, nil
}
