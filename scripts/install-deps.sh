#!/bin/sh
# Installs what `make demo` and `make test` need, idempotently: Debian packages that are
# missing (apt-get update only when something is missing) and the Go modules.
set -eu

# What the tests use, by area: TLS and pins; install scripts (shellcheck, dash, busybox,
# curl, systemd-analyze); boot servers' interop (tftp-hpa, curl, iproute2); the QEMU testbed (qemu, iPXE,
# OVMF, swtpm, ipmi_sim, ipmitool, dnsmasq for the site's own DHCP; syslinux and the
# systemd EFI stub make the test disks that both firmwares boot); the ramdisk and
# deploy (kmod, cpio, xz, zstd, e2fsprogs, mtools, dosfstools, gdisk, nvme-cli, hdparm,
# kexec-tools; lvm2 makes the stale volume group the deploy must remove); debootstrap for the Debian test OS flavour (make e2e-debian). BCD_DEPS
# adds more (bench/ adds nginx and dnsmasq's TFTP).
packages="ca-certificates openssl curl iproute2 shellcheck dash busybox-static systemd tftp-hpa
qemu-system-x86 qemu-utils ipxe-qemu ipxe ovmf swtpm swtpm-tools openipmi ipmitool dnsmasq-base
kmod cpio xz-utils zstd e2fsprogs mtools dosfstools gdisk parted nvme-cli hdparm kexec-tools socat
syslinux syslinux-common systemd-boot-efi binutils udev debootstrap lvm2 fdisk
${BCD_DEPS:-}"

missing=""
for p in $packages; do
	if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
		missing="$missing $p"
	fi
done
if [ -n "$missing" ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "install-deps: missing Debian packages:$missing (run as root to install them)" >&2
		exit 1
	fi
	echo "install-deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	# shellcheck disable=SC2086 # one word per package
	apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 $missing
fi

go mod download

# Debian's kernel, unpacked (not installed) for the testbed and the ramdisk.
scripts/fetch-kernel.sh .cache/kernel >/dev/null
