package initramfs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/bcd/agent/agenttest"
	"github.com/better-compute/bcd/internal/testenv"
	"github.com/better-compute/bcd/protocol"
	"github.com/better-compute/bcd/testbed"
)

// maxCompressed is the size budget of the ramdisk: it crosses every machine's PXE
// network (and a TFTP fallback) on every deploy.
const maxCompressed = 20 << 20

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// The image is built once and shared by the tests of this binary; TestMain
// removes it.
var (
	buildOnce sync.Once
	buildDir  string
	built     string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// image builds the initramfs once per test binary, or takes it from build.sh's
// cache (.cache/initramfs) when no input changed.
func image(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the ramdisk (minutes); not in -short")
	}
	testenv.NeedRoot(t)
	for _, tool := range []string{"cpio", "xz", "depmod", "modprobe", "ldd"} {
		testenv.NeedTool(t, tool)
	}
	root := repoRoot(t)
	kdir := filepath.Join(root, ".cache/kernel/current")
	if _, err := os.Stat(filepath.Join(kdir, "vmlinuz")); err != nil {
		testenv.Skip(t, "no kernel in .cache/kernel/current (scripts/fetch-kernel.sh)")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bcd-initramfs-test-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		out := filepath.Join(dir, "initramfs.xz")
		cmd := exec.Command(filepath.Join(root, "initramfs/build.sh"), out, kdir)
		cmd.Dir = root
		var log bytes.Buffer
		cmd.Stdout, cmd.Stderr = &log, &log
		start := time.Now()
		if err := cmd.Run(); err != nil {
			buildErr = fmt.Errorf("build.sh: %v\n%s", err, log.String())
			return
		}
		t.Logf("build.sh (%s):\n%s", time.Since(start).Round(time.Second), log.String())
		built = out
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

type cpioEntry struct {
	mode uint32
	size int64
	link string // symlink target
}

// listCPIO reads every newc archive in r (the kernel unpacks concatenated
// archives in turn; cpio -t stops after the first).
func listCPIO(r io.Reader) (map[string]cpioEntry, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	out := map[string]cpioEntry{}
	var off int64
	skip := func(n int64) error {
		m, err := io.CopyN(io.Discard, br, n)
		off += m
		return err
	}
	for {
		// Archives are padded with NULs to a block; skip them between archives.
		b, err := br.Peek(1)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if b[0] == 0 {
			if err := skip(1); err != nil {
				return nil, err
			}
			continue
		}
		hdr := make([]byte, 110)
		if _, err := io.ReadFull(br, hdr); err != nil {
			return nil, fmt.Errorf("header at %d: %w", off, err)
		}
		off += 110
		if string(hdr[:6]) != "070701" {
			return nil, fmt.Errorf("no newc magic at %d", off-110)
		}
		field := func(i int) int64 {
			v, _ := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			return int64(v)
		}
		mode, size, nameSize := uint32(field(1)), field(6), field(11)
		name := make([]byte, nameSize)
		if _, err := io.ReadFull(br, name); err != nil {
			return nil, err
		}
		off += nameSize
		if err := skip((4 - off%4) % 4); err != nil {
			return nil, err
		}
		n := strings.TrimPrefix(strings.TrimRight(string(name), "\x00"), "./")
		e := cpioEntry{mode: mode, size: size}
		if mode&0o170000 == 0o120000 {
			link := make([]byte, size)
			if _, err := io.ReadFull(br, link); err != nil {
				return nil, err
			}
			off += size
			e.link = string(link)
		} else if err := skip(size); err != nil {
			return nil, err
		}
		if err := skip((4 - off%4) % 4); err != nil {
			return nil, err
		}
		if n != "TRAILER!!!" {
			out[n] = e
		}
	}
}

// TestImageContents checks what the kernel will unpack: init, uinit being bcd
// ramdisk, the tools, the modules with depmod's index, and the size budget.
func TestImageContents(t *testing.T) {
	img := image(t)
	fi, err := os.Stat(img)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxCompressed {
		t.Errorf("the initramfs is %d bytes, over the %d-byte budget", fi.Size(), maxCompressed)
	}
	xz := exec.Command("xz", "-dc", img)
	stdout, err := xz.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := xz.Start(); err != nil {
		t.Fatal(err)
	}
	files, err := listCPIO(stdout)
	if werr := xz.Wait(); err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		t.Fatal(err)
	}
	kdirs, _ := filepath.Glob(filepath.Join(repoRoot(t), ".cache/kernel/current/lib/modules/*"))
	kver := filepath.Base(kdirs[0])
	for _, want := range []string{
		"init", "bbin/bcd", "bin/uinit", "etc/uinit.flags", "bin/defaultsh",
		"bin/debugfs", "bin/e2fsck", "bin/mtools", "bin/mcopy", "bin/kexec", "bin/blkdiscard", "bin/lsblk",
		"lib64/ld-linux-x86-64.so.2", "etc/ssl/certs/ca-certificates.crt",
		"lib/modules/" + kver + "/modules.dep", "lib/modules/" + kver + "/modules.alias",
		"lib/modules/" + kver + "/modules.softdep", "lib/modules/" + kver + "/modules.builtin",
		"lib/modules/" + kver + "/kernel/drivers/net/virtio_net.ko",
		"lib/modules/" + kver + "/kernel/drivers/virtio/virtio_pci.ko",
		"lib/modules/" + kver + "/kernel/fs/ext4/ext4.ko",
		"lib/modules/" + kver + "/kernel/crypto/crc32c_generic.ko",
	} {
		if _, ok := files[want]; !ok {
			t.Errorf("the initramfs has no %s", want)
		}
	}
	if l := files["bin/uinit"].link; !strings.HasSuffix(l, "bbin/bcd") {
		t.Errorf("bin/uinit links to %q, not bcd", l)
	}
	var modules int64
	for name, e := range files {
		if strings.HasSuffix(name, ".ko") {
			modules += e.size
		}
	}
	t.Logf("initramfs: %d bytes xz, %d entries, %d bytes of modules", fi.Size(), len(files), modules)
}

// TestBootsToBcdRamdisk boots Debian's kernel with the initramfs in QEMU (no NIC)
// and reads the console: u-root's init starts bcd ramdisk, which prints its first
// JSON line with the parsed parameters and loads the virtio modules by modalias;
// with a parameter missing it exits 2 naming it.
func TestBootsToBcdRamdisk(t *testing.T) {
	img := image(t)
	testenv.NeedTool(t, "qemu-system-x86_64")
	kernel := testbed.KernelPath(repoRoot(t))
	const pin = "sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	params := []string{
		protocol.CmdlineGatewayURL + "=https://gw.test.invalid:8443",
		protocol.CmdlineServerName + "=gw.test.invalid",
		protocol.CmdlineSite + "=site_qemu",
		protocol.CmdlineServingCAPin + "=" + pin,
		protocol.CmdlineJoinSigningPin + "=" + pin,
		protocol.CmdlineJoinEncryptionPin + "=" + pin,
		protocol.CmdlineBootNonce + "=Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_",
	}
	boot := func(t *testing.T, name string, bcd []string, extra ...string) *testbed.VM {
		t.Helper()
		vm, err := testbed.StartVM(nil, testbed.VMConfig{
			Name: name, Dir: filepath.Join(t.TempDir(), name), MemoryMB: 768,
			Kernel: kernel, Initrd: img,
			Append: "console=ttyS0,115200 panic=-1 " + strings.Join(bcd, " "),
			Extra:  extra,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() || testing.Verbose() {
				t.Log(vm.Tail(60))
			}
			vm.Stop()
		})
		return vm
	}
	wait := func(t *testing.T, vm *testbed.VM, re string, d time.Duration) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		m, err := vm.WaitConsole(ctx, regexp.MustCompile(re))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	t.Run("parameters", func(t *testing.T) {
		vm := boot(t, "ramdisk-params", params)
		// Each pattern ends at the line's newline: the console is read while
		// the guest writes it, and half a line matches [^\n]* too.
		line := wait(t, vm, `\{"time":[^\n]*"msg":"bcd ramdisk starting"[^\n]*\n`, 3*time.Minute)
		for _, want := range []string{`"site":"site_qemu"`, `"gateway_url":"https://gw.test.invalid:8443"`,
			`"serving_ca_pin":"` + pin + `"`, `"boot_nonce":"(43 characters)"`, `"proxy":"none"`} {
			if !strings.Contains(line, want) {
				t.Errorf("the first line lacks %s: %s", want, line)
			}
		}
		// virtio-rng-pci is the VM's only virtio device: virtio_pci loads by its
		// PCI modalias, and virtio_rng in the round after, by the device it brought.
		mods := wait(t, vm, `"msg":"kernel modules loaded"[^\n]*\n`, time.Minute)
		for _, want := range []string{"virtio_pci", "virtio_rng", "ext4", "vfat"} {
			if !strings.Contains(mods, `"`+want+`"`) {
				t.Errorf("%s not loaded: %s", want, mods)
			}
		}
		// No NIC (-nic none): the network step says so and retries.
		wait(t, vm, `"msg":"no network yet; trying again"[^\n]*no Ethernet NIC`, time.Minute)
	})

	t.Run("joins through DHCP and powers off", func(t *testing.T) {
		testenv.NeedTool(t, "socat")
		const mac = "52:54:00:be:cd:01"
		const nonce = "Jq2c0wXy1bLr4TUVnKZ8g0pD7sHfQe3m5a9RtYuIoP_"
		g := agenttest.New(t)
		g.Nonces[nonce] = agenttest.Nonce{MAC: mac, Site: "fsn1", NodeID: "ramdisk_qemu"}
		var mu sync.Mutex
		var statuses []protocol.Status
		g.OnSession = func(ctx context.Context, c *agenttest.Conn) {
			c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "inv", Kind: protocol.KindInventory})
			agenttest.AckAll(ctx, c, func(f protocol.Frame) {
				if f.Type != protocol.FrameStatus {
					return
				}
				var st protocol.Status
				f.Decode(&st)
				mu.Lock()
				statuses = append(statuses, st)
				mu.Unlock()
				if st.CommandID == "inv" && st.State == protocol.StateSucceeded {
					c.Send(ctx, protocol.FrameCommand, protocol.Command{ID: "off", Kind: protocol.KindMachineOff})
				}
			})
		}
		gw, _ := url.Parse(g.URL)
		pins := g.Pins
		bcd := []string{
			protocol.CmdlineGatewayURL + "=https://10.0.2.100:8443",
			protocol.CmdlineServerName + "=127.0.0.1",
			protocol.CmdlineSite + "=fsn1",
			protocol.CmdlineServingCAPin + "=" + pins.ServingCA,
			protocol.CmdlineJoinSigningPin + "=" + pins.JoinSigning,
			protocol.CmdlineJoinEncryptionPin + "=" + pins.JoinEncryption,
			protocol.CmdlineBootNonce + "=" + nonce,
		}
		// QEMU's user network with restrict=on reaches nothing but its own DHCP
		// server and the one forward: 10.0.2.100:8443 to the gateway on loopback.
		vm := boot(t, "ramdisk-join", bcd,
			"-netdev", "user,id=n1,restrict=on,guestfwd=tcp:10.0.2.100:8443-cmd:socat - TCP:"+gw.Host,
			"-device", "virtio-net-pci,netdev=n1,mac="+mac)
		wait(t, vm, `"msg":"network interface configured"[^\n]*"mac":"`+mac+`"[^\n]*"address":"10\.0\.2\.15/24"`, 3*time.Minute)
		wait(t, vm, `"msg":"joined"[^\n]*"node_id":"ramdisk_qemu"`, 2*time.Minute)
		select {
		case <-vm.Exited():
		case <-time.After(2 * time.Minute):
			t.Fatal("the VM did not power off")
		}
		mu.Lock()
		defer mu.Unlock()
		var got []string
		for _, st := range statuses {
			got = append(got, st.CommandID+":"+st.State)
		}
		if strings.Join(got, " ") != "inv:RUNNING inv:SUCCEEDED off:RUNNING off:SUCCEEDED" {
			t.Fatalf("statuses %v", got)
		}
		if joins := g.Joins(); len(joins) != 1 || !slices.Contains(joins[0].Claims.MACs, mac) {
			t.Fatalf("joins %+v", joins)
		}
	})

	t.Run("missing parameter", func(t *testing.T) {
		vm := boot(t, "ramdisk-missing", params[:len(params)-1])
		wait(t, vm, `bcd ramdisk: kernel parameter `+regexp.QuoteMeta(protocol.CmdlineBootNonce)+` is missing`, 3*time.Minute)
	})
}
