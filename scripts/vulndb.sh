#!/usr/bin/env bash
# Builds the Go vulnerability database (the format govulncheck reads) from
# its source, the golang.org/x/vulndb module, fetched through the Go module
# proxy, and prints a file:// URL for `govulncheck -db`. For machines that
# reach the module proxy but not vuln.go.dev. Cached per vulndb version in
# ${VULNDB_CACHE:-$HOME/.cache/billing-consumer/vulndb}; VULNDB_VERSION
# (default latest) pins one.
set -euo pipefail
version=${VULNDB_VERSION:-latest}
cache=${VULNDB_CACHE:-$HOME/.cache/billing-consumer/vulndb}
info=$(cd /tmp && go mod download -json "golang.org/x/vulndb@$version")
dir=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
resolved=$(printf '%s' "$info" | sed -n 's/^[[:space:]]*"Version": "\(.*\)",$/\1/p')
[ -n "$dir" ] && [ -n "$resolved" ] || { echo "vulndb.sh: could not download golang.org/x/vulndb@$version" >&2; exit 1; }
out=$cache/$resolved
if [ ! -f "$out/index/db.json" ]; then
	echo "vulndb.sh: building the vulnerability database from golang.org/x/vulndb@$resolved" >&2
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache/build.XXXXXX")
	(cd "$dir" && GOFLAGS=-mod=mod go run ./cmd/indexdb -vulns data/osv -out "$tmp") >&2
	rm -rf "$out"
	mv "$tmp" "$out"
fi
echo "file://$out"
