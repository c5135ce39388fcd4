// Command deploy benchmarks deploy.image's write path against the tools it
// replaces, in one run on this machine: a 1 GiB image (raw, 75 % zeros, zstd, xz)
// served over HTTP on 127.0.0.1 and written, SHA-256 checked, to a file and (as
// root) to a loop device, next to dd bs=4M oflag=direct (conv=sparse for the
// sparse image), curl | dd (and with a sha256sum beside it, as deploy does), and
// curl | zstd -dc | dd and curl | xz -dc | dd, and a qcow2 of the sparse image
// (plain and -c) deployed beside qemu-img convert -O raw of it. Each
// case runs -runs times, interleaved; the table shows medians in MB/s (image bytes,
// 10^6 per MB, fsync included), the CPU time each case spent per GiB, and the
// ratios the deploy package aims at. On this shared machine the CPU column is the
// steadier figure: a case's rate falls with the other tenants' load in proportion
// to the CPU it needs.
//
//	go run ./bench/deploy [-dir /tmp/bcd-bench-deploy] [-size 1073741824] [-runs 3] [-keep]
//	    [-only REGEXP] [-cpuprofile FILE] [-v] [-buffer BYTES] [-buffers N] [-writers N]
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

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
	// hash times crypto/sha256 over the image file (page cache), writing nothing:
	// the most deploy can do while it checks the digest on one stream.
	hash bool
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("deploy", flag.ContinueOnError)
	dir := fs.String("dir", "/tmp/bcd-bench-deploy", "where the images, targets and loop backing file go")
	size := fs.Int64("size", 1<<30, "image size in bytes (a multiple of 1 MiB)")
	runs := fs.Int("runs", 3, "runs of each case")
	keep := fs.Bool("keep", false, "keep the images for the next run")
	noLoop := fs.Bool("no-loop", false, "skip the loop device even as root")
	only := fs.String("only", "", "run only the cases whose name matches this regular expression (the ratios of the others print as 0)")
	bufSize := fs.Int("buffer", 0, "deploy's ring buffer size in bytes (0: its default)")
	buffers := fs.Int("buffers", 0, "deploy's ring buffers (0: its default)")
	writers := fs.Int("writers", 0, "deploy's writes in flight (0: its default)")
	verbose := fs.Bool("v", false, "log deploy's steps to stderr, with the time each took")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (deploy and the image server) to this file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, tool := range []string{"dd", "curl", "zstd", "xz", "bash", "tee", "sha256sum", "qemu-img"} {
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
		// Not writes: what hashing alone runs at here, in Go (deploy's) and OpenSSL.
		{name: "sha256 (Go) of raw, no write", image: "raw", hash: true},
		{name: "openssl sha256 of raw, no write", shell: "openssl dgst -sha256 IMG:raw >/dev/null"},
		{name: "dd sparse", shell: "dd if=IMG:sparse of=TARGET bs=4M oflag=direct conv=fsync status=none"},
		{name: "dd sparse (conv=sparse)", shell: "ZERO && dd if=IMG:sparse of=TARGET bs=4M oflag=direct conv=sparse,notrunc,fsync status=none"},
		{name: "curl | dd sparse (conv=sparse)", shell: "ZERO && curl -sf URL:sparse | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=sparse,notrunc,fsync status=none"},
		{name: "deploy sparse", image: "sparse", deploy: true},
		{name: "curl | zstd -dc | dd", shell: "curl -sf URL:zst | zstd -dcq | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		{name: "deploy zstd", image: "zst", deploy: true},
		{name: "curl | xz -dc -T0 | dd", shell: "curl -sf URL:xz | xz -dc -T0 | dd of=TARGET bs=4M iflag=fullblock oflag=direct conv=fsync status=none"},
		{name: "deploy xz", image: "xz", deploy: true},
		// qcow2 (of the sparse image; -c: compressed clusters): qemu-img needs the
		// file on disk, so its fair peer downloads it first; deploy converts as it
		// streams.
		{name: "qemu-img convert -O raw qcow2 (local file)", shell: "ZERO && qemu-img convert -n -t none -f qcow2 -O raw IMG:qcow2 TARGET"},
		{name: "curl -o + qemu-img convert qcow2", shell: "ZERO && curl -sf -o DIR/dl.qcow2 URL:qcow2 && qemu-img convert -n -t none -f qcow2 -O raw DIR/dl.qcow2 TARGET && rm DIR/dl.qcow2"},
		{name: "deploy qcow2", image: "qcow2", deploy: true},
		{name: "qemu-img convert -O raw qcow2 -c (local file)", shell: "ZERO && qemu-img convert -n -t none -f qcow2 -O raw IMG:qcow2c TARGET"},
		{name: "curl -o + qemu-img convert qcow2 -c", shell: "ZERO && curl -sf -o DIR/dl.qcow2 URL:qcow2c && qemu-img convert -n -t none -f qcow2 -O raw DIR/dl.qcow2 TARGET && rm DIR/dl.qcow2"},
		{name: "deploy qcow2 -c", image: "qcow2c", deploy: true},
	}
	if *only != "" {
		re, err := regexp.Compile(*only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		var keep []benchCase
		for _, c := range cases {
			if re.MatchString(c.name) {
				keep = append(keep, c)
			}
		}
		cases = keep
	}
	if _, err := exec.LookPath("openssl"); err != nil {
		var keep []benchCase
		for _, c := range cases {
			if !strings.HasPrefix(c.shell, "openssl") {
				keep = append(keep, c)
			}
		}
		cases = keep
	}
	// Only the images the cases use are made.
	need := map[string]bool{}
	for _, c := range cases {
		need[c.image] = true
		for _, name := range []string{"raw", "sparse", "zst", "xz", "qcow2", "qcow2c"} {
			if strings.Contains(c.shell, ":"+name+" ") {
				need[name] = true
			}
		}
	}
	imgs, err := makeImages(*dir, *size, need)
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	loadBefore := loadavg()
	results := map[string][]float64{}    // target|case -> MB/s
	cpuResults := map[string][]float64{} // target|case -> CPU seconds per GiB
	for r := 0; r < *runs; r++ {
		for _, target := range targets {
			for _, c := range cases {
				tune := deploy.Deployer{BufferSize: *bufSize, Buffers: *buffers, Writers: *writers}
				cpu0 := cpuTime()
				secs, err := runCase(c, target, imgs, base, *size, *verbose, tune)
				if err != nil {
					return fmt.Errorf("%s to %s: %w", c.name, target, err)
				}
				cpuPerGiB := (cpuTime() - cpu0).Seconds() / (float64(*size) / (1 << 30))
				mbps := float64(*size) / 1e6 / secs
				results[target+"|"+c.name] = append(results[target+"|"+c.name], mbps)
				cpuResults[target+"|"+c.name] = append(cpuResults[target+"|"+c.name], cpuPerGiB)
				fmt.Fprintf(os.Stderr, "run %d %-28s %-40s %7.1f MB/s %5.2f CPU s/GiB\n", r+1, c.name, target, mbps, cpuPerGiB)
			}
		}
	}

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	var uname unix.Utsname
	_ = unix.Uname(&uname)
	fmt.Fprintf(stdout, "\nbench/deploy %s UTC: Linux %s, %d CPUs shared by deploy, the image server and the peers; %s\n",
		time.Now().UTC().Format("2006-01-02 15:04"), unix.ByteSliceToString(uname.Release[:]), runtime.NumCPU(), runtime.Version())
	for _, v := range [][]string{{"dd", "--version"}, {"curl", "--version"}, {"zstd", "--version"}} {
		out, _ := exec.Command(v[0], v[1]).Output()
		line, _, _ := strings.Cut(string(out), "\n")
		line, _, _ = strings.Cut(line, " libcurl")
		fmt.Fprintf(stdout, "  %s\n", line)
	}
	fmt.Fprintf(stdout, "%d MiB image, median of %d runs (± half the spread), cases interleaved; MB/s of image including fsync; deploy checks SHA-256 of the served bytes\n", *size>>20, *runs)
	// On a shared machine the CPU a case spends per byte says more than its rate:
	// the more it needs, the more the other tenants' load slows it.
	fmt.Fprintf(stdout, "CPU s/GiB: user+system time of the benchmark process (the image server included) and of the peers' processes, per GiB of image\n")
	// Runs here vary with whatever else the machine does: say how busy it was.
	fmt.Fprintf(stdout, "load average before %s, after %s\n", loadBefore, loadavg())
	for _, target := range targets {
		kind := "file"
		if strings.HasPrefix(target, "/dev/") {
			kind = "loop device"
		}
		fmt.Fprintf(tw, "%s (%s)\tMB/s\tCPU s/GiB\t\n", kind, target)
		for _, c := range cases {
			v := results[target+"|"+c.name]
			fmt.Fprintf(tw, "%s\t%.0f ±%.0f%%\t%.2f\t\n", c.name, median(v), spread(v), median(cpuResults[target+"|"+c.name]))
		}
		m := func(name string) float64 { return median(results[target+"|"+name]) }
		ratio := func(label, a, b string) {
			// Only the cases -only kept have figures.
			if m(a) > 0 && m(b) > 0 {
				fmt.Fprintf(tw, "ratio %s\t%.2f\t\t\n", label, m(a)/m(b))
			}
		}
		ratio("deploy raw / dd raw (aim >= 0.95)", "deploy raw", "dd raw")
		ratio("deploy raw / curl | dd", "deploy raw", "curl | dd raw")
		ratio("deploy raw / curl | tee >(sha256sum) | dd", "deploy raw", "curl | tee >(sha256sum) | dd raw")
		ratio("sha256 (Go) alone / dd raw: the digest's own ceiling", "sha256 (Go) of raw, no write", "dd raw")
		ratio("deploy raw / sha256 (Go) alone", "deploy raw", "sha256 (Go) of raw, no write")
		ratio("deploy sparse / curl | dd conv=sparse", "deploy sparse", "curl | dd sparse (conv=sparse)")
		ratio("deploy sparse / dd conv=sparse (aim > 1)", "deploy sparse", "dd sparse (conv=sparse)")
		ratio("deploy sparse / dd sparse (aim > 1)", "deploy sparse", "dd sparse")
		ratio("deploy zstd / zstd pipeline (aim >= 0.9)", "deploy zstd", "curl | zstd -dc | dd")
		ratio("deploy xz / xz pipeline", "deploy xz", "curl | xz -dc -T0 | dd")
		ratio("deploy qcow2 / curl -o + qemu-img convert", "deploy qcow2", "curl -o + qemu-img convert qcow2")
		ratio("deploy qcow2 / qemu-img convert of a local file", "deploy qcow2", "qemu-img convert -O raw qcow2 (local file)")
		ratio("deploy qcow2 -c / curl -o + qemu-img convert", "deploy qcow2 -c", "curl -o + qemu-img convert qcow2 -c")
		ratio("deploy qcow2 -c / qemu-img convert of a local file", "deploy qcow2 -c", "qemu-img convert -O raw qcow2 -c (local file)")
		cpu := func(name string) float64 { return median(cpuResults[target+"|"+name]) }
		for _, pair := range [][2]string{{"deploy raw", "dd raw"}, {"deploy raw", "curl | dd raw"}, {"deploy sparse", "dd sparse"}, {"deploy zstd", "curl | zstd -dc | dd"}} {
			if cpu(pair[0]) > 0 && cpu(pair[1]) > 0 {
				fmt.Fprintf(tw, "CPU per GiB %s / %s\t\t%.2f\t\n", pair[0], pair[1], cpu(pair[0])/cpu(pair[1]))
			}
		}
		fmt.Fprintf(tw, "\t\t\t\n")
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

// spread is half the range of v, in percent of its median.
func spread(v []float64) float64 {
	if len(v) == 0 || median(v) == 0 {
		return 0
	}
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return (hi - lo) / 2 / median(v) * 100
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
func runCase(c benchCase, target string, imgs map[string]*image, base string, size int64, verbose bool, tune deploy.Deployer) (float64, error) {
	block := strings.HasPrefix(target, "/dev/")
	if fi, err := os.Lstat(target); err == nil && fi.Mode().IsRegular() {
		if err := os.Remove(target); err != nil {
			return 0, err
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	if c.hash {
		return hashFile(imgs[c.image].path)
	}
	if c.deploy {
		img := imgs[c.image]
		d := &deploy.Deployer{AllowHTTP: true, AllowFileTarget: true,
			BufferSize: tune.BufferSize, Buffers: tune.Buffers, Writers: tune.Writers}
		if verbose {
			d.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
		p := deploy.Request{
			Image:  deploy.Image{URL: base + "/" + filepath.Base(img.path), SHA256: img.sha, Size: img.size, Format: img.format, ImageSize: img.imageSize},
			Target: deploy.Target{Path: target},
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
	cmd = strings.ReplaceAll(cmd, "DIR/", filepath.Dir(imgs["sparse"].path)+"/")
	start := time.Now()
	out, err := exec.Command("bash", "-c", "set -e -o pipefail; "+cmd).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("%s: %v: %s", cmd, err, out)
	}
	return time.Since(start).Seconds(), nil
}

// makeImages writes the raw and sparse images and the compressed raw ones, or
// reuses them from a -keep run.
func makeImages(dir string, size int64, need map[string]bool) (map[string]*image, error) {
	imgs := map[string]*image{
		"qcow2":  {name: "qcow2", path: filepath.Join(dir, "sparse.qcow2"), format: protocol.FormatQCOW2},
		"qcow2c": {name: "qcow2c", path: filepath.Join(dir, "sparse-c.qcow2"), format: protocol.FormatQCOW2},
		"raw":    {name: "raw", path: filepath.Join(dir, "raw.img"), format: protocol.FormatRaw},
		"sparse": {name: "sparse", path: filepath.Join(dir, "sparse.img"), format: protocol.FormatRaw},
		"zst":    {name: "zst", path: filepath.Join(dir, "raw.img.zst"), format: protocol.FormatZstd},
		"xz":     {name: "xz", path: filepath.Join(dir, "raw.img.xz"), format: protocol.FormatXZ},
	}
	if need["qcow2"] || need["qcow2c"] {
		need["sparse"] = true
	}
	if need["zst"] || need["xz"] {
		need["raw"] = true
	}
	for name := range imgs {
		if !need[name] {
			delete(imgs, name)
		}
	}
	for _, name := range []string{"raw", "sparse"} {
		img := imgs[name]
		if img == nil {
			continue
		}
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
		if img == nil {
			continue
		}
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
	for name, args := range map[string][]string{"qcow2": nil, "qcow2c": {"-c"}} {
		img := imgs[name]
		if img == nil {
			continue
		}
		if _, err := os.Stat(img.path); err == nil {
			continue
		}
		fmt.Fprintf(os.Stderr, "converting %s\n", img.path)
		cmd := exec.Command("qemu-img", append(append([]string{"convert", "-f", "raw", "-O", "qcow2"}, args...), imgs["sparse"].path, img.path+".tmp")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("qemu-img convert: %v: %s", err, out)
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

// cpuTime is the CPU time of this process (deploy and the image server) and of
// the children it has waited for (the peers' pipelines).
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

func hashFile(path string) (float64, error) {
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, make([]byte, 4<<20)); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}
