#!/usr/bin/env bash
# scripts/prometheus.sh — a real Prometheus 3.x server on loopback, for the
# live monitoring test (e2e TestMonitoring), make monitoring-report and make
# monitor.
#
# Prometheus is built from its Go module through the module proxy
# (go install github.com/prometheus/prometheus/cmd/prometheus@$PROM_VERSION;
# the module's tags are v0.<major*100+minor>.<patch>: v0.316.0 is 3.16.0).
# The build takes ~10 minutes on 2 cores, once per version: the binary is
# cached in $PROM_CACHE, as scripts/kube.sh caches kube-apiserver. The build
# has no web UI assets (they are built with npm): the HTTP API, which the
# tests and the URLs make monitor prints use, is complete without them.
#
# Usage: scripts/prometheus.sh <command>
#
#   build     build prometheus into $PROM_CACHE/bin (cached); prints its path
#   path      build if needed and print the binary's path (alone, on stdout)
#   cached    print the binary's path if it is built; exit 1 without building
#   version   print $PROM_VERSION
#
# The tests and tools start the server themselves (internal/monitoring) with
# a configuration of their own: this script only provides the binary.
#
# Environment (defaults):
#   PROM_VERSION   v0.316.0   (github.com/prometheus/prometheus module version)
#   PROM_CACHE     $HOME/.cache/billing-consumer/prometheus-$PROM_VERSION
set -euo pipefail

PROM_VERSION="${PROM_VERSION:-v0.316.0}"
PROM_CACHE="${PROM_CACHE:-${HOME:-/root}/.cache/billing-consumer/prometheus-$PROM_VERSION}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
PROM="$PROM_CACHE/bin/prometheus"

log() { echo "prometheus.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# build: go install into a temporary GOBIN, renamed into place when done, so
# a half-written cache is never taken for a built one. A flock keeps two
# concurrent runs from building into one cache.
build() {
	[[ -x "$PROM" ]] && return 0
	mkdir -p "$PROM_CACHE"
	exec 9>"$PROM_CACHE.lock"
	flock 9
	[[ -x "$PROM" ]] && return 0
	# The version Prometheus reports: module v0.316.0 is release 3.16.0.
	local minor="${PROM_VERSION#v0.}" release
	release="$((${minor%%.*} / 100)).$((${minor%%.*} % 100)).${minor#*.}"
	log "building prometheus $release ($PROM_VERSION) from the module proxy (one time, ~10 min on 2 cores)"
	rm -rf "$PROM_CACHE/bin.tmp"
	CGO_ENABLED=0 GOBIN="$PROM_CACHE/bin.tmp" GOFLAGS=-trimpath \
		go install -ldflags "-s -w -X github.com/prometheus/common/version.Version=$release" \
		"github.com/prometheus/prometheus/cmd/prometheus@$PROM_VERSION" || die "go install failed"
	rm -rf "$PROM_CACHE/bin" && mv "$PROM_CACHE/bin.tmp" "$PROM_CACHE/bin"
	log "built $("$PROM" --version 2>&1 | head -1)"
}

case "${1:-}" in
build) build ;;
path) build && echo "$PROM" ;;
cached) [[ -x "$PROM" ]] && echo "$PROM" ;;
version) echo "$PROM_VERSION" ;;
*) die "usage: $0 build|path|cached|version" ;;
esac
