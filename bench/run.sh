#!/bin/sh
# bcd's boot servers against dnsmasq, tftp-hpa and nginx, side by side in one run
# (bench/cmd/bootbench; see bench/README.md). Run as root from anywhere; flags pass
# through, e.g. bench/run.sh -only tftp -runs 5. Writes bench/results/boot-<date>.txt.
set -eu

cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
	echo "bench/run.sh: needs root (network namespaces, ports 67-69 inside them)" >&2
	exit 1
fi

missing=""
command -v dnsmasq >/dev/null 2>&1 || missing="$missing dnsmasq-base"
command -v nginx >/dev/null 2>&1 || missing="$missing nginx-light"
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
if [ -n "$missing" ]; then
	echo "bench/run.sh: missing Debian packages:$missing" >&2
	echo "  (BCD_DEPS=\"$missing\" scripts/install-deps.sh installs them)" >&2
	exit 1
fi

# tftp-hpa's server, unpacked rather than installed: the package's postinst would
# start a tftpd service on the host's port 69.
if ! command -v in.tftpd >/dev/null 2>&1 && [ ! -x .cache/tftpd-hpa/usr/sbin/in.tftpd ]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	(cd "$tmp" && apt-get download tftpd-hpa >/dev/null)
	mkdir -p .cache/tftpd-hpa
	dpkg-deb -x "$tmp"/tftpd-hpa_*.deb .cache/tftpd-hpa
fi

export CGO_ENABLED=0
go build -o .cache/bootbench ./bench/cmd/bootbench
exec .cache/bootbench "$@"
