#!/bin/sh
# Builds the ramdisk: initramfs/build.sh OUT KERNEL_DIR
#   OUT         the compressed initramfs to write (xz, as the kernel unpacks it)
#   KERNEL_DIR  scripts/fetch-kernel.sh's directory: vmlinuz and lib/modules/KVER
# Two newc archives, concatenated (the kernel unpacks each in turn):
#   1. u-root: init, the debugging commands and bcd, with uinit `bcd ramdisk`;
#   2. extras: the external tools the job kinds call, with their shared libraries,
#      and the kernel modules (NIC, storage, filesystems) with depmod's indexes.
# A build takes minutes (gobusybox rebuilds everything), so the result is cached
# under BCD_INITRAMFS_CACHE (default .cache/initramfs; "off" disables it), keyed
# on a hash of every input: the Go files bcd is built from, go.mod and go.sum, the
# Go toolchain, this script, the kernel's modules and the tools copied in.
set -eu
out=$1
kdir=$2
top=$(cd "$(dirname "$0")/.." && pwd)
kver=$(basename "$(readlink -f "$kdir")")
kmods=$kdir/lib/modules/$kver
[ -d "$kmods" ] || { echo "build.sh: no modules for $kver in $kdir" >&2; exit 1; }

# Kernel modules, loaded by modalias at start (bcd ramdisk). The list is the drivers
# real servers need (a missing NIC driver is the most common ramdisk failure) plus
# what the job kinds use; modprobe resolves their dependencies.
modules="virtio_pci virtio_net virtio_blk virtio_scsi virtio_rng virtio_console
e1000 e1000e igb igbvf ixgbe ixgbevf i40e iavf ice mlx4_en mlx5_core bnxt_en tg3 r8169 bnx2x
nvme ahci ata_piix sd_mod sr_mod mpt3sas megaraid_sas
ext4 vfat nls_ascii nls_cp437 nls_utf8 crc32c_generic crc32c_intel efivarfs
ipmi_si ipmi_devintf ipmi_msghandler tpm_tis tpm_crb loop"

# External tools (spec "The ramdisk"): nvme-cli, hdparm, util-linux, e2fsprogs'
# debugfs (and e2fsck, which deploy runs after writing), mtools, udevadm,
# kexec-tools, xz (deploy decodes with it when present, 4x the pure-Go rate) and
# dcgmi where installed. zstd, sgdisk, partprobe and mke2fs are left out: deploy
# does their part in Go, and their libraries (libstdc++, libparted) cost MBs.
tools="debugfs e2fsck mtools hdparm nvme blkdiscard blockdev lsblk mount umount udevadm kexec xz dcgmi"

tool_paths() {
	for t in $tools; do
		p=$(command -v "$t" 2>/dev/null || true)
		[ -n "$p" ] && readlink -f "$p"
	done
	return 0
}

# The cache key: what changes the image changes the key.
cache=${BCD_INITRAMFS_CACHE:-$top/.cache/initramfs}
if [ "$cache" != off ]; then
	key=$(
		cd "$top"
		{
			echo "kernel $kver"
			cat "$0"
			go version
			go env GOOS GOARCH GOFLAGS
			cat go.mod go.sum
			# Every Go file of this module that bcd is built from.
			# shellcheck disable=SC2016 # a Go template, not a shell expansion
			CGO_ENABLED=0 go list -deps -f '{{if and (not .Standard) .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}} {{end}}{{range .EmbedFiles}}{{$d}}/{{.}} {{end}}{{end}}{{end}}' ./cmd/bcd |
				tr ' ' '\n' | sed '/^$/d' | LC_ALL=C sort | xargs sha256sum
			(cd "$kmods" && sha256sum modules.dep modules.alias modules.builtin)
			tool_paths | xargs -r sha256sum
			sha256sum /etc/ssl/certs/ca-certificates.crt 2>/dev/null || true
		} | sha256sum | cut -c1-24
	)
	if [ -f "$cache/$key/initramfs.xz" ]; then
		cp "$cache/$key/initramfs.xz" "$out.tmp"
		mv "$out.tmp" "$out"
		cp "$cache/$key/initramfs.xz.size" "$out.size" 2>/dev/null || true
		echo "initramfs $(basename "$out"): from the cache ($cache/$key)"
		exit 0
	fi
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/bcd-initramfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/extras
mkdir -p "$stage/bin" "$stage/lib/modules/$kver"

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
		rel=${f#*/lib/modules/"$kver"/}
		mkdir -p "$stage/lib/modules/$kver/$(dirname "$rel")"
		cp "$f" "$stage/lib/modules/$kver/$rel"
	done
done
[ -z "$missing" ] || echo "build.sh: not in kernel $kver (skipped):$missing" >&2
depmod -b "$stage" "$kver"

# Tools and their libraries (ldd). Missing ones are reported, not fatal: a job
# kind that needs one fails with its name.
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

# The system roots, for https image servers that a public CA vouches for (the
# gateway itself is pinned and needs none).
# mtools converts FAT names through iconv: without glibc's gconv modules for the DOS
# code pages it fails ("Error converting to codepage 850") before touching the ESP.
gconv=/usr/lib/x86_64-linux-gnu/gconv
if [ -d "$gconv" ]; then
	mkdir -p "$stage$gconv"
	for g in gconv-modules gconv-modules.cache gconv-modules.d IBM850.so IBM437.so UTF-16.so UTF-32.so; do
		[ -e "$gconv/$g" ] && cp -a "$gconv/$g" "$stage$gconv/"
	done
fi

if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	mkdir -p "$stage/etc/ssl/certs"
	cp /etc/ssl/certs/ca-certificates.crt "$stage/etc/ssl/certs/"
else
	echo "build.sh: no /etc/ssl/certs/ca-certificates.crt (install ca-certificates): https images need a pinned server" >&2
fi

(cd "$stage" && find . | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) > "$work/extras.cpio"

# u-root: gobusybox rebuilds everything (1-2 min on 2 cores); CGO off like every bcd.
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

# What it is made of: the budget is 20 MB compressed.
{
	echo "initramfs $(basename "$out"): $(stat -c %s "$out") bytes xz"
	echo "  u-root archive (init, commands, bcd): $(stat -c %s "$work/uroot.cpio") bytes uncompressed"
	echo "  extras archive (tools, libraries, modules): $(stat -c %s "$work/extras.cpio") bytes uncompressed"
	echo "  modules: $(du -sb "$stage/lib/modules" | cut -f1) bytes; tools: $(du -sb "$stage/bin" | cut -f1) bytes; libraries: $(du -sb "$stage/lib/x86_64-linux-gnu" "$stage/lib64" 2>/dev/null | awk '{s+=$1} END {print s}') bytes"
	echo "  largest files of the extras:"
	(cd "$stage" && find . -type f -printf '%s %p\n' | sort -rn | head -n 12 | sed 's/^/    /')
} | tee "$out.size"

if [ "$cache" != off ]; then
	mkdir -p "$cache/$key"
	cp "$out" "$cache/$key/initramfs.xz.tmp"
	cp "$out.size" "$cache/$key/initramfs.xz.size"
	mv "$cache/$key/initramfs.xz.tmp" "$cache/$key/initramfs.xz"
	# Keep the three newest builds.
	# shellcheck disable=SC2012 # the names are our hex keys
	ls -1td "$cache"/*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
fi
