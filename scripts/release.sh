#!/bin/sh
# Builds a release snapshot into dist/ (`make release`): bcd and better-compute
# for linux/amd64 and linux/arm64, static (CGO_ENABLED=0), -trimpath, with the
# version linked in. It writes what goreleaser's configuration
# (.goreleaser.yaml) describes, under the same names:
#
#   bcd_<v>_linux_<arch>                     the bare binary: what the install
#                                            script downloads, the signed
#                                            manifest lists and self-update takes
#   bcd_<v>_linux_<arch>.tar.gz              bcd in an archive
#   better-compute_<v>_linux_<arch>.tar.gz   the operator CLI and control plane
#   bcx-ipmi_<v>_linux_<arch>.tar.gz         the IPMI plugin, only an archive,
#                                            when ./plugins/bcx-ipmi exists
#   <each of the above>.sha256               "<sha256>  <name>"
#   checksums.txt                            all of them, as sha256sum -c reads
#
# Then, when BCD_RELEASE_KEYS names signing keys (space-separated paths) and
# BCD_RELEASE_SEQUENCE is set, it signs dist/manifest.json with them
# (better-compute release sign; BCD_RELEASE_EXPIRES, default 90d).
#
# Environment: VERSION (default 0.1.0-dev; a leading v is dropped from file
# names, as goreleaser does), DIST (default dist), GO (default go).
# For the lab's many test releases (testbed's TestDebianSelfUpdate), which
# need only bcd for one platform:
#   ARCHES     the platforms (default "amd64 arm64")
#   PRODUCTS   what to build (default "bcd better-compute bcx-ipmi"; bcd is
#              always built, and bcx-ipmi only when ./plugins/bcx-ipmi exists)
#   SIGNER     a better-compute binary to sign with, instead of building one
#   GOFLAGS    as go build reads it, e.g. -tags=labfault_crash for a lab build
# It reaches no network beyond the Go module proxy, through go build.
set -eu

cd "$(dirname "$0")/.."

GO=${GO:-go}
VERSION=${VERSION:-0.1.0-dev}
DIST=${DIST:-dist}
PKG=github.com/better-compute/bcd
ARCHES=${ARCHES:-amd64 arm64}
PRODUCTS=${PRODUCTS:-bcd better-compute bcx-ipmi}

v=${VERSION#v}
case $v in
'' | *[!0-9A-Za-z.+-]*) echo "release: VERSION $VERSION is not a version" >&2; exit 2 ;;
esac
for arch in $ARCHES; do
	case $arch in
	amd64 | arm64) ;;
	*) echo "release: ARCHES names $arch: only amd64 and arm64" >&2; exit 2 ;;
	esac
done
wants() { case " $PRODUCTS " in *" $1 "*) return 0 ;; esac; return 1; }

case $DIST in
'' | / | . | ..) echo "release: refusing DIST=$DIST" >&2; exit 2 ;;
esac

# Archives are reproducible: fixed owner, order and time, no gzip timestamp.
mtime=$(git log -1 --format=%cI 2>/dev/null || echo 2020-01-01T00:00:00Z)

export CGO_ENABLED=0
ldflags="-s -w -X $PKG/internal/version.Version=$VERSION"

rm -rf "$DIST"
mkdir -p "$DIST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build() { # OUT PACKAGE ARCH
	echo "release: go build $2 for linux/$3"
	GOOS=linux GOARCH=$3 "$GO" build -trimpath -ldflags "$ldflags" -o "$1" "$2"
}

archive() { # NAME DIR: DIR's files, at the archive's top level, into NAME.tar.gz
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$mtime" \
		-C "$2" -cf - . | gzip -n -9 >"$DIST/$1.tar.gz"
}

for arch in $ARCHES; do
	d=$work/bcd-$arch
	mkdir -p "$d"
	build "$d/bcd" ./cmd/bcd "$arch"
	cp "$d/bcd" "$DIST/bcd_${v}_linux_$arch"
	chmod 0755 "$DIST/bcd_${v}_linux_$arch"
	archive "bcd_${v}_linux_$arch" "$d"

	if wants better-compute; then
		d=$work/better-compute-$arch
		mkdir -p "$d"
		build "$d/better-compute" ./cmd/better-compute "$arch"
		archive "better-compute_${v}_linux_$arch" "$d"
	fi

	# The plugin ships only as an archive, so a release keeps exactly one
	# bare binary per platform, bcd's.
	if wants bcx-ipmi && [ -d plugins/bcx-ipmi ]; then
		d=$work/bcx-ipmi-$arch
		mkdir -p "$d"
		build "$d/bcx-ipmi" ./plugins/bcx-ipmi "$arch"
		archive "bcx-ipmi_${v}_linux_$arch" "$d"
	fi
done

(
	cd "$DIST"
	for f in *; do
		sha256sum "$f" >"$f.sha256"
	done
	bare=''
	for arch in $ARCHES; do
		bare="$bare bcd_${v}_linux_$arch"
	done
	# shellcheck disable=SC2086 # one word per binary
	sha256sum -- *.tar.gz $bare | sort -k 2 >checksums.txt
)

if [ -n "${BCD_RELEASE_KEYS:-}" ]; then
	: "${BCD_RELEASE_SEQUENCE:?set BCD_RELEASE_SEQUENCE to sign a release}"
	signer=${SIGNER:-}
	if [ -z "$signer" ]; then
		signer=$work/better-compute
		"$GO" build -trimpath -ldflags "$ldflags" -o "$signer" ./cmd/better-compute
	fi
	set -- --product bcd --version "$v" --sequence "$BCD_RELEASE_SEQUENCE" --expires "${BCD_RELEASE_EXPIRES:-90d}"
	for k in $BCD_RELEASE_KEYS; do
		set -- "$@" --key "$k"
	done
	"$signer" release sign "$@" "$DIST"
fi

echo "release: $VERSION in $DIST/:"
ls -l "$DIST"
