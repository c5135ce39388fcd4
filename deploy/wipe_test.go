package deploy

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

// mdSuper1 is an md v1.x superblock as mdadm writes it (struct mdp_superblock_1),
// for a member of size bytes whose superblock sits at superOffset bytes into it:
// 0 for 1.1, 4096 for 1.2, near the end for 1.0. The kernel here has no md driver,
// so mdadm --create cannot run; the format is written by hand, and blkid -p (which
// checks the magic, the version, the offset and the checksum) says it is real.
func mdSuper1(size, superOffset int64) []byte {
	le := binary.LittleEndian
	const maxDev = 2
	sb := make([]byte, 256+2*maxDev)
	le.PutUint32(sb[0:], mdMagic)
	le.PutUint32(sb[4:], 1) // major_version
	copy(sb[16:32], "stale-md-set-uid")
	copy(sb[32:64], "oldhost:0")
	le.PutUint32(sb[72:], 1) // level: raid1
	le.PutUint32(sb[92:], 2) // raid_disks
	dataOffset := int64(2048)
	if superOffset > 0 && superOffset > 4096 { // 1.0: the data is first
		dataOffset = 0
	}
	le.PutUint64(sb[128:], uint64(dataOffset))
	le.PutUint64(sb[136:], uint64(size/512-dataOffset-64))
	le.PutUint64(sb[144:], uint64(superOffset/512))
	copy(sb[168:184], "stale-md-dev-uid")
	le.PutUint64(sb[200:], 7) // events
	le.PutUint32(sb[220:], maxDev)
	le.PutUint16(sb[256:], 0)
	le.PutUint16(sb[258:], 1)
	var sum uint64
	for i := 0; i+4 <= len(sb); i += 4 {
		sum += uint64(le.Uint32(sb[i:]))
	}
	le.PutUint32(sb[216:], uint32(sum&0xffffffff+sum>>32))
	return sb
}

// mdSuper090 is an md 0.90 superblock (struct mdp_super_t's first words), which
// sits in the last 64 KiB-aligned 64 KiB of its member.
func mdSuper090() []byte {
	le := binary.LittleEndian
	sb := make([]byte, 4096)
	le.PutUint32(sb[0:], mdMagic)
	le.PutUint32(sb[4:], 0)  // major_version
	le.PutUint32(sb[8:], 90) // minor_version
	le.PutUint32(sb[20:], 0x12345678)
	le.PutUint32(sb[28:], 1) // level
	le.PutUint32(sb[40:], 2) // raid_disks
	return sb
}

// lvmConfig keeps lvm2 off udev and the devices file: the test's loop devices are
// nobody's, and the machine's own LVM setup (and /etc/lvm/backup) is left alone.
const lvmConfig = `devices { use_devicesfile=0 obtain_device_list_from_udev=0 } activation { udev_sync=0 udev_rules=0 monitoring=0 } backup { backup=0 archive=0 }`

// loopRange attaches [off, off+size) of file as a loop device, detached at the end.
func loopRange(t *testing.T, file string, off, size int64) string {
	t.Helper()
	out, err := exec.Command("losetup", "-f", "--show", "-o", fmt.Sprint(off), "--sizelimit", fmt.Sprint(size), file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup -o %d --sizelimit %d %s: %v %s", off, size, file, err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("losetup", "-d", dev).Run() })
	return dev
}

func detach(t *testing.T, dev string) {
	t.Helper()
	if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup -d %s: %v %s", dev, err, out)
	}
}

// probe is blkid -p's TYPE for [off, off+size) of a device or file ("" for none).
func probe(t *testing.T, path string, off, size int64) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-o", "value", "-s", "TYPE", "-O", fmt.Sprint(off), "-S", fmt.Sprint(size), path).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 2 {
		return "" // nothing found
	}
	if err != nil {
		t.Fatalf("blkid -p %s at %d: %v %s", path, off, err, out)
	}
	return strings.TrimSpace(string(out))
}

// wipefsList is wipefs -n's view of a device: one "TYPE@OFFSET" per signature.
func wipefsList(t *testing.T, dev string) []string {
	t.Helper()
	out, err := exec.Command("wipefs", "-n", "-p", dev).CombinedOutput()
	if err != nil {
		t.Fatalf("wipefs -n %s: %v %s", dev, err, out)
	}
	var sigs []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(l, ",")
		if len(f) >= 4 && !strings.HasPrefix(l, "#") {
			sigs = append(sigs, f[3]+"@"+f[0])
		}
	}
	return sigs
}

