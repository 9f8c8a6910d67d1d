# billing-consumer. `make demo` and `make test` are the two commands of the
# README; the rest are for development.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)

# Build with the toolchain go.mod names (a patch release with the standard
# library's security fixes), fetched through the Go module proxy when the
# machine's Go is older; the machine's go.env may say GOTOOLCHAIN=local.
export GOTOOLCHAIN := auto

.PHONY: demo build image test lint bench profile chaos failover fuzz pg-start pg-stop fmt vet clean monitoring-report monitor

demo: build ## the demo: local Kafka (in-process), local Postgres, simulated provider, ~10,000 events, a summary
	BILLING_DATABASE_URL="$${BILLING_DATABASE_URL:-$$(scripts/pg.sh start)}" go run ./cmd/billing-demo -consumer bin/billing-consumer

build: ## static binary in bin/
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o bin/billing-consumer ./cmd/billing-consumer

image: ## the runtime image with podman (FROM scratch, reproducible), its digest and SPDX SBOM in bin/image/
	VERSION='$(VERSION)' COMMIT='$(COMMIT)' scripts/image.sh build

test: ## every test, against a scratch Postgres this target starts
	scripts/test.sh

lint: ## gofmt, go vet, staticcheck and govulncheck
	scripts/lint.sh

# BENCH_BASELINE names a binary of the code before a change (e.g.
# bin/billing-consumer.base): make bench then drains it in pairs with the
# binary under test, alternated, and reports the median of the paired ratios.
# BENCH_FLAGS adds billing-bench flags (e.g. -scale 0.1 -only drain).
BENCH_BASELINE ?=
BENCH_FLAGS    ?=
BENCH_SERVICES  = BILLING_DATABASE_URL="$${BILLING_DATABASE_URL:-$$(scripts/pg.sh start)}" BENCH_BROKERS="$$(scripts/kafka.sh start)"

bench: build ## drain throughput and CPU, allocations and WAL per event, memory by partition count, latency and recovery of the real binary against real Kafka and Postgres (fsync on); writes docs/benchmarks.md and .json
	$(BENCH_SERVICES) go run ./cmd/billing-bench -consumer bin/billing-consumer -out docs/benchmarks.md -json docs/benchmarks.json \
		$(if $(BENCH_BASELINE),-baseline $(BENCH_BASELINE)) $(BENCH_FLAGS)

profile: build ## CPU and allocation profiles of the consumer draining a backlog at 0 ms (bin/profile/cpu.pprof, allocs.pprof), with their top
	$(BENCH_SERVICES) go run ./cmd/billing-bench -consumer bin/billing-consumer -profile bin/profile $(BENCH_FLAGS)
	go tool pprof -top -nodecount=25 bin/profile/cpu.pprof
	go tool pprof -top -nodecount=25 -sample_index=alloc_space bin/profile/allocs.pprof

chaos: build ## the long fault-injection profile: >=100 kills, >=1000 provider faults, broker and Postgres restarts
	BILLING_CHAOS_PROFILE=long go test -count=1 -run TestChaos -v -timeout 90m ./e2e

# TestFailover's two variants on a primary and a streaming standby of their
# own (scripts/pg.sh standby): the synchronous one and
# the asynchronous one, issue 30's acceptance test of the heal of lost
# commits (both also run in make test). FAILOVER_RUNS=5 repeats them.
FAILOVER_RUNS ?= 1
failover: ## a database failover under two replicas, onto a synchronous and an asynchronous standby (the heal re-decides what the latter lost)
	BILLING_TEST_KAFKA_BROKERS="$${BILLING_TEST_KAFKA_BROKERS:-$$(scripts/kafka.sh start)}" \
		go test -count=$(FAILOVER_RUNS) -run '^TestFailover$$' -v -timeout 60m ./e2e

