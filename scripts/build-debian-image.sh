#!/bin/sh
# Builds the root filesystem of the testbed's Debian flavour (testbed/debian.go
# makes the disk image from it): debootstrap --variant=minbase of bookworm with
# systemd, udev, Debian's kernel and initramfs-tools, networkd on DHCP, and the
# units an OS that deploy.image installed runs around bcd (the join oneshot, the
# proxy generator, the lab's report and install-script runners). bcd itself and
# its hardened unit are not in it: they change with every build of bcd, the root
# does not.
#
# Usage: scripts/build-debian-image.sh [CACHE]   (default .cache/debian)
#
# The root goes to CACHE/root-<key>/root, where key hashes this script (which
# holds every input: suite, packages, files). An existing root with its stamp is
# reused, so a second run does nothing; a changed script builds a new root and
# removes the old ones. Runs sharing a cache wait for each other (flock). Packages come from this host's own Debian mirror (its
# apt sources), cached in CACHE/debs for the next build. Prints the root's path.
set -eu

cd "$(dirname "$0")/.."
cache=${1:-.cache/debian}
say() { printf 'build-debian-image: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { say "run as root (debootstrap and chroot)"; exit 1; }

# One build at a time per cache: a second run waits, then finds the root built.
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

# The host's Debian mirror, from its deb822 or one-line sources; the archive's
# main host only when it names none.
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

packages=systemd,systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,zstd,kmod,e2fsprogs,iproute2,ca-certificates,curl,procps,less
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

# The kernel: only the modules a VM or a server board of the lab needs, so the
# image stays a few hundred MiB; the initramfs loads what finds the root disk.
kver=$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n1)
kmods=$root/lib/modules/$kver/kernel
before=$(du -sm "$kmods" | cut -f1)
for d in drivers/gpu drivers/media drivers/infiniband drivers/staging drivers/net/wireless drivers/net/ethernet \
	drivers/bluetooth drivers/iio drivers/isdn drivers/mtd drivers/input/touchscreen drivers/input/joystick \
	drivers/video drivers/usb/serial drivers/usb/gadget drivers/hid drivers/comedi drivers/nfc drivers/net/can \
	drivers/net/usb drivers/net/ieee802154 drivers/net/wwan drivers/scsi/qla2xxx drivers/scsi/lpfc drivers/scsi/mpt3sas \
	drivers/scsi/bfa drivers/scsi/be2iscsi drivers/scsi/megaraid drivers/target drivers/thunderbolt drivers/platform/x86 \
	sound net/wireless net/mac80211 net/bluetooth net/ceph net/sunrpc \
	fs/btrfs fs/xfs fs/ocfs2 fs/nfs fs/nfsd fs/smb fs/cifs fs/gfs2 fs/f2fs fs/ceph fs/reiserfs fs/jfs fs/ntfs3 fs/ubifs fs/bcachefs; do
	rm -rf "${kmods:?}/$d"
done
chroot "$root" depmod "$kver"
say "kernel $kver: modules $before MiB -> $(du -sm "$kmods" | cut -f1) MiB"

put /etc/initramfs-tools/conf.d/bcd-lab.conf 0644 <<'EOF'
# Only the listed modules (below): the root disk of a QEMU VM or a server.
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
echo bcd-debian | put /etc/hostname 0644
printf '127.0.0.1 localhost\n127.0.1.1 bcd-debian\n' | put /etc/hosts 0644
# Empty: every machine made from this image gets its own id on its first boot.
: | put /etc/machine-id 0444
rm -f "$root/var/lib/dbus/machine-id"

# Every ethernet link takes an address by DHCP; nothing else configures the network.
put /etc/systemd/network/80-bcd-lab-dhcp.network 0644 <<'EOF'
[Match]
Type=ether

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF

# The proxy: the machines' only way out is the site agent's HTTP proxy, which the
# kernel command line names (bcd.proxy=, as for the ramdisk). This generator hands
# it to the units that reach the control plane, before any of them starts.
put /usr/lib/systemd/system-generators/bcd-proxy-generator 0755 <<'EOF'
#!/bin/sh
# bcd.proxy=URL on the kernel command line becomes HTTPS_PROXY for bcd's units.
proxy=''
for w in $(cat /proc/cmdline); do
	case $w in bcd.proxy=*) proxy=${w#bcd.proxy=} ;; esac
done
[ -n "$proxy" ] || exit 0
case $proxy in *[!A-Za-z0-9:/._-]*) exit 0 ;; esac
for unit in bcd.service bcd-join.service bcd-lab-install.service; do
	mkdir -p "$1/$unit.d"
	printf '[Service]\nEnvironment=HTTPS_PROXY=%s https_proxy=%s\n' "$proxy" "$proxy" >"$1/$unit.d/50-bcd-proxy.conf"
done
EOF

# What an OS that deploy.image installed runs first: the join with the token and
# node id the deploy wrote (the join deletes the token), before bcd.service.
put /etc/systemd/system/bcd-join.service 0644 <<'EOF'
[Unit]
Description=better-compute: join this installed OS with the token its deploy wrote
ConditionPathExists=/etc/bcd/join-token
ConditionPathExists=/etc/bcd/node-id
After=network-online.target
Wants=network-online.target
Before=bcd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'exec /usr/local/bin/bcd join --token-file /etc/bcd/join-token --node-id "$(cat /etc/bcd/node-id)"'
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
EOF