// TestDeployWipesOldSignatures: a disk that held an LVM volume group and md RAID
// members on partitions past the new image's end (where the image writes nothing)
// is deployed; afterwards blkid finds none of them, and the result says what went.
func TestDeployWipesOldSignatures(t *testing.T) {
	testenv.NeedRoot(t)
	for _, tool := range []string{"losetup", "sgdisk", "blkid", "wipefs", "pvcreate", "vgcreate", "mkfs.ext4"} {
		testenv.NeedTool(t, tool)
	}
	img := smallImage(t)
	imgMiB := (img.size + mib - 1) / mib
	const partMiB, oldParts = 8, 6
	size := (imgMiB + 1 + oldParts*partMiB + 2) * mib
	backing := filepath.Join(t.TempDir(), "old-disk.img")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	// The old disk: partition 1 under the image, 2-7 beyond its end.
	type part struct {
		n          int
		start, len int64 // bytes
		code       string
	}
	parts := []part{{1, mib, (imgMiB - 1) * mib, "8300"}}
	for i := 0; i < oldParts; i++ {
		parts = append(parts, part{2 + i, (imgMiB + 1 + int64(i)*partMiB) * mib, partMiB * mib, []string{"8e00", "fd00", "fd00", "fd00", "fd00", "8300"}[i]})
	}
	args := []string{"-Z"}
	for _, p := range parts {
		args = append(args, fmt.Sprintf("-n%d:%d:%d", p.n, p.start/512, (p.start+p.len)/512-1), fmt.Sprintf("-t%d:%s", p.n, p.code))
	}
	if out, err := exec.Command("sgdisk", append(args, backing)...).CombinedOutput(); err != nil {
		t.Fatalf("sgdisk: %v %s", err, out)
	}
	// Partition 2: a physical volume of a volume group, made by lvm2.
	vg := fmt.Sprintf("bcdstale%d", os.Getpid())
	pv := loopRange(t, backing, parts[1].start, parts[1].len)
	for _, c := range [][]string{{"pvcreate", "--config", lvmConfig, pv}, {"vgcreate", "--config", lvmConfig, vg, pv}} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", strings.Join(c, " "), err, out)
		}
	}
	detach(t, pv)
	// Partitions 3-6: md members with superblocks 1.2 (at 4 KiB), 1.1 (at 0), 1.0
	// (at the end) and 0.90 (64 KiB from the end).
	f, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range []int64{4096, 0, (parts[4].len/512 - 16) &^ 7 * 512} {
		p := parts[2+i]
		if _, err := f.WriteAt(mdSuper1(p.len, off), p.start+off); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(mdSuper090(), parts[5].start+parts[5].len&^0xffff-0x10000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Partition 7: an ext4 filesystem, made by mke2fs.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", fmt.Sprintf("offset=%d", parts[6].start), backing, fmt.Sprint(parts[6].len/1024)).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}

	dev := loopRange(t, backing, 0, size)

	want := map[int]string{2: "LVM2_member", 3: "linux_raid_member", 4: "linux_raid_member", 5: "linux_raid_member",
		6: "linux_raid_member", 7: "ext4"}
	for n, typ := range want {
		p := parts[n-1]
		if got := probe(t, dev, p.start, p.len); got != typ {
			t.Fatalf("before the deploy, blkid -p finds %q on old partition %d, want %q (the test disk is not what it should be)", got, n, typ)
		}
	}
	if sigs := wipefsList(t, dev); !slices.ContainsFunc(sigs, func(s string) bool { return strings.HasPrefix(s, "gpt@") }) {
		t.Fatalf("before the deploy, wipefs -n finds %v, no gpt", sigs)
	}

	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	d := &Deployer{AllowHTTP: true, Machine: &fakeMachine{}, ProcCmdline: "/nonexistent"}
	res, err := d.Deploy(context.Background(), params(srv.URL, body, protocol.FormatZstd, img.size, dev), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wiped: %s", strings.Join(res.Wiped, ", "))
	for _, w := range []string{"gpt", "lvm2 on old partition 2", "md 1.2 on old partition 3", "md 1.1 on old partition 4", "md 1.0 on old partition 5",
		"md 0.90 on old partition 6", "ext4 on old partition 7"} {
		if !slices.Contains(res.Wiped, w) {
			t.Errorf("result's wiped %q does not name %q", res.Wiped, w)
		}
	}
	for n := range want {
		p := parts[n-1]
		if got := probe(t, dev, p.start, p.len); got != "" {
			t.Errorf("after the deploy, blkid -p still finds %q on old partition %d", got, n)
		}
		pd := loopRange(t, dev, p.start, p.len)
		if sigs := wipefsList(t, pd); len(sigs) != 0 {
			t.Errorf("after the deploy, wipefs -n finds %v on old partition %d", sigs, n)
		}
	}
	out, _ := exec.Command("pvs", "--config", lvmConfig, "--noheadings", "-o", "vg_name").CombinedOutput()
	if strings.Contains(string(out), vg) {
		t.Errorf("after the deploy, lvm2 still sees volume group %s: %s", vg, out)
	}
	// What remains on the whole disk is the image's own partition table.
	for _, s := range wipefsList(t, dev) {
		if !strings.HasPrefix(s, "gpt@") && !strings.HasPrefix(s, "PMBR@") {
			t.Errorf("after the deploy, wipefs -n finds %s on the disk", s)
		}
	}
	if out := run(t, "sgdisk", "-v", dev); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v %s:\n%s", dev, out)
	}
}

// TestWipeOldOnFile runs wipeOld on an image file (no root, no loop device): the
// md and ext4 superblocks on the old partitions go, whether the old table is read
// from the primary GPT or, the primary damaged, from the backup.
func TestWipeOldOnFile(t *testing.T) {
	for _, tool := range []string{"sgdisk", "blkid", "mkfs.ext4"} {
		testenv.NeedTool(t, tool)
	}
	for _, damaged := range []bool{false, true} {
		t.Run(map[bool]string{false: "primary GPT", true: "backup GPT"}[damaged], func(t *testing.T) {
			const size = 40 * mib
			path := filepath.Join(t.TempDir(), "old.img")
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, size); err != nil {
				t.Fatal(err)
			}
			run(t, "sgdisk", "-n1:2048:+8M", "-t1:fd00", "-n2:0:+8M", "-t2:8300", "-n3:0:+8M", "-t3:fd00", path)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			pt, err := ReadPartitionTable(f, size, 512)
			if err != nil {
				t.Fatal(err)
			}
			p1, p2, p3 := pt.Partitions[0], pt.Partitions[1], pt.Partitions[2]
			if _, err := f.WriteAt(mdSuper1(p1.Size, 4096), p1.Start+4096); err != nil {
				t.Fatal(err)
			}
			end := (p3.Size/512 - 16) &^ 7 * 512
			if _, err := f.WriteAt(mdSuper1(p3.Size, end), p3.Start+end); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", fmt.Sprintf("offset=%d", p2.Start), path, fmt.Sprint(p2.Size/1024)).CombinedOutput(); err != nil {
				t.Fatalf("mkfs.ext4: %v %s", err, out)
			}
			want := []string{"linux_raid_member", "ext4", "linux_raid_member"}
			for i, p := range []Partition{p1, p2, p3} {
				if got := probe(t, path, p.Start, p.Size); got != want[i] {
					t.Fatalf("before: blkid -p finds %q on partition %d, want %q", got, p.Number, want[i])
				}
			}
			if damaged {
				if _, err := f.WriteAt(make([]byte, 512), 512); err != nil {
					t.Fatal(err)
				}
			}
			tg := &target{path: path, buffered: f, size: size, sectorSize: 512}
			wiped, err := tg.wipeOld()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("wiped: %s", strings.Join(wiped, ", "))
			for _, w := range []string{"gpt", "md 1.2 on old partition 1", "ext4 on old partition 2", "md 1.0 on old partition 3"} {
				if !slices.Contains(wiped, w) {
					t.Errorf("wiped %q does not name %q", wiped, w)
				}
			}
			for _, p := range []Partition{p1, p2, p3} {
				if got := probe(t, path, p.Start, p.Size); got != "" {
					t.Errorf("after: blkid -p still finds %q on partition %d", got, p.Number)
				}
			}
		})
	}
}

