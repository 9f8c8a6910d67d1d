#!/usr/bin/env bash
# The whole test suite, as `make test` and CI run it. It starts the services
# the tests need — a scratch Postgres (scripts/pg.sh) and a real Apache Kafka
# broker in KRaft mode (scripts/kafka.sh, jars from Maven Central, cached) —
# then lints (scripts/lint.sh) and tests every package with the race
# detector. e2e's TestKafkaSecurity starts a second, secured broker of its
# own (scripts/kafka-secure.sh: SASL_SSL, SSL with client certificates) on
# free ports, and e2e's TestFailover a Postgres primary and streaming
# standby of its own (scripts/pg.sh standby), synchronous and asynchronous
# (the heal of lost commits). Nothing is skipped: with CI set, a test that cannot reach its
# service fails, and a broker that does not start fails the run.
#
# KAFKA=kfake runs the Kafka suites against franz-go's in-process kfake
# instead, for fast local iterations (never in CI).
set -euo pipefail
cd "$(dirname "$0")/.."

export CI=${CI:-true}
# The toolchain go.mod names (see the Makefile), also for the binaries the
# end-to-end tests build.
export GOTOOLCHAIN=auto
BILLING_TEST_DATABASE_URL=$(scripts/pg.sh start)
export BILLING_TEST_DATABASE_URL

if [ "${KAFKA:-real}" = kfake ]; then
	[ "$CI" = true ] && [ -n "${GITHUB_ACTIONS:-}${CI_RUN:-}" ] && { echo "KAFKA=kfake is not allowed in CI" >&2; exit 1; }
	unset BILLING_TEST_KAFKA_BROKERS
	export CI= # kafkatest falls back to kfake only outside CI
	echo "test.sh: Kafka suites run against in-process kfake" >&2
else
	BILLING_TEST_KAFKA_BROKERS=$(scripts/kafka.sh start)
	export BILLING_TEST_KAFKA_BROKERS
	echo "test.sh: Kafka suites run against Apache Kafka $(scripts/kafka.sh version) at $BILLING_TEST_KAFKA_BROKERS" >&2
	trap 'scripts/kafka.sh stop >/dev/null 2>&1 || true' EXIT
fi

# go vet, staticcheck and govulncheck (scripts/lint.sh, also make lint)
scripts/lint.sh
# The runtime image (make image: podman, FROM scratch), built a second time
# from scratch to prove one commit gives one digest, and the Dockerfile's
# image on locally made stand-ins of its base images; e2e's TestImage runs
# both.
scripts/image.sh build
scripts/image.sh reproduce >/dev/null
export "$(scripts/image.sh env)"
BILLING_TEST_IMAGE=$(cat bin/image/ref)
export BILLING_TEST_IMAGE
scripts/image.sh dockerfile
BILLING_TEST_DOCKERFILE_IMAGE=$(cat bin/image/dockerfile-ref)
export BILLING_TEST_DOCKERFILE_IMAGE
go test -race -count=1 -timeout 30m "$@" ./...
# promtool for deploy/'s alert-rule tests (installed when missing; with CI
# set, TestPromtool fails rather than skips without it).
echo "test.sh: $(scripts/promtool.sh)" >&2
# A real kube-apiserver and etcd (scripts/kube.sh: built once per version
# and cached) for deploy/'s server-side dry runs.
BILLING_TEST_KUBECONFIG=$(scripts/kube.sh start)
BILLING_TEST_KUBECTL=$(scripts/kube.sh env | sed -n 's/^KUBECTL=//p')
export BILLING_TEST_KUBECONFIG BILLING_TEST_KUBECTL
prev_trap=$(trap -p EXIT | sed "s/^trap -- '\(.*\)' EXIT$/\1/")
trap "scripts/kube.sh stop >/dev/null 2>&1 || true; ${prev_trap:-:}" EXIT
# Prometheus 3 (scripts/prometheus.sh: built once per version and cached)
# for deploy/monitoring's live test, TestMonitoring (about 2 minutes).
BILLING_TEST_PROMETHEUS=$(scripts/prometheus.sh path)
export BILLING_TEST_PROMETHEUS
# deploy/ is a module of its own (Kubernetes and Prometheus dependencies
# stay out of the service): manifests, overlays, PromQL, Dockerfile, and
# kubectl apply --dry-run=server against that API server.
(cd deploy && go vet ./... && go test -count=1 ./...)
# Hostile input: each fuzz target runs a bounded number of executions on top of its
# seed corpus (which plain go test already ran).
make fuzz
