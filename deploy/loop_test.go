package deploy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
)

// loopDevice attaches a file of size bytes (its first bytes from prefill) as a
// loop device with partition scanning, detached at the end of the test.
func loopDevice(t *testing.T, size int64, prefill []byte) string {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.NeedTool(t, "losetup")
	backing := filepath.Join(t.TempDir(), "backing.img")
	if err := os.WriteFile(backing, prefill, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	// Something at the end, as an old disk's backup GPT would be.
	f, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(bytes.Repeat([]byte("old backup GPT "), 4096), size-wipeSize)
	f.Close()
	out, err := exec.Command("losetup", "-f", "--show", "-P", backing).Output()
	if err != nil {
		testenv.Skip(t, "losetup -f --show -P: "+err.Error())
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v %s", dev, err, out)
		}
	})
	return dev
}

// TestDeployLoopDevice deploys onto a real block device: O_DIRECT, BLKZEROOUT,
// BLKRRPART, the backup GPT moved to the device's end, files written through the
// whole disk at the partitions' offsets, the kernel read back for kexec.
func TestDeployLoopDevice(t *testing.T) {
	img := smallImage(t)
	old, err := os.ReadFile(fat32Image(t).path) // a previous OS on the disk
	if err != nil {
		t.Fatal(err)
	}
	size := img.size + 24<<20
	dev := loopDevice(t, size, old)
	body := compressed(t, img, protocol.FormatZstd)
	srv := serve(t, body, serveOK, false)
	m := &fakeMachine{}
	d := &Deployer{AllowHTTP: true, Machine: m, ProcCmdline: "/nonexistent"}
	p := params(srv.URL, body, protocol.FormatZstd, img.size, dev)
	p.Files = deployFiles()
	p.After.Action = protocol.AfterKexec
	res, err := d.Deploy(context.Background(), p, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result: direct %v, skipped zeros %v, warnings %v", res.Direct, res.SkippedZeros, res.Warnings)
	if !res.Direct {
		t.Error("the loop device was not written with O_DIRECT")
	}
	if res.Target.Size != size || res.Target.Name != filepath.Base(dev) {
		t.Errorf("disk %+v", res.Target)
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings: %v", res.Warnings)
	}
	if out := run(t, "sgdisk", "-v", dev); !strings.Contains(out, "No problems found") {
		t.Errorf("sgdisk -v %s:\n%s", dev, out)
	}
	checkFiles(t, dev, img)
	if !bytes.Equal(m.kernel, img.kernel) || !bytes.Equal(m.initrd, img.initrd) || m.cmdline != bcdCmdline {
		t.Errorf("kexec: kernel %d bytes, initrd %d, cmdline %q", len(m.kernel), len(m.initrd), m.cmdline)
	}
	// The data partition is the image's, byte for byte; beyond the image, nothing of
	// the old disk survives where a partition table could be.
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want, _ := os.ReadFile(img.path)
	got := make([]byte, img.dataSize)
	if _, err := f.ReadAt(got, img.dataStart); err != nil || !bytes.Equal(got, want[img.dataStart:img.dataStart+img.dataSize]) {
		t.Errorf("data partition differs (%v)", err)
	}
	// The kernel's view of the new partitions, where it parses GPT at all.
	name := filepath.Base(dev)
	part := filepath.Join("/sys/block", name, name+"p2")
	if b, err := os.ReadFile(filepath.Join(part, "start")); err == nil {
		start, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if start*512 != img.rootStart {
			t.Errorf("kernel says partition 2 starts at sector %d, want %d", start, img.rootStart/512)
		}
	} else {
		t.Logf("no %s: this kernel does not parse GPT (CONFIG_EFI_PARTITION); offsets on the whole disk were used", part)
	}

	t.Run("load the installed kernel", func(t *testing.T) {
		m2 := &fakeMachine{}
		d2 := &Deployer{Machine: m2, ProcCmdline: "/nonexistent"}
		if _, err := d2.LoadInstalled(context.Background(), Target{Path: dev}, After{}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(m2.kernel, img.kernel) || m2.cmdline != bcdCmdline {
			t.Errorf("kernel %d bytes, cmdline %q", len(m2.kernel), m2.cmdline)
		}
	})

	t.Run("failure wipes the device", func(t *testing.T) {
		p := params(srv.URL, body, protocol.FormatZstd, img.size, dev)
		p.Image.SHA256 = strings.Repeat("0", 64)
		_, err := d.Deploy(context.Background(), p, nil)
		if err == nil || Reason(err) != protocol.DeployReasonDigest {
			t.Fatalf("err %v", err)
		}
		for _, off := range []int64{0, size - wipeSize, img.size - wipeSize} {
			b := make([]byte, wipeSize)
			if _, err := f.ReadAt(b, off); err != nil {
				t.Fatal(err)
			}
			if !allZero(b) {
				t.Errorf("the MiB at %d is not zero", off)
			}
		}
		if pt, err := ReadPartitionTable(f, size, 512); err == nil {
			t.Errorf("the device still has a partition table: %+v", pt)
		}
	})
}
