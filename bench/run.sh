#!/bin/sh
# bcd's boot servers against dnsmasq, tftp-hpa and nginx, side by side in one run
# (bench/cmd/bootbench; see bench/README.md). The headline is the shipped binary:
# bcd and better-compute are built from this tree, and bootbench runs
# `better-compute serve`, joins `bcd site` to it and registers the machines; the
# library-level table (bcd's boot servers inside bootbench) comes second. Run as
# root from anywhere; flags pass through, e.g. bench/run.sh -only tftp -runs 5.
# Writes bench/results/boot-<date>.txt.
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
command -v nsenter >/dev/null 2>&1 || missing="$missing util-linux"
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

# The binaries as `make build` makes them (static, trimmed paths).
export CGO_ENABLED=0
mkdir -p .cache/bench
go build -trimpath -o .cache/bench/bcd ./cmd/bcd
go build -trimpath -o .cache/bench/better-compute ./cmd/better-compute
go build -o .cache/bench/bootbench ./bench/cmd/bootbench
exec .cache/bench/bootbench -bcd .cache/bench/bcd -better-compute .cache/bench/better-compute "$@"
