#!/usr/bin/env bash
# scripts/image.sh — the runtime image, built with podman (no Docker engine,
# no registry): `make image` runs `scripts/image.sh build`.
#
# No base image can be pulled here, so the image is FROM scratch with a root
# filesystem assembled locally (scripts/image/Containerfile):
#   /billing-consumer                  static (CGO_ENABLED=0, -trimpath), version stamped
#   /etc/ssl/certs/ca-certificates.crt Mozilla's roots from Debian's ca-certificates
#                                      (the package's files, not the host's bundle,
#                                      so no locally added CA leaks in)
#   /etc/passwd, /etc/group            root, nobody and nonroot (65532), as distroless
#   /tmp                               empty (the Deployment mounts an emptyDir there)
# No shell, no package manager. Every file gets the commit's time and a fixed
# mode, and podman build --timestamp sets the layer and config times to it
# (SOURCE_DATE_EPOCH = the commit time), so two builds of one commit give one
# digest (`reproduce` proves it).
#
# Usage: scripts/image.sh <command>
#   build       build $IMAGE:$VERSION (and :latest), write $OUT/: digest,
#               image-id, an OCI archive and the SPDX SBOM (syft)
#   reproduce   build again from scratch (--no-cache, fresh binary) and fail
#               unless the digest equals build's
#   sbom        only (re)write the SBOM of the built image
#   podman ...  run podman with this project's containers.conf
#   env         print CONTAINERS_CONF=... (for eval) after setting podman up
#   dockerfile  build the repository's Dockerfile on local stand-ins of its
#               base images (scripts/image/standins.sh), tag ${IMAGE}-dockerfile
#   rootfs-base DIR  write the image's files but the binary into DIR
#
# Environment (defaults):
#   IMAGE       localhost/billing-consumer
#   VERSION     git describe --tags --always --dirty   (as the Makefile)
#   COMMIT      git rev-parse --short HEAD
#   OUT         bin/image
#   IMAGE_CACHE $HOME/.cache/billing-consumer   (containers.conf, syft)
#   SYFT_VERSION v1.57.1
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

IMAGE="${IMAGE:-localhost/billing-consumer}"
VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}"
COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
OUT="${OUT:-bin/image}"
IMAGE_CACHE="${IMAGE_CACHE:-${HOME:-/root}/.cache/billing-consumer}"
SYFT_VERSION="${SYFT_VERSION:-v1.57.1}"
SOURCE_URL="${SOURCE_URL:-https://github.com/billing-consumer/billing-consumer}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"