# Each fuzz target's budget is a number of executions, about 10 s of
# fuzzing on this machine: a duration budget races Go's fuzz coordinator at
# its deadline and fails, now and then, with a bare "context deadline
# exceeded" and no crasher (go.dev/issue/75804, fixed only in Go 1.27).
# FUZZTIME (a count such as 5000000x, or a duration for a local run, e.g.
# 1m) overrides all of them.
FUZZ_DECODE  ?= 600000x
FUZZ_ORACLE  ?= 200000x
FUZZ_CHARGEID ?= 100000x
FUZZ_AMOUNT  ?= 1000000x
FUZZ_RECORD  ?= 100000x
FUZZ_CHARGE  ?= 100000x

fuzz: ## each fuzz target for its execution budget (about 10 s each), or FUZZTIME
	go test -run XXX -fuzz FuzzDecode -fuzztime $${FUZZTIME:-$(FUZZ_DECODE)} ./internal/events/
	go test -run XXX -fuzz FuzzParseAmount -fuzztime $${FUZZTIME:-$(FUZZ_AMOUNT)} ./internal/money/
	go test -run XXX -fuzz FuzzRecord -fuzztime $${FUZZTIME:-$(FUZZ_RECORD)} ./internal/dlq/
	go test -run XXX -fuzz FuzzChargeBody -fuzztime $${FUZZTIME:-$(FUZZ_CHARGE)} ./internal/payment/
	go test -run XXX -fuzz '^FuzzAgainstOldDecoder$$' -fuzztime $${FUZZTIME:-$(FUZZ_ORACLE)} ./internal/events/
	go test -run XXX -fuzz '^FuzzChargeID$$' -fuzztime $${FUZZTIME:-$(FUZZ_CHARGEID)} ./internal/payment/

pg-start: ## start the scratch Postgres and print its URL
	@scripts/pg.sh start

pg-stop:
	@scripts/pg.sh stop

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	go vet ./...

clean:
	rm -rf bin

# The live monitoring scenario of make test (deploy/monitoring, about 2 min):
# two replicas, real Kafka and Postgres, a real Prometheus 3 (built once by
# scripts/prometheus.sh) through a replica kill, a stall, a 5xx storm and
# Postgres down; writes docs/monitoring.md and its charts from that run.
monitoring-report: ## the live monitoring scenario; writes docs/monitoring.md and docs/monitoring/*.svg from its Prometheus
	@set -e; db="$${BILLING_TEST_DATABASE_URL:-$$(scripts/pg.sh start)}"; brokers="$${BILLING_TEST_KAFKA_BROKERS:-$$(scripts/kafka.sh start)}"; \
	prom="$$(scripts/prometheus.sh path)"; cd deploy && CI=true BILLING_TEST_DATABASE_URL="$$db" BILLING_TEST_KAFKA_BROKERS="$$brokers" \
	BILLING_TEST_PROMETHEUS="$$prom" BILLING_MONITORING_REPORT="$(CURDIR)/docs/monitoring.md" \
	go test -count=1 -run '^TestMonitoring$$' -v -timeout 15m ./monitoring

# PROMETHEUS names another prometheus binary for make monitor, e.g. one
# with its web UI (scripts/prometheus.sh builds the HTTP API only);
# MONITOR_FLAGS adds billing-monitor flags (e.g. -addr 127.0.0.1:9191 -every 2m).
PROMETHEUS    ?=
MONITOR_FLAGS ?=

monitor: build ## two replicas on the demo's services, a real Prometheus with the alert rules, orders and a fault every minute, until Ctrl-C
	@db="$${BILLING_DATABASE_URL:-$$(scripts/pg.sh start)}"; prom="$${PROMETHEUS:-$$(scripts/prometheus.sh path)}"; \
	cd deploy && go build -o ../bin/billing-monitor ./cmd/billing-monitor && \
	exec ../bin/billing-monitor -consumer ../bin/billing-consumer -prometheus "$$prom" -db "$$db" $(MONITOR_FLAGS)
