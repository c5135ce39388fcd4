package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// TestOS is the small OS the lab deploys: a GPT disk whose ESP boots (both
// firmwares) a kernel and an initramfs, and whose ext4 root holds /etc (an indexed
// directory of some hundreds of entries, like a real one), /boot/vmlinuz,
// /boot/initrd.img and /boot/bcd-cmdline for kexec (the names deploy reads), and
// /var/lib/bcd. Its init loads the virtio and ext4 modules, takes an address with
// udhcpc, mounts the root, links /etc/bcd and /var/lib/bcd into it, then runs what
// an OS that deploy.image installed runs: bcd join --token-file
// /etc/bcd/join-token --node-id …, then bcd node. The identity lives on the disk,
// so the node comes back after a reboot.
type TestOS struct {
	Kernel     string // vmlinuz
	ModulesDir string // the kernel's lib/modules/<kver> (scripts/fetch-kernel.sh)
	Bcd        string // a static bcd binary
	// Cmdline is the kernel command line of every boot (firmware and kexec); the
	// init reads bcd.proxy from it and exports it as HTTPS_PROXY.
	Cmdline string
	SizeMiB int // whole disk; default 320
}

// Modules the test OS's init loads, in order (u-root-free: busybox modprobe reads
// modules.dep).
var testOSModules = []string{"virtio_pci", "virtio_net", "virtio_blk", "virtio_rng", "crc32c_generic", "ext4", "vfat", "nls_ascii", "nls_cp437"}

const testOSInit = `#!/bin/sh
export PATH=/bin:/sbin
busybox mount -t proc proc /proc
busybox mount -t sysfs sys /sys
busybox mount -t devtmpfs dev /dev
busybox mkdir -p /run /tmp /sysroot
echo "bcd-testos: init"
for m in ` + "MODULES" + `; do busybox modprobe "$m" 2>/dev/null; done
i=0
while [ ! -e /sys/class/block/vda ] && [ $i -lt 100 ]; do busybox sleep 0.1; i=$((i+1)); done
root=$(busybox findfs LABEL=root)
busybox mount -t ext4 "$root" /sysroot || { echo "bcd-testos: cannot mount the root ($root)"; busybox sh; }
busybox mkdir -p /etc /var/lib
busybox ln -sfn /sysroot/etc/bcd /etc/bcd
busybox mkdir -p /sysroot/var/lib/bcd
busybox ln -sfn /sysroot/var/lib/bcd /var/lib/bcd
busybox ip link set lo up
for dev in /sys/class/net/*; do
	n=${dev##*/}
	[ "$n" = lo ] && continue
	busybox ip link set "$n" up
	busybox udhcpc -i "$n" -n -q -t 10 -T 2 -s /udhcpc.sh && break
done
for w in $(busybox cat /proc/cmdline); do
	case "$w" in bcd.proxy=*) export HTTPS_PROXY="${w#bcd.proxy=}" ;; esac
done
echo "bcd-testos: root $root, proxy ${HTTPS_PROXY:-none}"
if [ -f /etc/bcd/join-token ]; then
	/bin/bcd join --token-file /etc/bcd/join-token --node-id "$(busybox cat /etc/bcd/node-id)"
else
	/bin/bcd join
fi
echo "bcd-testos: bcd join exited $?"
exec /bin/bcd node
`

const udhcpcScript = `#!/bin/sh
case "$1" in
bound|renew)
	busybox ip addr flush dev "$interface"
	busybox ip addr add "$ip/${mask:-24}" dev "$interface"
	[ -n "$router" ] && busybox ip route add default via "${router%% *}" dev "$interface"
	echo "bcd-testos: $interface $ip"
	;;
esac
exit 0
`

// Build writes the disk image to path.
func (o TestOS) Build(path string) error {
	work, err := os.MkdirTemp("", "bcd-testos-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	// The initramfs: busybox, bcd, the modules and their indexes. modprobe prints
	// module paths in the form -d was given; an absolute directory keeps the
	// prefix we strip from them exact.
	if abs, err := filepath.Abs(o.ModulesDir); err == nil {
		o.ModulesDir = abs
	}
	kver := filepath.Base(o.ModulesDir)
	files := map[string]string{"/bin/bcd": o.Bcd}
	script := filepath.Join(work, "udhcpc.sh")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		return err
	}
	files["/udhcpc.sh"] = script
	for _, m := range testOSModules {
		out, err := exec.Command("modprobe", "-S", kver, "-d", filepath.Dir(filepath.Dir(filepath.Dir(o.ModulesDir))), "--show-depends", m).Output()
		if err != nil {
			return fmt.Errorf("testbed: modprobe --show-depends %s: %w", m, err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "insmod" {
				rel := strings.TrimPrefix(f[1], o.ModulesDir)
				files["/lib/modules/"+kver+rel] = f[1]
			}
		}
	}
	for _, idx := range []string{"modules.dep", "modules.alias", "modules.builtin", "modules.order"} {
		files["/lib/modules/"+kver+"/"+idx] = filepath.Join(o.ModulesDir, idx)
	}
	initrd := filepath.Join(work, "initrd")
	init := strings.Replace(testOSInit, "MODULES", strings.Join(testOSModules, " "), 1)
	if err := BusyboxInitramfs(initrd, init, files); err != nil {
		return err
	}

	// The root: /etc as an indexed directory, the kernel for kexec, a bcd directory.
	root := filepath.Join(work, "root")
	for _, d := range []string{"etc/bcd", "boot", "var/lib/bcd", "etc/conf.d"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	os.Chmod(filepath.Join(root, "etc/bcd"), 0o700)
	os.WriteFile(filepath.Join(root, "etc/os-release"), []byte("ID=bcdtest\nNAME=\"bcd test OS\"\nVERSION_ID=1\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("bcd-testos\n"), 0o644)
	for i := 0; i < 600; i++ {
		os.WriteFile(filepath.Join(root, "etc", fmt.Sprintf("testos-entry-%03d.conf", i)), []byte("# filler: a real /etc is an htree directory\n"), 0o644)
	}
	if err := copyFile(o.Kernel, filepath.Join(root, "boot/vmlinuz")); err != nil {
		return err
	}
	if err := copyFile(initrd, filepath.Join(root, "boot/initrd.img")); err != nil {
		return err
	}
	os.WriteFile(filepath.Join(root, "boot/bcd-cmdline"), []byte(o.Cmdline+"\n"), 0o644)

	size := o.SizeMiB
	if size == 0 {
		size = 320
	}
	return BootDisk{Path: path, SizeMiB: size, Kernel: o.Kernel, Initrd: initrd, Cmdline: o.Cmdline, RootDir: root}.Build()
}