log() { echo "image.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# setup_podman installs podman and runc when missing and writes the
# containers.conf they need on these machines: runc (crun fails on the
# hybrid cgroup layout) and default ulimits within the hard limits (podman's
# defaults exceed them and every container fails to start).
setup_podman() {
	if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
		log "installing podman and runc (apt-get)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc >&2 ||
			{ apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc >&2; } ||
			die "cannot install podman and runc"
	fi
	mkdir -p "$IMAGE_CACHE"
	CONTAINERS_CONF="$IMAGE_CACHE/containers.conf"
	cat >"$CONTAINERS_CONF.tmp" <<-'EOF'
		# Written by scripts/image.sh.
		[containers]
		default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
		[engine]
		runtime = "runc"
	EOF
	mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
	export CONTAINERS_CONF
}

pm() { podman "$@"; }

source_date_epoch() {
	git log -1 --format=%ct 2>/dev/null || echo 0
}

# rootfs DIR SDE: the image's files, every one with the time SDE and a
# fixed mode (the umask and the checkout time must not reach the digest).
rootfs() {
	local dir=$1 sde=$2
	rm -rf "$dir" && mkdir -p "$dir"
	CGO_ENABLED=0 go build -trimpath -buildvcs=false \
		-ldflags "-s -w -X main.version=$VERSION -X main.commit=$COMMIT" \
		-o "$dir/billing-consumer" ./cmd/billing-consumer
	rootfs_base "$dir" "$sde"
}

# rootfs_base DIR SDE: everything but the binary (what distroless/static
# provides); the Dockerfile's stand-in runtime base is made of it too.
rootfs_base() {
	local dir=$1 sde=$2
	mkdir -p "$dir/etc/ssl/certs" "$dir/tmp"
	local certs=(/usr/share/ca-certificates/mozilla/*.crt)
	[[ -f "${certs[0]}" ]] || die "Debian's ca-certificates is not installed (apt-get install ca-certificates)"
	printf '%s\n' "${certs[@]}" | LC_ALL=C sort | xargs cat >"$dir/etc/ssl/certs/ca-certificates.crt"
	cat >"$dir/etc/passwd" <<-'EOF'
		root:x:0:0:root:/root:/sbin/nologin
		nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
		nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
	EOF
	cat >"$dir/etc/group" <<-'EOF'
		root:x:0:
		nobody:x:65534:
		nonroot:x:65532:
	EOF
	find "$dir" -type d -exec chmod 0755 {} +
	find "$dir" -type f -exec chmod 0644 {} +
	[[ ! -f "$dir/billing-consumer" ]] || chmod 0755 "$dir/billing-consumer"
	chmod 1777 "$dir/tmp"
	find "$dir" -exec touch -h -d "@$sde" {} +
}

# build_image TAG [podman build flags]: the image from a fresh rootfs; prints
# nothing, leaves the digest to `digest TAG`.
build_image() {
	local tag=$1
	shift
	local sde ctx
	sde=$(source_date_epoch)
	ctx=$(mktemp -d "${TMPDIR:-/tmp}/billing-image.XXXXXX")
	rootfs "$ctx/rootfs" "$sde"
	cp scripts/image/Containerfile "$ctx/Containerfile"
	local rc=0
	pm build --quiet --pull=never --network=none --identity-label=false \
		--timestamp "$sde" \
		--label "org.opencontainers.image.title=billing-consumer" \
		--label "org.opencontainers.image.version=$VERSION" \
		--label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo "$COMMIT")" \
		--label "org.opencontainers.image.source=$SOURCE_URL" \
		--label "org.opencontainers.image.created=$(date -u -d "@$sde" +%Y-%m-%dT%H:%M:%SZ)" \
		--label "org.opencontainers.image.licenses=NOASSERTION" \
		-t "$tag" "$@" "$ctx" >/dev/null || rc=$?
	rm -rf "$ctx"
	return $rc
}

# digest TAG: the manifest digest of a local image (what a registry would
# address it by), and the image id (the config's digest).
digest() { pm image inspect --format '{{.Digest}}' "$1"; }
image_id() { pm image inspect --format '{{.Id}}' "$1"; }

# syft, the SBOM generator the container ecosystem uses (Anchore; reads the
# Go build info embedded in the binary and the files of the image), built
# once per version through the Go module proxy and cached.
syft_bin() {
	local dir="$IMAGE_CACHE/syft-$SYFT_VERSION"
	if [[ ! -x "$dir/bin/syft" ]]; then
		log "building syft $SYFT_VERSION (one time, a few minutes)"
		mkdir -p "$dir"
		rm -rf "$dir/bin.tmp"
		CGO_ENABLED=0 GOBIN="$dir/bin.tmp" go install -trimpath \
			-ldflags "-s -w -X main.version=${SYFT_VERSION#v}" \
			"github.com/anchore/syft/cmd/syft@$SYFT_VERSION" >&2 || die "cannot build syft"
		rm -rf "$dir/bin" && mv "$dir/bin.tmp" "$dir/bin"
	fi
	echo "$dir/bin/syft"
}

sbom() {
	local syft
	syft=$(syft_bin)
	rm -f "$OUT/billing-consumer.oci.tar"
	pm save --quiet --format oci-archive -o "$OUT/billing-consumer.oci.tar" "$IMAGE:$VERSION"
	SYFT_CHECK_FOR_APP_UPDATE=false "$syft" scan --quiet "oci-archive:$OUT/billing-consumer.oci.tar" \
		--source-name billing-consumer --source-version "$VERSION" \
		-o "spdx-json=$OUT/billing-consumer.spdx.json"
	log "SBOM: $OUT/billing-consumer.spdx.json ($(grep -o '"SPDXID"' "$OUT/billing-consumer.spdx.json" | wc -l) SPDX elements)"
}

cmd_build() {
	mkdir -p "$OUT"
	build_image "$IMAGE:$VERSION"
	pm tag "$IMAGE:$VERSION" "$IMAGE:latest"
	digest "$IMAGE:$VERSION" >"$OUT/digest"
	image_id "$IMAGE:$VERSION" >"$OUT/image-id"
	echo "$IMAGE:$VERSION" >"$OUT/ref"
	sbom
	log "built $IMAGE:$VERSION $(cat "$OUT/digest") ($(pm image inspect --format '{{.Size}}' "$IMAGE:$VERSION") bytes)"
}

cmd_reproduce() {
	[[ -f "$OUT/digest" ]] || die "no $OUT/digest: run scripts/image.sh build first"
	local again="$IMAGE:reproduce-check" want got
	want=$(cat "$OUT/digest")
	build_image "$again" --no-cache
	got=$(digest "$again")
	pm rmi --force "$again" >/dev/null
	log "first build $want, second build $got"
	[[ "$got" == "$want" ]] || die "not reproducible: two builds of $COMMIT gave $want and $got"
	echo "$got"
}

# cmd_dockerfile: the repository's Dockerfile, built as a user with registry
# access would, on local stand-ins of its base images (--pull=never, no
# network); e2e's TestImage runs the result like make image's.
cmd_dockerfile() {
	mkdir -p "$OUT"
	scripts/image/standins.sh
	local tag="${IMAGE}-dockerfile:$VERSION"
	pm build --quiet --pull=never --network=none -f Dockerfile \
		--build-arg "VERSION=$VERSION" --build-arg "COMMIT=$COMMIT" \
		--build-arg "TARGETOS=$(go env GOOS)" --build-arg "TARGETARCH=$(go env GOARCH)" -t "$tag" . >/dev/null
	echo "$tag" >"$OUT/dockerfile-ref"
	log "built the Dockerfile as $tag ($(pm image inspect --format '{{.Size}}' "$tag") bytes)"
}

setup_podman
case "${1:-}" in
build) cmd_build ;;
reproduce) cmd_reproduce ;;
sbom) mkdir -p "$OUT" && sbom ;;
podman) shift && pm "$@" ;;
env) echo "CONTAINERS_CONF=$CONTAINERS_CONF" ;;
dockerfile) cmd_dockerfile ;;
rootfs-base) rootfs_base "${2:?rootfs-base DIR}" "$(source_date_epoch)" ;;
*) die "usage: scripts/image.sh build|reproduce|sbom|dockerfile|podman|env|rootfs-base DIR" ;;
esac
