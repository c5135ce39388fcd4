package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/better-compute/bcd/internal/testenv"
)

func TestSelectDisk(t *testing.T) {
	disks := []Disk{
		{Name: "nvme0n1", Path: "/dev/nvme0n1", Size: 960 << 30, Serial: "S4EWNX0R"},
		{Name: "nvme1n1", Path: "/dev/nvme1n1", Size: 480 << 30, Serial: "S4EWNX1R"},
		{Name: "sda", Path: "/dev/sda", Size: 240 << 30, Serial: "WD-1", Rotational: true},
		{Name: "sdb", Path: "/dev/sdb", Size: 16 << 30, Serial: "USB-1", Removable: true},
		{Name: "sdc", Path: "/dev/sdc", Size: 240 << 30, Serial: "WD-2"},
		{Name: "sr0", Path: "/dev/sdd", Size: 4 << 30, Serial: "RO-1", ReadOnly: true},
		{Name: "dup1", Path: "/dev/dup1", Size: 1 << 40, Serial: "TWIN"},
		{Name: "dup2", Path: "/dev/dup2", Size: 1 << 40, Serial: "TWIN"},
	}
	for _, tc := range []struct {
		name    string
		sel     Target
		min     int64
		want    string
		wantErr string
	}{
		{"by serial", Target{Serial: "S4EWNX1R"}, 10 << 30, "nvme1n1", ""},
		{"by serial, padded", Target{Serial: " WD-2 "}, 10 << 30, "sdc", ""},
		{"by serial, too small", Target{Serial: "USB-1"}, 20 << 30, "", "holds"},
		{"by serial, unknown", Target{Serial: "NOPE"}, 1, "", `0 disks report serial "NOPE"`},
		{"by serial, ambiguous", Target{Serial: "TWIN"}, 1, "", `2 disks report serial "TWIN"`},
		{"by serial, read-only", Target{Serial: "RO-1"}, 1, "", "read-only"},
		{"by path", Target{Path: "/dev/nvme0n1"}, 10 << 30, "nvme0n1", ""},
		{"by path, removable is fine when named", Target{Path: "/dev/sdb"}, 10 << 30, "sdb", ""},
		{"by path, unknown", Target{Path: "/dev/sdz"}, 1, "", "is not one of the disks"},
		// Smallest non-removable that fits; ties by name; rotational is fine.
		{"smallest", Target{}, 10 << 30, "sda", ""},
		{"smallest over 300G", Target{}, 300 << 30, "nvme1n1", ""},
		{"removable never chosen", Target{}, 1 << 30, "sda", ""},
		{"none big enough", Target{}, 2 << 40, "", "no non-removable disk holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SelectDisk(disks, tc.sel, tc.min)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got.Name != tc.want {
				t.Fatalf("got %s, %v; want %s", got.Name, err, tc.want)
			}
		})
	}
	if _, err := SelectDisk(nil, Target{}, 1); err == nil || !strings.Contains(err.Error(), "no disks") {
		t.Errorf("empty list: %v", err)
	}
}

func TestSysBlockFake(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"sys/block/nvme0n1/size":             "1875385008\n",
		"sys/block/nvme0n1/device/model":     "SAMSUNG MZQL2960HCJR-00A07   \n",
		"sys/block/nvme0n1/device/serial":    "  S64FNE0R  \n",
		"sys/block/nvme0n1/queue/rotational": "0\n",
		"sys/block/nvme0n1/removable":        "0\n",
		"sys/block/sda/size":                 "1000\n",
		"sys/block/sda/queue/rotational":     "1\n",
		"sys/block/sda/removable":            "1\n",
		"sys/block/sda/ro":                   "1\n",
		"sys/block/sda/device/vpd_pg80":      "\x00\x80\x00\x0a  ZA1B2C3D",
		"sys/block/vda/size":                 "2048\n",
		"sys/block/vda/serial":               "virtio-serial\n",
		"sys/block/loop0/size":               "8\n",
		"sys/block/zram0/size":               "8\n",
		"sys/block/dm-0/size":                "8\n",
	}
	for p, v := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := SysBlock{Root: root}.List()
	if err != nil {
		t.Fatal(err)
	}
	want := []Disk{
		{Name: "nvme0n1", Path: filepath.Join(root, "dev/nvme0n1"), Size: 1875385008 * 512, Model: "SAMSUNG MZQL2960HCJR-00A07", Serial: "S64FNE0R"},
		{Name: "sda", Path: filepath.Join(root, "dev/sda"), Size: 1000 * 512, Serial: "ZA1B2C3D", Removable: true, Rotational: true, ReadOnly: true},
		{Name: "vda", Path: filepath.Join(root, "dev/vda"), Size: 2048 * 512, Serial: "virtio-serial"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("disks (-want +got):\n%s", diff)
	}
	// A disk whose size is unreadable is an error, not a zero-byte disk.
	if err := os.WriteFile(filepath.Join(root, "sys/block/vda/size"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (SysBlock{Root: root}).List(); err == nil {
		t.Error("bad size accepted")
	}
}

// TestSysBlockHere reads this machine's /sys/block and checks it against lsblk.
func TestSysBlockHere(t *testing.T) {
	disks, err := SysBlock{}.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) == 0 {
		testenv.Skip(t, "no disks in /sys/block")
	}
	lsblk, err := exec.LookPath("lsblk")
	if err != nil {
		for _, d := range disks {
			t.Logf("%+v", d)
		}
		return
	}
	for _, d := range disks {
		out, err := exec.Command(lsblk, "-b", "-d", "-n", "-o", "SIZE,RM,ROTA,RO", d.Path).Output()
		if err != nil {
			t.Errorf("lsblk %s: %v", d.Path, err)
			continue
		}
		f := strings.Fields(string(out))
		if len(f) != 4 {
			t.Errorf("lsblk %s: %q", d.Path, out)
			continue
		}
		size, _ := strconv.ParseInt(f[0], 10, 64)
		if size != d.Size || (f[1] == "1") != d.Removable || (f[2] == "1") != d.Rotational || (f[3] == "1") != d.ReadOnly {
			t.Errorf("%s: %+v, lsblk says size %s rm %s rota %s ro %s", d.Name, d, f[0], f[1], f[2], f[3])
		}
		t.Logf("%+v", d)
	}
}

func FuzzParseVPD80(f *testing.F) {
	f.Add([]byte("\x00\x80\x00\x0a  ZA1B2C3D"))
	f.Add([]byte("\x00\x80\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		s := parseVPD80(b)
		if len(s) > len(b) {
			t.Fatalf("serial %q longer than the page", s)
		}
	})
}
