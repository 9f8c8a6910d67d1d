#!/usr/bin/env bash
# Static analysis of the root module, as `make lint` and scripts/test.sh (CI)
# run it: gofmt, go vet, staticcheck and govulncheck. Every check runs, and
# the script fails at the end if any failed. The tools are run at a pinned
# (staticcheck) or the latest (govulncheck, whose findings follow its
# database) version through the Go module proxy; they are not in go.mod.
#
# govulncheck needs its vulnerability database: GOVULNDB (e.g.
# file:///path/to/a/mirror), else https://vuln.go.dev, else one built by
# scripts/vulndb.sh from the golang.org/x/vulndb module that the Go module
# proxy serves. Vulnerabilities reachable from our code fail, and so does
# any other govulncheck error. The standard library's are judged for the
# toolchain go.mod names (GOTOOLCHAIN=auto, set by the Makefile and
# scripts/test.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

# staticcheck 2026.2.2, a release that supports Go 1.26.
STATICCHECK=${STATICCHECK:-honnef.co/go/tools/cmd/staticcheck@v0.8.2}
GOVULNCHECK=${GOVULNCHECK:-golang.org/x/vuln/cmd/govulncheck@latest}

failed=()
fail() { failed+=("$1"); echo "lint: $1 FAILED" >&2; }

echo "lint: gofmt" >&2
# Tracked and new (not ignored) files; deploy/ is a module of its own.
files=$({ git ls-files '*.go'; git ls-files --others --exclude-standard '*.go'; } | grep -v '^deploy/')
unformatted=$(gofmt -l $files)
if [ -n "$unformatted" ]; then
	echo "lint: not gofmt-ed (make fmt):" >&2
	echo "$unformatted" >&2
	fail gofmt
fi

echo "lint: go vet" >&2
go vet ./... || fail "go vet"

echo "lint: staticcheck ($STATICCHECK)" >&2
go run "$STATICCHECK" ./... || fail staticcheck

echo "lint: govulncheck ($GOVULNCHECK)" >&2
# Installed, not `go run`: go run turns every exit status into 1, and
# govulncheck's 3 (vulnerabilities found) must be told from its errors.
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
if ! GOBIN="$tools" go install "$GOVULNCHECK"; then
	fail "govulncheck (install)"
else
	db=${GOVULNDB:-}
	if [ -z "$db" ] && ! curl -fsS -m 5 -o /dev/null https://vuln.go.dev/index/db.json.gz 2>/dev/null; then
		# vuln.go.dev is out of reach (as on this project's build machines):
		# build the same database from its source, the golang.org/x/vulndb
		# module, which the Go module proxy serves; cached per version.
		db=$(scripts/vulndb.sh) || { fail "govulncheck (building the vulnerability database)"; db=""; }
	fi
	if [ -n "$db" ] || [ -z "${GOVULNDB:-}" ]; then
		db_args=()
		if [ -n "$db" ]; then db_args=(-db "$db"); fi
		"$tools/govulncheck" "${db_args[@]}" ./... >"$tools/out" 2>&1
		rc=$?
		case $rc in
		0) sed 's/^/lint: /' "$tools/out" >&2 ;;
		3) cat "$tools/out"; fail "govulncheck (vulnerabilities above)" ;;
		*) cat "$tools/out" >&2; fail "govulncheck (exit $rc)" ;;
		esac
	fi
fi

if [ ${#failed[@]} -gt 0 ]; then
	echo "lint: failed: ${failed[*]}" >&2
	exit 1
fi
echo "lint: ok" >&2
