#!/bin/sh
# Builds the ramdisk: initramfs/build.sh OUT KERNEL_DIR
#   OUT         the compressed initramfs to write (xz, as the kernel unpacks it)
#   KERNEL_DIR  scripts/fetch-kernel.sh's directory: vmlinuz and lib/modules/KVER
# Two newc archives, concatenated (the kernel unpacks each in turn):
#   1. u-root: init, the debugging commands and bcd, with uinit `bcd ramdisk`;
#   2. extras: the external tools the job kinds call, with their shared libraries,
#      and the kernel modules (NIC, storage, filesystems) with depmod's indexes.
set -eu
out=$1
kdir=$2
top=$(cd "$(dirname "$0")/.." && pwd)
kver=$(basename "$(readlink -f "$kdir")")
[ -d "$kdir/lib/modules/$kver" ] || { echo "build.sh: no modules for $kver in $kdir" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/bcd-initramfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/extras
mkdir -p "$stage/bin" "$stage/lib/modules/$kver"

# Kernel modules, loaded by modalias at start. The list is the drivers real servers
# need (a missing NIC driver is the most common ramdisk failure) plus what the job
# kinds use; modprobe resolves their dependencies.
modules="virtio_pci virtio_net virtio_blk virtio_scsi virtio_rng virtio_console
e1000 e1000e igb igbvf ixgbe ixgbevf i40e iavf ice mlx4_en mlx5_core bnxt_en tg3 r8169 bnx2x
nvme ahci ata_piix sd_mod sr_mod mpt3sas megaraid_sas
ext4 vfat nls_ascii nls_cp437 nls_utf8 crc32c_generic crc32c_intel
ipmi_si ipmi_devintf ipmi_msghandler tpm_tis tpm_crb loop"
kmods=$kdir/lib/modules/$kver
cp "$kmods"/modules.order "$kmods"/modules.builtin "$kmods"/modules.builtin.modinfo "$stage/lib/modules/$kver/"
missing=""
for m in $modules; do
	deps=$(modprobe -S "$kver" -d "$kdir" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" {print $2}') || true
	if [ -z "$deps" ]; then
		# Built into the kernel, or absent from this kernel.
		grep -q "/$m.ko" "$kmods/modules.builtin" 2>/dev/null || missing="$missing $m"
		continue
	fi
	for f in $deps; do
		rel=${f#*/lib/modules/$kver/}
		mkdir -p "$stage/lib/modules/$kver/$(dirname "$rel")"
		cp "$f" "$stage/lib/modules/$kver/$rel"
	done
done
[ -z "$missing" ] || echo "build.sh: not in kernel $kver (skipped):$missing" >&2
depmod -b "$stage" "$kver"

# External tools and their libraries (ldd), for deploy and inventory.
tools="debugfs e2fsck mke2fs mtools hdparm nvme blkdiscard blockdev lsblk sfdisk partprobe udevadm kexec xz zstd sgdisk"
for t in $tools; do
	p=$(command -v "$t" 2>/dev/null || true)
	[ -n "$p" ] || { echo "build.sh: $t not installed (skipped)" >&2; continue; }
	p=$(readlink -f "$p")
	cp "$p" "$stage/bin/$t"
	ldd "$p" 2>/dev/null | awk '/=>/ {print $3} /^\t\/lib/ {print $1}' | while read -r lib; do
		[ -f "$lib" ] || continue
		mkdir -p "$stage$(dirname "$lib")"
		cp -L "$lib" "$stage$lib"
	done
done
# mtools is one binary; its commands are names for it.
for m in mcopy mmd mdir mdel mtype mattrib; do ln -sf mtools "$stage/bin/$m"; done
# glibc's loader is found at its absolute path, which ldd lists once per tool.
mkdir -p "$stage/lib64"
[ -e /lib64/ld-linux-x86-64.so.2 ] && cp -L /lib64/ld-linux-x86-64.so.2 "$stage/lib64/"

(cd "$stage" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) > "$work/extras.cpio"

# u-root: gobusybox rebuilds everything (~50 s on 2 cores); CGO off like every bcd.
(cd "$top" && CGO_ENABLED=0 go tool u-root -o "$work/uroot.cpio" -tmp-dir "$work" \
	-uinitcmd="bcd ramdisk" -defaultsh=gosh \
	github.com/u-root/u-root/cmds/core/init \
	github.com/u-root/u-root/cmds/core/gosh \
	github.com/u-root/u-root/cmds/core/ls \
	github.com/u-root/u-root/cmds/core/cat \
	github.com/u-root/u-root/cmds/core/ip \
	github.com/u-root/u-root/cmds/core/dhclient \
	github.com/u-root/u-root/cmds/core/dmesg \
	github.com/u-root/u-root/cmds/core/mount \
	github.com/u-root/u-root/cmds/core/mkdir \
	github.com/u-root/u-root/cmds/core/ps \
	github.com/u-root/u-root/cmds/core/lsmod \
	github.com/u-root/u-root/cmds/core/insmod \
	github.com/u-root/u-root/cmds/core/kexec \
	github.com/u-root/u-root/cmds/core/poweroff \
	github.com/u-root/u-root/cmds/core/shutdown \
	github.com/u-root/u-root/cmds/exp/modprobe \
	./cmd/bcd)

cat "$work/uroot.cpio" "$work/extras.cpio" | xz -T0 -6 --check=crc32 > "$out.tmp"
mv "$out.tmp" "$out"

# Record what it is made of: the size budget is 20 MB compressed.
{
	echo "initramfs $(basename "$out"): $(stat -c %s "$out") bytes xz"
	echo "  u-root archive (init, commands, bcd): $(stat -c %s "$work/uroot.cpio") bytes uncompressed"
	echo "  extras archive (tools, libraries, modules): $(stat -c %s "$work/extras.cpio") bytes uncompressed"
	echo "  modules: $(du -sb "$stage/lib/modules" | cut -f1) bytes; tools+libs: $(du -sb "$stage/bin" "$stage/lib/x86_64-linux-gnu" 2>/dev/null | awk '{s+=$1} END {print s}') bytes"
} | tee "$out.size"
