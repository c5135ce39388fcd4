package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClaimsFromFakeRoot(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"sys/class/dmi/id/product_uuid":      "4c4c4544-0042-3510-8052-b4c04f384d32\n",
		"sys/class/dmi/id/sys_vendor":        "Dell Inc.\n",
		"proc/cpuinfo":                       "processor\t: 0\nmodel name\t: AMD EPYC 9654\n",
		"proc/meminfo":                       "MemTotal:       16384 kB\nMemFree: 1 kB\n",
		"sys/block/nvme0n1/size":             "2000\n",
		"sys/block/nvme0n1/device/model":     "Samsung SSD\n",
		"sys/block/nvme0n1/queue/rotational": "0\n",
		"sys/block/loop0/size":               "8\n",
		"sys/block/sda/size":                 "10\n",
		"sys/block/sda/queue/rotational":     "1\n",
		"sys/block/sda/removable":            "1\n",
	}
	for p, c := range files {
		full := filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		os.WriteFile(full, []byte(c), 0o644)
	}
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	src := ClaimsSource{Root: root, NvidiaSMI: "-", Interfaces: func() ([]net.Interface, error) {
		return []net.Interface{{Name: "lo", Flags: net.FlagLoopback}, {Name: "eth0", HardwareAddr: mac}}, nil
	}}
	c := src.Collect(context.Background())
	if c.SystemUUID != "4c4c4544-0042-3510-8052-b4c04f384d32" || c.SystemVendor != "Dell Inc." || c.CPUModel != "AMD EPYC 9654" || c.MemoryBytes != 16384*1024 {
		t.Errorf("claims = %+v", c)
	}
	if len(c.MACs) != 1 || c.MACs[0] != "52:54:00:12:34:56" {
		t.Errorf("MACs = %v", c.MACs)
	}
	if len(c.Disks) != 2 || c.Disks[0].Name != "nvme0n1" || c.Disks[0].SizeBytes != 2000*512 || c.Disks[0].Model != "Samsung SSD" ||
		!c.Disks[1].Rotational || !c.Disks[1].Removable {
		t.Errorf("disks = %+v", c.Disks)
	}
}

func TestParseNvidiaSMI(t *testing.T) {
	out := "0, NVIDIA H100 80GB HBM3, GPU-5c1e2f3a-0000-1111-2222-333344445555, 81559\n1, NVIDIA H100 80GB HBM3, GPU-aa, [N/A]\n"
	gpus, err := ParseNvidiaSMI([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 2 || gpus[0].Name != "NVIDIA H100 80GB HBM3" || gpus[0].MemoryBytes != 81559<<20 || gpus[1].Index != 1 || gpus[1].MemoryBytes != 0 {
		t.Errorf("gpus = %+v", gpus)
	}
	if _, err := ParseNvidiaSMI([]byte("garbage")); err == nil {
		t.Error("accepted garbage")
	}
}

func FuzzParseNvidiaSMI(f *testing.F) {
	f.Add([]byte("0, NVIDIA A100, GPU-1, 40960\n"))
	f.Add([]byte("x,y,z,w\n"))
	f.Add([]byte(strings.Repeat("0, a, b, 1\n", 70)))
	f.Fuzz(func(t *testing.T, data []byte) {
		gpus, err := ParseNvidiaSMI(data)
		if err != nil {
			return
		}
		if len(gpus) > maxGPUs {
			t.Fatalf("%d GPUs", len(gpus))
		}
		for _, g := range gpus {
			if g.Index < 0 || g.MemoryBytes < 0 || !printableASCII(g.Name) {
				t.Fatalf("accepted %+v", g)
			}
		}
	})
}
