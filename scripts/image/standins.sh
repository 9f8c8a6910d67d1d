#!/usr/bin/env bash
# scripts/image/standins.sh — local stand-ins for the Dockerfile's base
# images, tagged with the names its FROM lines use, so that podman builds the
# Dockerfile here (where no registry serves images) without pulling:
#   golang:1.26-bookworm                      busybox (Debian's busybox-static) as
#       /bin/sh, the Go toolchain go.mod names in /usr/local/go, and a file
#       GOPROXY holding exactly the modules go.mod needs (from the local module
#       cache), so `go mod download` runs with --network=none
#   gcr.io/distroless/static-debian12:nonroot the root filesystem of make image
#       without the binary (CA certificates, passwd/group with 65532, /tmp)
# They stand in for the build, not for the real images: what a registry
# serves under those names is what users with registry access get.
# Called by scripts/image.sh (dockerfile), with CONTAINERS_CONF set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
: "${CONTAINERS_CONF:?run through scripts/image.sh}"
GOLANG=$(sed -n 's/^FROM .*\(golang:[^ ]*\) AS build$/\1/p' Dockerfile)
RUNTIME=$(sed -n 's/^FROM \([^ ]*distroless[^ ]*\)$/\1/p' Dockerfile)
[[ -n "$GOLANG" && -n "$RUNTIME" ]] || { echo "standins.sh: cannot read the FROM lines of Dockerfile" >&2; exit 1; }

if [[ ! -x /bin/busybox ]]; then
	echo "standins.sh: installing busybox-static (apt-get)" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >&2 ||
		{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >&2; }
fi

ctx=$(mktemp -d "${TMPDIR:-/tmp}/billing-standins.XXXXXX")
trap 'rm -rf "$ctx"' EXIT

# The build image.
mkdir -p "$ctx/golang/bin" "$ctx/golang/tmp" "$ctx/golang/goproxy"
cp /bin/busybox "$ctx/golang/bin/busybox"
for applet in sh mkdir cp rm ls cat env; do ln -s busybox "$ctx/golang/bin/$applet"; done
goroot=$(go env GOROOT)
mkdir -p "$ctx/golang/usr/local"
cp -a "$goroot" "$ctx/golang/usr/local/go"
chmod -R u+w "$ctx/golang/usr/local/go" # the module cache's copy is read-only
rm -rf "$ctx/golang/usr/local/go/test"
# Every module of the build graph, as the module cache stores them (its
# cache/download tree is a GOPROXY layout).
dl="$(go env GOMODCACHE)/cache/download"
go mod download
escape() { sed 's/[A-Z]/!\L&/g' <<<"$1"; }
go mod graph | tr ' ' '\n' | grep @ | sort -u | while IFS=@ read -r path version; do
	e=$(escape "$path")
	mkdir -p "$ctx/golang/goproxy/$e/@v"
	for f in "$dl/$e/@v/$version".{info,mod,zip}; do
		[[ -f "$f" ]] && cp "$f" "$ctx/golang/goproxy/$e/@v/"
	done
	true
done
cat >"$ctx/golang.Containerfile" <<-'CF'
	FROM scratch
	COPY . /
	ENV PATH=/usr/local/go/bin:/go/bin:/bin GOPATH=/go HOME=/root GOTOOLCHAIN=local \
	    GOPROXY=file:///goproxy GOSUMDB=off GOFLAGS=-buildvcs=false
	WORKDIR /go
CF
podman build --quiet --pull=never --network=none -t "$GOLANG" -f "$ctx/golang.Containerfile" "$ctx/golang" >/dev/null

# The runtime base: make image's root filesystem without the binary.
scripts/image.sh rootfs-base "$ctx/runtime"
printf 'FROM scratch\nCOPY . /\nUSER 65532:65532\n' >"$ctx/runtime.Containerfile"
podman build --quiet --pull=never --network=none -t "$RUNTIME" -f "$ctx/runtime.Containerfile" "$ctx/runtime" >/dev/null
echo "standins.sh: tagged $GOLANG and $RUNTIME" >&2