// TestWipeOldMBRLogical: an md member on a logical partition of an old MBR disk
// (found through the extended partition's EBR chain) is wiped too.
func TestWipeOldMBRLogical(t *testing.T) {
	testenv.NeedTool(t, "sfdisk")
	testenv.NeedTool(t, "blkid")
	const size = 48 * mib
	path := filepath.Join(t.TempDir(), "old-mbr.img")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sfdisk", "-q", path)
	cmd.Stdin = strings.NewReader("label: dos\n,8M,83\n,,5\n,8M,83\n,8M,fd\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v %s", err, out)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	logical := mbrLogicalPartitions(f, size, 512)
	if len(logical) != 2 || logical[0].Number != 5 || logical[1].Number != 6 {
		t.Fatalf("logical partitions %+v, want 5 and 6", logical)
	}
	p6 := logical[1]
	if _, err := f.WriteAt(mdSuper1(p6.Size, 4096), p6.Start+4096); err != nil {
		t.Fatal(err)
	}
	if got := probe(t, path, p6.Start, p6.Size); got != "linux_raid_member" {
		t.Fatalf("before: blkid -p finds %q on partition 6", got)
	}
	tg := &target{path: path, buffered: f, size: size, sectorSize: 512}
	wiped, err := tg.wipeOld()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wiped: %s", strings.Join(wiped, ", "))
	if !slices.Contains(wiped, "md 1.2 on old partition 6") || !slices.Contains(wiped, "dos") {
		t.Errorf("wiped %q", wiped)
	}
	if got := probe(t, path, p6.Start, p6.Size); got != "" {
		t.Errorf("after: blkid -p still finds %q on partition 6", got)
	}
}
