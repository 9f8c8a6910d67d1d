package main

import (
	"errors"
	"flag"
	"os"
	"slices"
	"strings"
	"time"
)

// options are the command-line settings.
type options struct {
	bin, out, chart, readme, logPath, pgbench, kafkaScript string
	brokers                                                []string
	dbURL                                                  string
	timebox, steadyFor, poll                               time.Duration
	steadyCap                                              float64
	scale                                                  float64
	repeat                                                 int
	skipPgbench                                            bool
	only                                                   string
	// baseline is the binary of the code before the change: its default
	// mode is measured too, interleaved with the binary under test.
	baseline string
	// jsonPath receives the results as JSON; the previous file there is
	// read first and shown as the previous run.
	jsonPath string
	// profileDir, when set, makes the run a profile (make profile): one
	// backlog of profileBacklog records, a CPU profile of profileSeconds.
	profileDir                               string
	profileSeconds, profileBacklog           int
	skipSweep, skipRecovery                  bool
	skipClients, skipFailing, skipPartitions bool
	recoveryRate                             float64 // offered load of the recovery scenario, events/s
}

// selected reports whether -only (empty: everything) names part, a
// mode:latency pair such as default:20ms, "sweep", "recovery" or
// "failing".
func (o options) selected(part string) bool {
	return o.only == "" || slices.Contains(strings.Split(o.only, ","), part)
}

// parseOptions reads the flags and the environment of a run.
func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("billing-bench", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.bin, "consumer", "bin/billing-consumer", "path of the billing-consumer binary")
	fs.StringVar(&o.out, "out", "", "write the Markdown report here (empty: none)")
	fs.StringVar(&o.chart, "chart", "", "write the SVG chart here (empty: none)")
	fs.StringVar(&o.readme, "readme", "", "rewrite the performance summary between the billing-bench markers of this file (empty: none)")
	fs.StringVar(&o.logPath, "log", "bin/billing-bench.log", "where the consumers' JSON logs go")
	fs.StringVar(&o.pgbench, "pgbench", "", "pgbench binary (empty: the newest /usr/lib/postgresql/*/bin/pgbench, else PATH)")
	fs.StringVar(&o.kafkaScript, "kafka-script", "scripts/kafka.sh", "asked for the Kafka version")
	fs.DurationVar(&o.timebox, "timebox", 10*time.Second, "how long a sequential run consumes its backlog")
	fs.DurationVar(&o.steadyFor, "steady", 5*time.Second, "duration of the steady offered load")
	fs.Float64Var(&o.steadyCap, "steady-cap", 1500, "cap of the steady offered load, events/s")
	fs.DurationVar(&o.poll, "poll", 20*time.Millisecond, "interval of the committed-offset polling")
	fs.Float64Var(&o.scale, "scale", 1, "multiplies every backlog size (e.g. 0.2 for a quick try)")
	fs.IntVar(&o.repeat, "repeat", 3, "drains of each default-mode backlog (the table, the baseline, the sweep); the run with the median events/s is reported, with the range of all")
	fs.BoolVar(&o.skipPgbench, "skip-pgbench", false, "do not run pgbench")
	fs.StringVar(&o.only, "only", "", "run only these parts, comma-separated: mode:latency pairs (e.g. default:20ms, fasthttp-tls:0s), clients, sweep, partitions, recovery, failing; for trying things out")
	fs.StringVar(&o.baseline, "baseline", "", "also measure the default mode of this binary (the code before the change) in the same sitting, and report before / after / ratio")
	fs.StringVar(&o.jsonPath, "json", "", "write the results as JSON here, after reading the previous results from it (shown as the previous run)")
	fs.StringVar(&o.profileDir, "profile", "", "profile instead of benchmarking: drain one default-mode backlog at 0 ms and write cpu.pprof and allocs.pprof of the consumer here")
	fs.IntVar(&o.profileSeconds, "profile-seconds", 20, "length of the CPU profile of -profile, from the first commit")
	fs.IntVar(&o.profileBacklog, "profile-backlog", 500000, "records of the -profile backlog: enough to outlast -profile-seconds")
	fs.BoolVar(&o.skipSweep, "skip-sweep", false, "do not run the backlog-size sweep")
	fs.BoolVar(&o.skipClients, "skip-clients", false, "do not run the payment-client modes (nethttp, fasthttp, each over plain HTTP and TLS: clients.go)")
	fs.BoolVar(&o.skipPartitions, "skip-partitions", false, "do not run the partition-count sweep (12 to 160 partitions on one replica)")
	fs.BoolVar(&o.skipRecovery, "skip-recovery", false, "do not run the crashed-replica and rolling-restart scenario")
	fs.BoolVar(&o.skipFailing, "skip-failing", false, "do not run the row with 0.1% of orders failing at the provider for a minute")
	fs.Float64Var(&o.recoveryRate, "recovery-rate", 1000, "offered load of the recovery scenario, events/s")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.profileDir != "" && (o.profileSeconds < 1 || o.profileBacklog < 1) {
		return o, errors.New("-profile-seconds and -profile-backlog must be positive")
	}
	if o.repeat < 1 {
		return o, errors.New("-repeat must be at least 1")
	}
	if o.recoveryRate <= 0 {
		return o, errors.New("-recovery-rate must be positive")
	}
	o.dbURL = os.Getenv("BILLING_DATABASE_URL")
	if o.dbURL == "" {
		return o, errors.New("BILLING_DATABASE_URL: required (make bench starts a local Postgres and sets it)")
	}
	if b := strings.TrimSpace(os.Getenv("BENCH_BROKERS")); b != "" {
		o.brokers = strings.Split(b, ",")
	} else {
		return o, errors.New("BENCH_BROKERS: required, the real Kafka broker (make bench runs scripts/kafka.sh start)")
	}
	return o, nil
}
