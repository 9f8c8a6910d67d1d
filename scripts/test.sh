#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it: starts the services the
# tests need (a scratch Postgres, see scripts/pg.sh), then vets and tests
# every package with the race detector. Nothing is skipped: under this
# script a test that cannot reach its service fails.
set -euo pipefail
cd "$(dirname "$0")/.."

export CI=${CI:-true} # pgtest fails rather than skips when Postgres is missing
BILLING_TEST_DATABASE_URL=$(scripts/pg.sh start)
export BILLING_TEST_DATABASE_URL

go vet ./...
go test -race -count=1 -timeout 20m "$@" ./...
