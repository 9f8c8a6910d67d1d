// Command billing-bench measures the real billing-consumer binary on this
// machine: throughput draining a backlog, produce-to-commit latency under a
// steady offered load, and peak memory, for the sequential mode and the
// default (parallel) mode at three payment-provider latencies, against a
// real Kafka broker (BENCH_BROKERS), the Postgres of BILLING_DATABASE_URL
// (fsync on) and the in-process payment-provider simulator. It also runs
// pgbench with the statements of one billing transaction, to show what
// Postgres alone allows.
//
// It prints a table, writes a Markdown report and an SVG chart, and exits 1
// when any run broke exactly-once charging. make bench starts the services
// and runs it.
package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/redact"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing-bench:", err)
		os.Exit(1)
	}
}

// mode is a consumer configuration under test.
type mode struct {
	name string
	env  []string // BILLING_* settings on top of the common ones
	// sequential runs are time-boxed: the backlog is not meant to drain.
	sequential bool
	// tls serves the simulator over TLS (tlsprovider.go).
	tls bool
	// failing makes one order in 1,000 fail at the provider for a minute
	// (failing.go).
	failing bool
}

var modes = []mode{
	{name: "sequential", env: []string{"BILLING_CONCURRENCY=1", "BILLING_BATCH_SIZE=1", "BILLING_KAFKA_COMMIT_INTERVAL=0"}, sequential: true},
	{name: "default"},
}

// latencies are the provider latencies of the runs.
var latencies = []time.Duration{0, 20 * time.Millisecond, 100 * time.Millisecond}

// backlog is the number of records produced before the consumer starts:
// about ten seconds of work in the default mode (measured over the middle
// 60% of its drain: watchBacklog), more than the time box holds in the
// sequential mode.
func backlog(m mode, latency time.Duration, scale float64) int {
	n := map[bool]map[time.Duration]int{
		true:  {0: 14000, 20 * time.Millisecond: 700, 100 * time.Millisecond: 150},
		false: {0: 160000, 20 * time.Millisecond: 140000, 100 * time.Millisecond: 64000},
	}[m.sequential][latency]
	return max(50, int(float64(n)*scale))
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.logPath), 0o755); err != nil {
		return err
	}
	logf, err := os.Create(o.logPath)
	if err != nil {
		return err
	}
	defer logf.Close()

	began := time.Now()
	var prev *runJSON // read first: a bad file stops the run before it starts
	if o.jsonPath != "" {
		if prev, err = readPrevious(o.jsonPath); err != nil {
			return err
		}
	}
	pool, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return fmt.Errorf("open database: %w", err)
	}
	defer pool.Close()
	env, err := describeEnv(ctx, pool, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "billing-bench: %d CPUs, %s RAM, %s, Postgres %s (fsync=%s, synchronous_commit=%s), Kafka %s at %s\n",
		env.CPUs, env.Memory, env.GoVersion, env.PGVersion, env.Fsync, env.SyncCommit, env.KafkaVersion, strings.Join(o.brokers, ","))
	if env.Fsync != "on" {
		return fmt.Errorf("postgres runs with fsync=%s: the numbers would not be those of durable commits", env.Fsync)
	}
	if err := kafkatest.CreateTopicErr(ctx, o.brokers, dlqTopic, 3); err != nil {
		return fmt.Errorf("create topic %s: %w", dlqTopic, err)
	}
	fmt.Fprintf(stdout, "migrating %s...\n", redact.String(o.dbURL))
	for _, command := range []string{"migrate", "retention"} { // retention creates today's dedup partitions
		if err := runOnce(ctx, o.bin, []string{"BILLING_DATABASE_URL=" + o.dbURL}, logf, command); err != nil {
			return err
		}
	}

	b := &bench{o: o, pool: pool, log: logf, out: stdout, firstOrder: time.Now().UnixMilli() * 1000, svc: findServices(o)}
	if o.baseline != "" && o.profileDir == "" {
		var closeBase func()
		if b.baseURL, b.basePool, closeBase, err = openBaselineDB(ctx, o, pool, o.baseline, logf); err != nil {
			return err
		}
		defer closeBase()
	}
	if o.profileDir != "" {
		if b.prof, err = newProfiler(o.profileDir, o.profileSeconds); err != nil {
			return err
		}
		return b.runProfile(ctx)
	}
	rep := report{previous: prev, env: env, opts: o}
	if err := b.measureAll(ctx, &rep); err != nil {
		return err
	}
	if !o.skipPgbench {
		if rep.pgbench, err = runPgbench(ctx, o, pool, logf, stdout); err != nil {
			return fmt.Errorf("pgbench: %w", err)
		}
	}
	rep.took = time.Since(began)
	rep.printTable(stdout)
	if err := rep.write(stdout); err != nil {
		return err
	}
	if f := rep.failures(); len(f) > 0 {
		return fmt.Errorf("exactly-once charging violated: %s", strings.Join(f, "; "))
	}
	return nil
}

// findServices finds the processes of the Kafka broker (o.brokers[0]) and
// of the Postgres server (BILLING_DATABASE_URL) by their listening ports,
// for the CPU accounting.
func findServices(o options) services {
	var svc services
	if _, port, ok := strings.Cut(o.brokers[0], ":"); ok {
		if p, err := strconv.Atoi(port); err == nil {
			svc.kafka = listenerPID(p)
		}
	}
	if u, err := url.Parse(o.dbURL); err == nil {
		p, _ := strconv.Atoi(cmp.Or(u.Port(), "5432"))
		svc.postgres = listenerPID(p)
	}
	return svc
}

// write writes the chart, the report and the README summary the options
// ask for.
func (r report) write(stdout io.Writer) error {
	if r.opts.chart != "" {
		if err := os.WriteFile(r.opts.chart, []byte(chartSVG(r.results)), 0o644); err != nil {
			return err
		}
	}
	if r.opts.out != "" {
		if err := os.WriteFile(r.opts.out, []byte(r.markdown(r.opts.chart)), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s", r.opts.out)
		if r.opts.chart != "" {
			fmt.Fprintf(stdout, " and %s", r.opts.chart)
		}
		fmt.Fprintln(stdout)
	}
	if r.opts.readme != "" {
		if err := writeReadme(r.opts.readme, r.readmeSummary()); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "rewrote the summary in %s\n", r.opts.readme)
	}
	if r.opts.jsonPath != "" {
		if err := writeJSON(r.opts.jsonPath, r.json(time.Now())); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", r.opts.jsonPath)
	}
	return nil
}
