// Command deploy benchmarks deploy.image's write path against the tools it
// replaces, in one run on this machine: a 1 GiB image (raw, 75 % zeros, zstd, xz)
// served over HTTP on 127.0.0.1 and written, SHA-256 checked, to a file and (as
// root) to a loop device, next to dd bs=4M oflag=direct (conv=sparse for the
// sparse image), curl | dd (and with a sha256sum beside it, as deploy does), and
// curl | zstd -dc | dd and curl | xz -dc | dd. Each
// case runs -runs times, interleaved; the table shows medians in MB/s (image bytes,
// 10^6 per MB, fsync included) and the ratios the deploy package aims at.
//
//	go run ./bench/deploy [-dir /tmp/bcd-bench-deploy] [-size 1073741824] [-runs 3] [-keep]
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/better-compute/bcd/deploy"
	"github.com/better-compute/bcd/protocol"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench/deploy:", err)
		os.Exit(1)
	}
}

type image struct {
	name, path, format string
	size, imageSize    int64
	sha                string
}

type benchCase struct {
	name  string
	image string // image name, for the deploy cases
	// shell is a command run with sh -c, for the peers; TARGET, IMG, URL replaced.
	shell string
	// prepare runs untimed before each run (removing a file target).
	deploy bool
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	dir := fs.String("dir", "/tmp/bcd-bench-deploy", "where the images, targets and loop backing file go")
	size := fs.Int64("size", 1<<30, "image size in bytes (a multiple of 1 MiB)")
	runs := fs.Int("runs", 3, "runs of each case")
	keep := fs.Bool("keep", false, "keep the images for the next run")
	noLoop := fs.Bool("no-loop", false, "skip the loop device even as root")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, tool := range []string{"dd", "curl", "zstd", "xz", "bash", "tee", "sha256sum"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed", tool)
		}
	}
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(*dir)
	}
	imgs, err := makeImages(*dir, *size)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(*dir))}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()

	targets := []string{filepath.Join(*dir, "target.img")}
	if os.Geteuid() == 0 && !*noLoop {
		dev, detach, err := loopDevice(*dir, *size+64<<20)
		if err != nil {
			fmt.Fprintln(stdout, "no loop device:", err)
		} else {
			defer detach()
			targets = append(targets, dev)
		}
	}

	cases := []benchCase{
		{name: "dd raw", shell: "dd if=IMG:raw of=TARGET bs=4M oflag=direct conv=fsync status=none"},
		{name: "curl | dd raw", shell: "curl -sf URL:raw | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		// What deploy does, in shell: the digest beside the write.
		{name: "curl | tee >(sha256sum) | dd raw", shell: "curl -sf URL:raw | tee >(sha256sum >/dev/null) | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		{name: "deploy raw", image: "raw", deploy: true},
		{name: "dd sparse", shell: "dd if=IMG:sparse of=TARGET bs=4M oflag=direct conv=fsync status=none"},
		{name: "dd sparse (conv=sparse)", shell: "ZERO && dd if=IMG:sparse of=TARGET bs=4M oflag=direct conv=sparse,notrunc,fsync status=none"},
		{name: "curl | dd sparse (conv=sparse)", shell: "ZERO && curl -sf URL:sparse | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=sparse,notrunc,fsync status=none"},
		{name: "deploy sparse", image: "sparse", deploy: true},
		{name: "curl | zstd -dc | dd", shell: "curl -sf URL:zst | zstd -dcq | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		{name: "deploy zstd", image: "zst", deploy: true},
		{name: "curl | xz -dc -T0 | dd", shell: "curl -sf URL:xz | xz -dc -T0 | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		{name: "deploy xz", image: "xz", deploy: true},
	}
	loadBefore := loadavg()
	results := map[string][]float64{} // target|case -> MB/s
	for r := 0; r < *runs; r++ {
		for _, target := range targets {
			for _, c := range cases {
				secs, err := runCase(c, target, imgs, base, *size)
				if err != nil {
					return fmt.Errorf("%s to %s: %w", c.name, target, err)
				}
				mbps := float64(*size) / 1e6 / secs
				results[target+"|"+c.name] = append(results[target+"|"+c.name], mbps)
				fmt.Fprintf(os.Stderr, "run %d %-28s %-40s %7.1f MB/s\n", r+1, c.name, target, mbps)
			}
		}
	}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(stdout, "\n%d MiB image, medians of %d runs, MB/s including fsync; deploy checks SHA-256 of the served bytes\n", *size>>20, *runs)
	// Runs here vary with whatever else the machine does: say how busy it was.
	fmt.Fprintf(stdout, "load average before %s, after %s, %d CPUs\n", loadBefore, loadavg(), runtime.NumCPU())
	for _, target := range targets {
		kind := "file"
		if strings.HasPrefix(target, "/dev/") {
			kind = "loop device"
		}
		fmt.Fprintf(tw, "%s (%s)\t\t\n", kind, target)
		for _, c := range cases {
			fmt.Fprintf(tw, "%s\t%.0f\t\n", c.name, median(results[target+"|"+c.name]))
		}
		m := func(name string) float64 { return median(results[target+"|"+name]) }
		fmt.Fprintf(tw, "ratio deploy raw / dd raw (aim >= 0.95)\t%.2f\t\n", m("deploy raw")/m("dd raw"))
		fmt.Fprintf(tw, "ratio deploy raw / curl | dd\t%.2f\t\n", m("deploy raw")/m("curl | dd raw"))
		fmt.Fprintf(tw, "ratio deploy raw / curl | tee >(sha256sum) | dd\t%.2f\t\n", m("deploy raw")/m("curl | tee >(sha256sum) | dd raw"))
		fmt.Fprintf(tw, "ratio deploy sparse / curl | dd conv=sparse\t%.2f\t\n", m("deploy sparse")/m("curl | dd sparse (conv=sparse)"))
		fmt.Fprintf(tw, "ratio deploy sparse / dd conv=sparse (aim > 1)\t%.2f\t\n", m("deploy sparse")/m("dd sparse (conv=sparse)"))
		fmt.Fprintf(tw, "ratio deploy sparse / dd sparse (aim > 1)\t%.2f\t\n", m("deploy sparse")/m("dd sparse"))
		fmt.Fprintf(tw, "ratio deploy zstd / zstd pipeline (aim >= 0.9)\t%.2f\t\n", m("deploy zstd")/m("curl | zstd -dc | dd"))
		fmt.Fprintf(tw, "ratio deploy xz / xz pipeline\t%.2f\t\n", m("deploy xz")/m("curl | xz -dc -T0 | dd"))
		fmt.Fprintf(tw, "\t\t\n")
	}
	return tw.Flush()
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// runCase times one run; a file target is removed first (untimed), as a fresh
// target is what both deploy and dd start from.
func runCase(c benchCase, target string, imgs map[string]*image, base string, size int64) (float64, error) {
	block := strings.HasPrefix(target, "/dev/")
	if fi, err := os.Lstat(target); err == nil && fi.Mode().IsRegular() {
		if err := os.Remove(target); err != nil {
			return 0, err
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	if c.deploy {
		img := imgs[c.image]
		d := &deploy.Deployer{AllowHTTP: true, AllowFileTarget: true}
		p := protocol.DeployImageParams{
			Image:  protocol.DeployImage{URL: base + "/" + filepath.Base(img.path), SHA256: img.sha, Size: img.size, Format: img.format, ImageSize: img.imageSize},
			Target: protocol.DeployTarget{Path: target},
		}
		if img.format == protocol.FormatRaw {
			p.Image.ImageSize = 0
		}
		start := time.Now()
		res, err := d.Deploy(context.Background(), p, nil)
		if err != nil {
			return 0, err
		}
		secs := time.Since(start).Seconds()
		if len(res.Warnings) > 0 && !strings.Contains(res.Warnings[0], "no partition table") {
			fmt.Fprintln(os.Stderr, "warnings:", res.Warnings)
		}
		return secs, nil
	}
	cmd := c.shell
	zero := "true"
	if block {
		zero = "blkdiscard -z " + target
	} else {
		zero = fmt.Sprintf("truncate -s %d %s", size, target)
	}
	cmd = strings.ReplaceAll(cmd, "ZERO", zero)
	for name, img := range imgs {
		cmd = strings.ReplaceAll(cmd, "IMG:"+name+" ", img.path+" ")
		cmd = strings.ReplaceAll(cmd, "URL:"+name+" ", base+"/"+filepath.Base(img.path)+" ")
	}
	cmd = strings.ReplaceAll(cmd, "TARGET", target)
	start := time.Now()
	out, err := exec.Command("bash", "-c", "set -e -o pipefail; "+cmd).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", cmd, err, out)
	}
	return time.Since(start).Seconds(), nil
}

// makeImages writes the raw and sparse images and the compressed raw ones, or
// reuses them from a -keep run.
func makeImages(dir string, size int64) (map[string]*image, error) {
	imgs := map[string]*image{
		"raw":    {name: "raw", path: filepath.Join(dir, "raw.img"), format: protocol.FormatRaw},
		"sparse": {name: "sparse", path: filepath.Join(dir, "sparse.img"), format: protocol.FormatRaw},
		"zst":    {name: "zst", path: filepath.Join(dir, "raw.img.zst"), format: protocol.FormatZstd},
		"xz":     {name: "xz", path: filepath.Join(dir, "raw.img.xz"), format: protocol.FormatXZ},
	}
	for _, name := range []string{"raw", "sparse"} {
		img := imgs[name]
		if fi, err := os.Stat(img.path); err == nil && fi.Size() == size {
			continue
		}
		fmt.Fprintf(os.Stderr, "writing %s\n", img.path)
		if err := writeImage(img.path, size, name == "sparse"); err != nil {
			return nil, err
		}
	}
	for name, tool := range map[string][]string{"zst": {"zstd", "-3", "-T0", "-q", "-c"}, "xz": {"xz", "-1", "-T0", "-c"}} {
		img := imgs[name]
		if _, err := os.Stat(img.path); err == nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "compressing %s\n", img.path)
		in, err := os.Open(imgs["raw"].path)
		if err != nil {
			return nil, err
		}
		out, err := os.Create(img.path + ".tmp")
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(tool[0], tool[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, os.Stderr
		err = cmd.Run()
		in.Close()
		out.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", tool[0], err)
		}
		if err := os.Rename(img.path+".tmp", img.path); err != nil {
			return nil, err
		}
	}
	for _, img := range imgs {
		f, err := os.Open(img.path)
		if err != nil {
			return nil, err
		}
		h := sha256.New()
		n, err := io.Copy(h, f)
		f.Close()
		if err != nil {
			return nil, err
		}
		img.size, img.imageSize, img.sha = n, size, hex.EncodeToString(h.Sum(nil))
	}
	return imgs, nil
}

// writeImage writes size bytes of text-like data with a fifth of random bytes
// (zstd -3 makes about a third of it, as of an OS image),
// or for sparse a quarter of that in runs of 256 KiB to 8 MiB between runs of
// zeros three times as long, as a filesystem image's used and free space.
func writeImage(path string, size int64, sparse bool) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r := rand.New(rand.NewPCG(1, 2))
	words := strings.Fields("the quick brown fox jumps over a lazy dog kernel module initrd systemd journal " +
		"config partition block inode extent superblock 0 1 2 3 4 5 6 7 8 9 usr lib bin etc var /")
	block := make([]byte, 1<<20)
	fill := func(b []byte) {
		i := 0
		for i < len(b) {
			if r.IntN(200) == 0 {
				// Some incompressible bytes, as binaries have.
				n := min(len(b)-i, 64+r.IntN(512))
				for j := 0; j < n; j++ {
					b[i+j] = byte(r.Uint32())
				}
				i += n
				continue
			}
			w := words[r.IntN(len(words))]
			i += copy(b[i:], w)
			if i < len(b) {
				b[i] = ' '
				i++
			}
		}
	}
	var off int64
	for off < size {
		if !sparse {
			n := min(int64(len(block)), size-off)
			fill(block[:n])
			if _, err := f.WriteAt(block[:n], off); err != nil {
				return err
			}
			off += n
			continue
		}
		run := int64(256<<10) << r.IntN(6) // 256 KiB .. 8 MiB
		for left := min(run, size-off); left > 0; {
			n := min(int64(len(block)), left)
			fill(block[:n])
			if _, err := f.WriteAt(block[:n], off); err != nil {
				return err
			}
			off, left = off+n, left-n
		}
		off += 3 * run
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	return f.Close()
}

func loopDevice(dir string, size int64) (string, func(), error) {
	backing := filepath.Join(dir, "loop-backing.img")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		return "", nil, err
	}
	if err := os.Truncate(backing, size); err != nil {
		return "", nil, err
	}
	out, err := exec.Command("losetup", "-f", "--show", backing).Output()
	if err != nil {
		return "", nil, fmt.Errorf("losetup: %w", err)
	}
	dev := strings.TrimSpace(string(out))
	return dev, func() { exec.Command("losetup", "-d", dev).Run() }, nil
}
