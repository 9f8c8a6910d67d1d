#!/usr/bin/env bash
# Static analysis of the root module, as `make lint` and scripts/test.sh (CI)
# run it: gofmt, go vet, staticcheck and govulncheck. Every check runs, and
# the script fails at the end if any failed. The tools are run at a pinned
# (staticcheck) or the latest (govulncheck, whose findings follow its
# database) version through the Go module proxy; they are not in go.mod.
#
# govulncheck needs its vulnerability database (https://vuln.go.dev, or
# GOVULNDB, e.g. file:///path/to/a/mirror). When the database cannot be
# reached the check is skipped with a warning, not failed: an offline network
# is not a finding. Vulnerabilities found, and any other govulncheck error,
# fail.
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
	db_args=()
	if [ -n "${GOVULNDB:-}" ]; then db_args=(-db "$GOVULNDB"); fi
	"$tools/govulncheck" "${db_args[@]}" ./... >"$tools/out" 2>&1
	rc=$?
	case $rc in
	0) cat "$tools/out" ;;
	3) cat "$tools/out"; fail "govulncheck (vulnerabilities above)" ;;
	*)
		# The database fetch is govulncheck's first network access; its
		# failure reads "fetching vulnerabilities: <network error>".
		if grep -Eq 'fetching vulnerabilities: .*(dial tcp|no such host|timeout|connection refused|unreachable|EOF|tls:)' "$tools/out"; then
			sed 's/^/lint: /' "$tools/out" >&2
			echo "govulncheck: vulnerability database unreachable, skipped" >&2
		else
			cat "$tools/out" >&2
			fail "govulncheck (exit $rc)"
		fi
		;;
	esac
fi

if [ ${#failed[@]} -gt 0 ]; then
	echo "lint: failed: ${failed[*]}" >&2
	exit 1
fi
echo "lint: ok" >&2
