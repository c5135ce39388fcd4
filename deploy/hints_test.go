package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysBlock writes a /sys/block and /dev/disk/by-path tree of several disks
// under a temporary root. The tree is fake because a unit test cannot have real
// hardware with four disks of different serials, WWNs, sizes and rotation; the
// reading of a real /sys is TestSysBlockHere's, and the lab's VMs deploy to real
// virtio disks.
func fakeSysBlock(t *testing.T) string {
	root := t.TempDir()
	files := map[string]string{
		"sys/block/sda/size":              "976773168\n", // 500 GB
		"sys/block/sda/device/model":      "ST500DM002-1BD142\n",
		"sys/block/sda/device/vendor":     "ATA     \n",
		"sys/block/sda/device/wwid":       "naa.5000c5004a1b2c3d\n",
		"sys/block/sda/device/vpd_pg80":   "\x00\x80\x00\x08Z3T0AAAA",
		"sys/block/sda/queue/rotational":  "1\n",
		"sys/block/sdb/size":              "234441648\n", // 120 GB
		"sys/block/sdb/device/model":      "INTEL SSDSC2BB12\n",
		"sys/block/sdb/device/vendor":     "ATA\n",
		"sys/block/sdb/device/wwn":        "0x55cd2e404b7a1234\n",
		"sys/block/sdb/device/vpd_pg80":   "\x00\x80\x00\x08BTWL0001",
		"sys/block/sdb/queue/rotational":  "0\n",
		"sys/block/nvme0n1/size":          "1875385008\n", // 960 GB
		"sys/block/nvme0n1/device/model":  "SAMSUNG MZQL2960HCJR-00A07\n",
		"sys/block/nvme0n1/device/serial": "S64FNE0R\n",
		"sys/block/nvme0n1/wwid":          "eui.36344630528002510025384100000001\n",
		"sys/block/nvme1n1/size":          "1875385008\n",
		"sys/block/nvme1n1/device/model":  "SAMSUNG MZQL2960HCJR-00A07\n",
		"sys/block/nvme1n1/device/serial": "S64FNE1R\n",
		"sys/block/loop0/size":            "8\n",
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
	byPath := filepath.Join(root, "dev/disk/by-path")
	if err := os.MkdirAll(byPath, 0o755); err != nil {
		t.Fatal(err)
	}
	for link, dev := range map[string]string{"pci-0000:00:1f.2-ata-1": "sda", "pci-0000:00:1f.2-ata-2": "sdb", "pci-0000:00:1f.2-ata-2.0": "sdb", "pci-0000:01:00.0-nvme-1": "nvme0n1"} {
		if err := os.Symlink("../../"+dev, filepath.Join(byPath, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSelectDiskHints(t *testing.T) {
	root := fakeSysBlock(t)
	disks, err := SysBlock{Root: root}.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(disks) != 4 {
		t.Fatalf("disks %+v", disks)
	}
	sdb := disks[3]
	if sdb.Name != "sdb" || sdb.WWN != "0x55cd2e404b7a1234" || sdb.Vendor != "ATA" || sdb.Serial != "BTWL0001" ||
		strings.Join(sdb.ByPath, " ") != "/dev/disk/by-path/pci-0000:00:1f.2-ata-2 /dev/disk/by-path/pci-0000:00:1f.2-ata-2.0" {
		t.Errorf("sdb %+v", sdb)
	}
	for _, tc := range []struct {
		hints   string
		first   bool
		min     int64
		want    string
		wantWhy string
		wantErr []string
	}{
		{"serial=BTWL0001", false, 1, "sdb", "hints serial=BTWL0001", nil},
		{"wwn=naa.5000C5004A1B2C3D", false, 1, "sda", "hints wwn=naa.5000C5004A1B2C3D", nil},
		{"wwn=5000c5004a1b2c3d", false, 1, "sda", "", nil},
		{"wwn=eui.36344630528002510025384100000001", false, 1, "nvme0n1", "", nil},
		{"model=intel ssdsc2bb12", false, 1, "sdb", "", nil},
		{"vendor=ata,rotational=false", false, 1, "sdb", "", nil},
		{"rotational=true", false, 1, "sda", "", nil},
		{"size>=400GB,size<=600GB", false, 1, "", "", []string{"size given twice"}},
		{"size<=600GB,rotational=true", false, 1, "sda", "hints size<=600GB,rotational=true", nil},
		{"size=480113463296", false, 1, "", "", []string{"no disk matches", "sdb by size=480113463296 (it holds 120034123776 bytes)"}},
		{"name=/dev/nvme1n1", false, 1, "nvme1n1", "", nil},
		{"name=sdb", false, 1, "sdb", "", nil},
		{"by_path=/dev/disk/by-path/pci-0000:00:1f.2-ata-1", false, 1, "sda", "", nil},
		{"by_path=/dev/disk/by-path/pci-0000:00:1f.2-ata-2.0", false, 1, "sdb", "", nil},
		// Two identical NVMe disks: ambiguous unless the first match is asked for.
		{"model=SAMSUNG MZQL2960HCJR-00A07", false, 1, "", "", []string{"2 disks match", "nvme0n1, nvme1n1", "first match"}},
		{"model=SAMSUNG MZQL2960HCJR-00A07", true, 1, "nvme0n1", "hints model=SAMSUNG MZQL2960HCJR-00A07 (first match of 2)", nil},
		{"size>=890GiB,rotational=false", true, 1, "nvme0n1", "", nil},
		// Which hint excluded which disk, and every candidate with what it reports.
		{"serial=NOPE", false, 1, "", "", []string{`sda by serial=NOPE (it reports "Z3T0AAAA")`, `nvme1n1 by serial=NOPE`,
			`candidates: nvme0n1 960197124096 bytes model "SAMSUNG MZQL2960HCJR-00A07" serial S64FNE0R wwn eui.36344630528002510025384100000001 rotational=false`,
			`sda 500107862016 bytes model "ST500DM002-1BD142" serial Z3T0AAAA wwn naa.5000c5004a1b2c3d rotational=true`}},
		{"serial=BTWL0001,rotational=true", false, 1, "", "", []string{"sdb by rotational=true"}},
		{"by_path=/dev/disk/by-path/none", false, 1, "", "", []string{"nvme1n1 by by_path=/dev/disk/by-path/none (its links: none)"}},
		// The hints choose; the image must still fit.
		{"serial=BTWL0001", false, 200e9, "", "", []string{"holds 120034123776 bytes, the image needs 200000000000"}},
		{"serial=X,colour=red", false, 1, "", "", []string{`root device hint "colour=red": unknown key`}},
	} {
		d, why, err := SelectDiskWhy(disks, Target{RootDevice: tc.hints, FirstMatch: tc.first}, tc.min)
		if tc.wantErr != nil {
			if err == nil {
				t.Errorf("%q: chose %s, want an error", tc.hints, d.Name)
				continue
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q: error %v\nwant it to say %q", tc.hints, err, w)
				}
			}
			continue
		}
		if err != nil || d.Name != tc.want || tc.wantWhy != "" && why != tc.wantWhy {
			t.Errorf("%q: %s (%q), %v; want %s (%q)", tc.hints, d.Name, why, err, tc.want, tc.wantWhy)
		}
	}
	// Serial, path and no selector say why too.
	if _, why, err := SelectDiskWhy(disks, Target{}, 1); err != nil || why != "smallest non-removable disk >= 1 bytes" {
		t.Errorf("default: %q, %v", why, err)
	}
	if _, why, _ := SelectDiskWhy(disks, Target{Serial: "S64FNE1R"}, 1); why != "serial S64FNE1R" {
		t.Errorf("serial: %q", why)
	}
}

// TestDeployerHints: deploy.image's and machine.kexec's target selection
// (selectTarget) applies the hints to the Deployer's disk list and fails with
// reason no-disk when they match none.
func TestDeployerHints(t *testing.T) {
	root := fakeSysBlock(t)
	d := &Deployer{Disks: SysBlock{Root: root}.List}
	path, disk, block, err := d.selectTarget(Target{RootDevice: "size>=500GB,rotational=true"}, 1)
	if err != nil || !block || path != filepath.Join(root, "dev/sda") || disk.ChosenBy != "hints size>=500GB,rotational=true" {
		t.Errorf("%s %+v %v %v", path, disk, block, err)
	}
	_, _, _, err = d.selectTarget(Target{RootDevice: "serial=NOPE"}, 1)
	if e, ok := err.(*Error); !ok || e.Reason != reasonNoDisk || !strings.Contains(e.Error(), "sdb by serial=NOPE") {
		t.Errorf("no match: %v", err)
	}
	res, err := d.LoadInstalled(context.Background(), Target{RootDevice: "model=SAMSUNG MZQL2960HCJR-00A07"}, After{Action: "kexec"})
	if e, ok := err.(*Error); !ok || e.Reason != reasonNoDisk || !strings.Contains(e.Error(), "2 disks match") {
		t.Errorf("kexec, ambiguous: %+v %v", res, err)
	}
}
