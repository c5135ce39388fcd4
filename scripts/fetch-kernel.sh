#!/bin/sh
# Unpacks Debian's linux-image-amd64 (the kernel the testbed and the ramdisk boot) into
# a cache directory, without installing it on this machine (no update-initramfs, no
# /boot changes): vmlinuz and lib/modules/KVER. Idempotent: does nothing when the cache already holds the version
# the archive offers. Prints the cache directory holding vmlinuz and lib/modules.
set -eu
cache=${1:-.cache/kernel}
mkdir -p "$cache"
pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)
if [ -z "$pkg" ]; then
	apt-get update -q >/dev/null
	pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n1)
fi
[ -n "$pkg" ] || { echo "fetch-kernel: cannot resolve linux-image-amd64" >&2; exit 1; }
kver=${pkg#linux-image-}
if [ ! -f "$cache/$kver/vmlinuz" ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download -q "$pkg" >/dev/null)
	mkdir -p "$tmp/x"
	dpkg-deb -x "$tmp"/*.deb "$tmp/x"
	rm -rf "${cache:?}/$kver.new"
	mkdir -p "$cache/$kver.new"
	cp "$tmp/x/boot/vmlinuz-$kver" "$cache/$kver.new/vmlinuz"
	cp -a "$tmp/x/lib" "$cache/$kver.new/"
	# The package ships no modules.dep: depmod makes it (postinst would have).
	depmod -b "$cache/$kver.new" "$kver"
	mv "$cache/$kver.new" "$cache/$kver"
fi
ln -sfn "$kver" "$cache/current"
echo "$(cd "$cache/$kver" && pwd)"
