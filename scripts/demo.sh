#!/bin/sh
# make demo, until the QEMU testbed drives machines: the most complete flow there is.
# On loopback only: create a PKI bundle, start the control plane, create a site and a
# join token, join a "machine" (a directory standing in for its /etc/bcd and
# /var/lib/bcd) from the well-known document and three pins, run bcd node and watch
# it become ready, then generate the install script an operator would ship.
set -eu
cd "$(dirname "$0")/.."
bin=$PWD/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/bcd-demo.XXXXXX")
serve_pid=""
node_pid=""
cleanup() {
	[ -z "$node_pid" ] || kill "$node_pid" 2>/dev/null || true
	[ -z "$serve_pid" ] || kill "$serve_pid" 2>/dev/null || true
	wait 2>/dev/null || true
	if [ "${KEEP:-}" = 1 ]; then echo "KEEP=1: left $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT INT TERM

step() { printf '\n== %s\n' "$*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo "$1"; }

step "better-compute pki init"
"$bin/better-compute" pki init "$work/pki"

api=127.0.0.1:$(free_port 18443)
gw=127.0.0.1:$(free_port 18444)
step "better-compute serve (api https://$api, gateway https://$gw)"
"$bin/better-compute" serve --pki "$work/pki" --data "$work/cp" --listen "$api" --gateway-listen "$gw" \
	--operator-token-file "$work/operator-token" >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do
	[ "$(grep -c 'listening on' "$work/serve.log" 2>/dev/null)" -ge 2 ] && break
	sleep 0.1
done
cat "$work/serve.log"

export BETTER_COMPUTE_SERVER="https://$api" BETTER_COMPUTE_PKI="$work/pki"
bc() { "$bin/better-compute" "$@" --token-file "$work/operator-token"; }

step "better-compute sites create fsn1; tokens create --role node"
bc sites create fsn1
token=$(bc tokens create --pool pool_demo --site fsn1 --role node 2>/dev/null)
echo "token: bcjt_… (printed once, kept out of argv)"

step "bcd join --server … with the three pins (the machine has no config.toml yet)"
pins=$("$bin/better-compute" pki pins "$work/pki")
pin() { echo "$pins" | sed -n "s/^$1 = \"\(.*\)\"$/\1/p"; }
mkdir -p "$work/host/etc"
BCD_JOIN_TOKEN=$token SSL_CERT_FILE="$work/pki/serving-ca.crt" "$bin/bcd" join \
	--config "$work/host/etc/config.toml" --data-dir "$work/host/data" --server "https://$api" \
	--serving-ca-pin "$(pin serving_ca_spki_pin)" --join-signing-pin "$(pin join_signing_key_pin)" \
	--join-encryption-pin "$(pin join_encryption_key_pin)"
# The status socket's default is /run/bcd/bcd.sock: keep this demo's beside it.
printf 'socket_path = "%s"\n' "$work/host/bcd.sock" >>"$work/host/etc/config.toml"
cat "$work/host/etc/config.toml"
"$bin/bcd" config check --config "$work/host/etc/config.toml"

step "bcd node: the session to the gateway"
"$bin/bcd" node --config "$work/host/etc/config.toml" >"$work/node.log" 2>&1 &
node_pid=$!
for _ in $(seq 1 100); do
	bc nodes list 2>/dev/null | grep -q ready && break
	sleep 0.2
done
bc nodes list
"$bin/bcd" doctor --config "$work/host/etc/config.toml" || true

step "better-compute daemon install-script (what an operator ships to other machines)"
"$bin/better-compute" daemon install-script --pki "$work/pki" --pool pool_demo --site fsn1 \
	--gateway-url "https://$gw" --base-url "https://$api" --bcd-version 0.1.0 \
	--sha256 "amd64=$(sha256sum "$bin/bcd" | cut -d' ' -f1)" >"$work/install-bcd.sh"
sed -n '1,20p' "$work/install-bcd.sh"
echo "… ($(wc -l <"$work/install-bcd.sh") lines in $work/install-bcd.sh)"