# The lab's evidence, on the serial console: how bcd.service really runs.
put /usr/local/sbin/bcd-lab-report 0755 <<'EOF'
#!/bin/sh
# Prints, once bcd.service is active (or after two minutes), the unit's
# confinement as systemd applies it and as the kernel shows it for the process.
i=0
while [ "$(systemctl is-active bcd.service)" != active ] && [ $i -lt 240 ]; do sleep 0.5; i=$((i + 1)); done
props=$(systemctl show bcd.service -p NoNewPrivileges -p ProtectSystem -p ProtectHome -p PrivateTmp \
	-p CapabilityBoundingSet -p User -p RestrictNamespaces -p FragmentPath -p MainPID | tr '\n' ' ')
echo "bcd-lab: systemctl show bcd: $props"
pid=$(systemctl show bcd.service -p MainPID --value)
if [ -n "$pid" ] && [ "$pid" != 0 ]; then
	echo "bcd-lab: bcd process $pid: $(grep -E '^(NoNewPrivs|CapBnd|Uid):' /proc/"$pid"/status | tr '\t\n' '  ')exe $(readlink /proc/"$pid"/exe)"
fi
echo "bcd-lab: systemctl is-active bcd: $(systemctl is-active bcd.service)"
EOF
put /etc/systemd/system/bcd-lab-report.service 0644 <<'EOF'
[Unit]
Description=bcd lab: print how bcd.service runs on the serial console
ConditionPathExists=/etc/systemd/system/bcd.service
ConditionPathExists=/etc/bcd/config.toml
After=bcd.service bcd-join.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/bcd-lab-report
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
EOF

# The third machine of the lab: the test puts the generated install script and a
# join token on the disk; this runs the script as the spec says, the token on
# standard input, trusting the control plane's CA the way an operator's own
# machines would.
put /usr/local/sbin/bcd-lab-install 0755 <<'EOF'
#!/bin/sh
d=/etc/bcd-lab-install
if [ -f $d/ca.crt ]; then
	cp $d/ca.crt /usr/local/share/ca-certificates/better-compute-lab.crt
	update-ca-certificates >/dev/null 2>&1
fi
present() { if [ -e "$1" ]; then echo present; else echo absent; fi; }
echo "bcd-lab: install script starting (proxy ${HTTPS_PROXY:-none}, /dev/tpmrm0 $(present /dev/tpmrm0))"
# A token script reads the token the test left; a TPM script reads nothing.
in=/dev/null
[ -f $d/join-token ] && in=$d/join-token
sh $d/install-bcd.sh <$in >$d/install.log 2>&1
rc=$?
rm -f $d/join-token
sed 's/^/bcd-lab: install-bcd.sh: /' $d/install.log
echo "bcd-lab: install script exited $rc"
if [ $rc != 0 ]; then
	echo "bcd-lab: after the script: /usr/local/bin/bcd $(present /usr/local/bin/bcd), /etc/systemd/system/bcd.service $(present /etc/systemd/system/bcd.service), /etc/bcd/config.toml $(present /etc/bcd/config.toml)"
	exit $rc
fi
echo "bcd-lab: node.key: $(head -n1 /var/lib/bcd/node.key 2>/dev/null || echo absent)"
/usr/local/sbin/bcd-lab-report
# The upgrade run: the same script again on the joined machine, when the test asks.
if [ -f $d/rerun ]; then
	start=$(date +%s%N)
	sh $d/install-bcd.sh </dev/null >$d/rerun.log 2>&1
	rc=$?
	sed 's/^/bcd-lab: rerun: /' $d/rerun.log
	echo "bcd-lab: install script rerun exited $rc in $((($(date +%s%N) - start) / 1000000)) ms"
	i=0
	while [ "$(systemctl is-active bcd.service)" != active ] && [ $i -lt 120 ]; do sleep 0.5; i=$((i + 1)); done
	echo "bcd-lab: after the rerun: systemctl is-active bcd: $(systemctl is-active bcd.service)"
fi
exit $rc
EOF
put /etc/systemd/system/bcd-lab-install.service 0644 <<'EOF'
[Unit]
Description=bcd lab: run the install script the test put on this disk
ConditionPathExists=/etc/bcd-lab-install/install-bcd.sh
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/bcd-lab-install
StandardOutput=journal+console

[Install]
WantedBy=multi-user.target
EOF

mkdir -p "$root/etc/bcd" "$root/var/lib/bcd"
chmod 0700 "$root/etc/bcd" "$root/var/lib/bcd"

say "configuring systemd and the initramfs"
chroot "$root" /bin/sh -eu <<'EOF'
passwd -d root >/dev/null
systemctl enable systemd-networkd.service systemd-networkd-wait-online.service >/dev/null 2>&1
systemctl enable bcd-join.service bcd-lab-report.service bcd-lab-install.service >/dev/null 2>&1
systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
update-initramfs -u -k all >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /var/log/*.log
EOF

# deploy reads the kernel without mounting and follows no symlink: real files.
cp "$root/boot/vmlinuz-$kver" "$root/boot/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$root/boot/initrd.img"
rm -f "$root/vmlinuz" "$root/vmlinuz.old" "$root/initrd.img" "$root/initrd.img.old"

cleanup
mounted=''
say "root: $(du -sm "$root" | cut -f1) MiB, initrd $(du -k "$root/boot/initrd.img" | cut -f1) KiB"
touch "$out/done"
for old in "$cache"/root-*; do
	[ "$old" = "$out" ] || rm -rf "$old"
done
echo "$root"
