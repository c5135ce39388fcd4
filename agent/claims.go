package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/bcd/protocol"
)

// ClaimsSource reads the hardware claims of the machine. Every part is best effort:
// a file that is missing or unreadable (DMI serials are root's) leaves its field
// empty, since claims are inventory, not proof.
type ClaimsSource struct {
	// Root is prepended to /sys and /proc paths, for tests; "" is the real root.
	Root string
	// NvidiaSMI is the nvidia-smi binary; "" looks it up on PATH, "-" skips GPUs.
	NvidiaSMI string
	// Interfaces lists the network interfaces; nil means net.Interfaces.
	Interfaces func() ([]net.Interface, error)
}

// Collect gathers what it can within ctx.
func (s ClaimsSource) Collect(ctx context.Context) protocol.Claims {
	var c protocol.Claims
	c.Hostname, _ = os.Hostname()
	c.MACs = s.macs()
	c.SystemUUID = s.read("sys/class/dmi/id/product_uuid")
	c.SystemSerial = s.read("sys/class/dmi/id/product_serial")
	c.SystemVendor = s.read("sys/class/dmi/id/sys_vendor")
	c.SystemProduct = s.read("sys/class/dmi/id/product_name")
	c.CPUs = runtime.NumCPU()
	c.CPUModel = cpuModel(s.read("proc/cpuinfo"))
	c.MemoryBytes = memTotal(s.read("proc/meminfo"))
	c.Disks = s.disks()
	c.GPUs = s.gpus(ctx)
	return c
}

func (s ClaimsSource) path(rel string) string { return filepath.Join("/", s.Root, rel) }

func (s ClaimsSource) read(rel string) string {
	b, err := os.ReadFile(s.path(rel))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func (s ClaimsSource) macs() []string {
	list := net.Interfaces
	if s.Interfaces != nil {
		list = s.Interfaces
	}
	ifs, err := list()
	if err != nil {
		return nil
	}
	var macs []string
	for _, i := range ifs {
		if i.Flags&net.FlagLoopback != 0 || len(i.HardwareAddr) != 6 {
			continue
		}
		macs = append(macs, i.HardwareAddr.String())
	}
	sort.Strings(macs)
	return macs
}

func cpuModel(cpuinfo string) string {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func memTotal(meminfo string) int64 {
	for _, line := range strings.Split(meminfo, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil && kb > 0 {
				return kb * 1024
			}
		}
	}
	return 0
}

// disks lists whole block devices, leaving out the virtual ones (loop, ram, zram,
// device-mapper, md) that are not hardware.
func (s ClaimsSource) disks() []protocol.Disk {
	entries, err := os.ReadDir(s.path("sys/block"))
	if err != nil {
		return nil
	}
	var disks []protocol.Disk
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "loop") || strings.HasPrefix(name, "ram") || strings.HasPrefix(name, "zram") ||
			strings.HasPrefix(name, "dm-") || strings.HasPrefix(name, "md") || strings.HasPrefix(name, "nbd") {
			continue
		}
		base := "sys/block/" + name
		sectors, _ := strconv.ParseInt(s.read(base+"/size"), 10, 64)
		d := protocol.Disk{
			Name:       name,
			SizeBytes:  sectors * 512, // the kernel counts 512-byte sectors whatever the device's block size
			Model:      s.read(base + "/device/model"),
			Serial:     s.read(base + "/device/serial"),
			Removable:  s.read(base+"/removable") == "1",
			Rotational: s.read(base+"/queue/rotational") == "1",
		}
		if d.Serial == "" {
			d.Serial = s.read(base + "/serial")
		}
		disks = append(disks, d)
	}
	return disks
}

func (s ClaimsSource) gpus(ctx context.Context) []protocol.GPU {
	bin := s.NvidiaSMI
	if bin == "-" {
		return nil
	}
	if bin == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return nil
		}
		bin = p
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--query-gpu=index,name,uuid,memory.total",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil
	}
	gpus, err := ParseNvidiaSMI(out)
	if err != nil {
		return nil
	}
	return gpus
}

// maxGPUs bounds what ParseNvidiaSMI accepts; no machine has more.
const maxGPUs = 64

// ParseNvidiaSMI reads the output of
//
//	nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader,nounits
//
// one GPU a line: "0, NVIDIA H100 80GB HBM3, GPU-5c1e…, 81559" (memory in MiB).
func ParseNvidiaSMI(out []byte) ([]protocol.GPU, error) {
	var gpus []protocol.GPU
	sc := bufio.NewScanner(bytes.NewReader(out))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 4 {
			return nil, fmt.Errorf("nvidia-smi line %d: %d fields, want 4", n, len(f))
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		idx, err := strconv.Atoi(f[0])
		if err != nil || idx < 0 || idx >= maxGPUs {
			return nil, fmt.Errorf("nvidia-smi line %d: index %q", n, f[0])
		}
		g := protocol.GPU{Index: idx, Name: f[1], UUID: f[2]}
		if !printableASCII(g.Name) || !printableASCII(g.UUID) {
			return nil, fmt.Errorf("nvidia-smi line %d: unexpected characters", n)
		}
		if mib, err := strconv.ParseInt(f[3], 10, 64); err == nil && mib > 0 && mib < 1<<30 {
			g.MemoryBytes = mib << 20
		}
		gpus = append(gpus, g)
		if len(gpus) > maxGPUs {
			return nil, errors.New("nvidia-smi: more GPUs than any machine has")
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("nvidia-smi: %w", err)
	}
	return gpus, nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
