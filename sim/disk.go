package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

// SIMULATED DISK. simDisk is the ramdisk's Deployer for a machine that has no disk:
// deploy.image's image is streamed over HTTP as the real one is, its SHA-256 and
// size checked, and its bytes written to a sparse file (Disk set: zero blocks are
// skipped with a seek) or only hashed (Disk empty); the deploy's files, which the
// real deployer writes into the installed root filesystem with debugfs, go under
// Root, a directory standing for that filesystem. "kexec" hands the machine to
// its installed OS (handOver).
type simDisk struct {
	Root   string
	Disk   string
	Client *http.Client
	// handOver is called by Finish for kexec or reboot: the machine boots its OS.
	handOver func(after string)
}

func errDeploy(reason, format string, args ...any) error {
	return &deploy.Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

func (d *simDisk) Deploy(ctx context.Context, r deploy.Request, progress func(deploy.Progress)) (deploy.Result, error) {
	start := time.Now()
	res := deploy.Result{Target: deploy.Disk{Path: "/dev/simdisk", Name: "simdisk"}, After: r.After.Action}
	if res.After == "" {
		res.After = protocol.AfterNone
	}
	if r.Image.Format != "" && r.Image.Format != protocol.FormatRaw {
		return res, errDeploy(protocol.DeployReasonNotImplemented, "sim: the simulated disk takes raw images, not %s", r.Image.Format)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.Image.URL, nil)
	if err != nil {
		return res, errDeploy(protocol.DeployReasonInvalid, "sim: image url: %v", err)
	}
	resp, err := d.Client.Do(req)
	if err != nil {
		return res, errDeploy(protocol.DeployReasonDownload, "sim: image %s: %v", protocol.RedactURL(r.Image.URL), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, errDeploy(protocol.DeployReasonDownload, "sim: image %s: %s", protocol.RedactURL(r.Image.URL), resp.Status)
	}
	h := sha256.New()
	var w io.Writer = h
	var f *os.File
	if d.Disk != "" {
		if f, err = os.Create(d.Disk); err != nil {
			return res, errDeploy(protocol.DeployReasonWrite, "sim: %v", err)
		}
		defer f.Close()
		w = io.MultiWriter(h, &sparseWriter{f: f})
	}
	buf := make([]byte, 256<<10)
	var n int64
	last := time.Now()
	for {
		k, rerr := resp.Body.Read(buf)
		if k > 0 {
			if n+int64(k) > r.Image.Size {
				return res, errDeploy(protocol.DeployReasonSize, "sim: image longer than its size %d", r.Image.Size)
			}
			w.Write(buf[:k])
			n += int64(k)
			if progress != nil && time.Since(last) > time.Second {
				last = time.Now()
				progress(deploy.Progress{Stage: deploy.StageWrite, Done: n, Total: r.Image.Size, Received: n, Elapsed: time.Since(start)})
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return res, errDeploy(protocol.DeployReasonDownload, "sim: image: %v after %d bytes", rerr, n)
		}
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if n != r.Image.Size {
		return res, errDeploy(protocol.DeployReasonSize, "sim: image truncated: %d of %d bytes", n, r.Image.Size)
	}
	if sum != r.Image.SHA256 {
		return res, errDeploy(protocol.DeployReasonDigest, "sim: image sha256 %s, want %s", sum, r.Image.SHA256)
	}
	if f != nil {
		if err := f.Truncate(n); err != nil {
			return res, errDeploy(protocol.DeployReasonWrite, "sim: %v", err)
		}
	}
	for _, file := range r.Files {
		if file.FS != "" && file.FS != protocol.FSRoot {
			continue // the ESP: nothing of the simulated OS reads it
		}
		p := filepath.Join(d.Root, filepath.Clean("/"+file.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return res, errDeploy(protocol.DeployReasonFiles, "sim: %v", err)
		}
		mode := os.FileMode(file.Mode & 0o777)
		if mode == 0 {
			mode = 0o644
		}
		if err := os.WriteFile(p, file.Content, mode); err != nil {
			return res, errDeploy(protocol.DeployReasonFiles, "sim: %v", err)
		}
		os.Chmod(p, mode)
		res.Files = append(res.Files, "root:"+file.Path)
	}
	res.ImageSize, res.Size, res.SHA256, res.Duration = n, n, sum, time.Since(start)
	if res.After == protocol.AfterKexec {
		res.Kernel, res.KernelSource = "/boot/vmlinuz (simulated)", "sim"
	}
	if progress != nil {
		progress(deploy.Progress{Stage: deploy.StageDone, Done: n, Total: n, Received: n, Elapsed: res.Duration})
	}
	return res, nil
}

// Finish "kexecs": the machine leaves its ramdisk for the installed OS.
func (d *simDisk) Finish(res deploy.Result) error {
	switch res.After {
	case protocol.AfterKexec, protocol.AfterReboot:
		d.handOver(res.After)
	}
	return nil
}

// sparseWriter writes to f, seeking over all-zero blocks so the file stays sparse.
type sparseWriter struct {
	f   *os.File
	off int64
}

func (s *sparseWriter) Write(p []byte) (int, error) {
	const blk = 4096
	for i := 0; i < len(p); i += blk {
		end := min(i+blk, len(p))
		b := p[i:end]
		if !allZero(b) {
			if _, err := s.f.WriteAt(b, s.off); err != nil {
				return i, err
			}
		}
		s.off += int64(len(b))
	}
	return len(p), nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
