#!/bin/sh
# Builds the root filesystem of the lab's stock Debian image (testbed/debian_stock.go
# makes the disk and its compressed qcow2 from it): what an operator's Debian
# cloud image holds, and nothing of bcd. debootstrap --variant=minbase of bookworm
# with systemd, udev, Debian's kernel and initramfs-tools, then cloud-init and
# openssh-server installed with apt inside the chroot (debootstrap --include of
# cloud-init fails configuring python3-cryptography). No bcd, no bcd units, no
# /boot/bcd-cmdline, no /etc/kernel/cmdline, no network configuration of its own:
# cloud-init's fallback (DHCP on the first NIC, rendered for systemd-networkd)
# brings the network up, as in a vendor's image. root's password is locked.
#
# Usage: scripts/build-debian-stock-image.sh [CACHE]   (default .cache/debian-stock)
#
# The root goes to CACHE/root-<key>/root, where key hashes this script (which
# holds every input). An existing root with its stamp is reused; a changed script
# builds a new root and removes the old ones. Runs sharing a cache wait for each
# other (flock). Packages come from this host's own Debian mirror, cached in
# CACHE/debs. Prints the root's path.
set -eu

cd "$(dirname "$0")/.."
cache=${1:-.cache/debian-stock}
say() { printf 'build-debian-stock-image: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { say "run as root (debootstrap and chroot)"; exit 1; }

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

key=$(sha256sum "$0" | cut -c1-16)
out=$cache/root-$key
if [ -f "$out/done" ]; then
	say "cached: $out/root"
	cd "$out/root" && pwd
	exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 debootstrap >&2
fi

mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\/*\)[[:space:]]*$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
if [ -z "$mirror" ]; then
	mirror=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*\/debian\/*\)[[:space:]]\+bookworm[[:space:]].*/\2/p' /etc/apt/sources.list 2>/dev/null | head -n1)
fi
mirror=${mirror:-http://deb.debian.org/debian}

mkdir -p "$cache/debs"
cache_abs=$(cd "$cache" && pwd)
rm -rf "$out"
mkdir -p "$out"
root=$(cd "$out" && pwd)/root

mounted=''
cleanup() {
	for m in $mounted; do umount -l "$root/$m" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

packages=systemd,systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,zstd,kmod,e2fsprogs,iproute2,ca-certificates,procps,less
say "debootstrap --variant=minbase bookworm from $mirror (packages cached in $cache/debs)"
started=$(date +%s)
debootstrap --variant=minbase --cache-dir="$cache_abs/debs" --include="$packages" bookworm "$root" "$mirror" >"$out/debootstrap.log" 2>&1 || {
	say "debootstrap failed; the end of $out/debootstrap.log:"
	tail -n 30 "$out/debootstrap.log" >&2
	exit 1
}
say "debootstrap done in $(($(date +%s) - started)) s"

for m in proc sys dev; do
	mount --bind "/$m" "$root/$m"
	mounted="$m $mounted"
done

put() { # PATH MODE: standard input becomes PATH in the root
	mkdir -p "$(dirname "$root$1")"
	cat >"$root$1"
	chmod "$2" "$root$1"
}

# cloud-init, openssh-server and efibootmgr, as a vendor's cloud image has them; apt's
# archives go to the build cache too.
say "apt-get install cloud-init openssh-server efibootmgr"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
chroot "$root" /bin/sh -eu >"$out/apt.log" 2>&1 <<EOF || { say "apt-get failed; the end of $out/apt.log:"; tail -n 30 "$out/apt.log" >&2; exit 1; }
echo 'deb $mirror bookworm main' >/etc/apt/sources.list
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cloud-init openssh-server efibootmgr
EOF
# The packages downloaded inside the chroot stay for the next build.
cp -n "$root"/var/cache/apt/archives/*.deb "$cache/debs/" 2>/dev/null || true

# The kernel: only the modules a VM or a server board of the lab needs (as the
# lab's Debian flavour), so the image stays a few hundred MiB.
kver=$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n1)
kmods=$root/lib/modules/$kver/kernel
for d in drivers/gpu drivers/media drivers/infiniband drivers/staging drivers/net/wireless \
	drivers/bluetooth drivers/iio drivers/isdn drivers/mtd drivers/input/touchscreen drivers/input/joystick \
	drivers/video drivers/usb/serial drivers/usb/gadget drivers/hid drivers/comedi drivers/nfc drivers/net/can \
	drivers/net/usb drivers/net/ieee802154 drivers/net/wwan drivers/scsi/qla2xxx drivers/scsi/lpfc drivers/scsi/mpt3sas \
	drivers/scsi/bfa drivers/scsi/be2iscsi drivers/scsi/megaraid drivers/target drivers/thunderbolt drivers/platform/x86 \
	sound net/wireless net/mac80211 net/bluetooth net/ceph net/sunrpc \
	fs/btrfs fs/xfs fs/ocfs2 fs/nfs fs/nfsd fs/smb fs/cifs fs/gfs2 fs/f2fs fs/ceph fs/reiserfs fs/jfs fs/ntfs3 fs/ubifs fs/bcachefs; do
	rm -rf "${kmods:?}/$d"
done
chroot "$root" depmod "$kver"

put /etc/initramfs-tools/conf.d/lab.conf 0644 <<'EOF'
MODULES=list
COMPRESS=zstd
EOF
put /etc/initramfs-tools/modules 0644 <<'EOF'
virtio_pci
virtio_blk
virtio_scsi
nvme
ahci
sd_mod
crc32c_generic
ext4
EOF

put /etc/fstab 0644 <<'EOF'
LABEL=root / ext4 rw,errors=remount-ro 0 1
EOF
echo localhost | put /etc/hostname 0644
printf '127.0.0.1 localhost\n' | put /etc/hosts 0644
: | put /etc/machine-id 0444
rm -f "$root/var/lib/dbus/machine-id" "$root/etc/resolv.conf"

# What Debian's cloud images configure for cloud-init: the NoCloud datasource
# among the ones probed, the default user "debian".
put /etc/cloud/cloud.cfg.d/90-lab-datasources.cfg 0644 <<'EOF'
datasource_list: [ NoCloud, None ]
EOF

say "configuring systemd and the initramfs"
chroot "$root" /bin/sh -eu <<'EOF'
passwd -l root >/dev/null
systemctl enable systemd-networkd.service >/dev/null 2>&1
systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
rm -f /etc/ssh/ssh_host_*
update-initramfs -u -k all >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /var/log/*.log
EOF

# Debian's own layout is kept: /vmlinuz and /initrd.img symlinks to the
# versioned files in /boot (deploy follows them).
cleanup
mounted=''
say "root: $(du -sm "$root" | cut -f1) MiB"
touch "$out/done"
for old in "$cache"/root-*; do
	[ "$old" = "$out" ] || rm -rf "$old"
done
echo "$root"
