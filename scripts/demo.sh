#!/bin/sh
# make demo, until the QEMU testbed exists: the most complete flow there is today.
# Creates a PKI bundle, prints its pins, writes a site agent's config.toml with them and
# checks it the way every bcd command reads it, then shows a bad file being refused.
set -eu
cd "$(dirname "$0")/.."
bin=$PWD/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/bcd-demo.XXXXXX")
trap 'rm -rf "$work"' EXIT

step() { printf '\n== %s\n' "$*"; }

step "bcd version"
"$bin/bcd" version

step "better-compute pki init $work/pki"
"$bin/better-compute" pki init "$work/pki"
ls -l "$work/pki"

step "better-compute pki pins $work/pki"
"$bin/better-compute" pki pins "$work/pki" | tee "$work/pins"

step "a site agent's config.toml, checked with bcd config check"
{
	echo 'gateway_url = "https://127.0.0.1:8443"'
	echo 'site = "demo"'
	cat "$work/pins"
	cat <<'TOML'

[boot]
listen = "10.20.0.2:8080"
url = "http://10.20.0.2:8080"
kernel = "http://10.20.0.2:8080/ramdisk/vmlinuz"
initrd = "http://10.20.0.2:8080/ramdisk/initrd"
cmdline = "console=ttyS0,115200"
server_ip = "10.20.0.2"
proxy_dhcp = true
tftp = ":69"
tftp_root = "/srv/bcd/ipxe"
TOML
} >"$work/config.toml"
chmod 600 "$work/config.toml"
cat "$work/config.toml"
"$bin/bcd" config check --config "$work/config.toml"

step "a config.toml with mistakes is refused, each with its line"
cat >"$work/bad.toml" <<'TOML'
gateway_url = "https://127.0.0.1:8443"
site = "demo"
retries = 3
[boot]
proxy_dhcp = true
listen = ["0.0.0.0:8080"]
TOML
cat -n "$work/bad.toml"
if "$bin/bcd" config check --config "$work/bad.toml"; then
	echo "demo: a bad config.toml was accepted" >&2
	exit 1
fi
echo "(exit status 1, as expected)"
