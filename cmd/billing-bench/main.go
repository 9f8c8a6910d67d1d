// Command billing-bench measures the real billing-consumer binary against a
// real Kafka broker (BENCH_BROKERS), the Postgres of BILLING_DATABASE_URL
// (fsync on) and the payment simulator answering at once: a backlog's
// drain, per event (drain.go), with -baseline alternated with another
// binary's; one replica's memory at 12 and 160 partitions (partsweep.go);
// produce→charge latency of two replicas under a steady load, and across
// a SIGKILL and a replacement (recovery.go). After every run
// harness.Verify checks that each order was charged exactly once. It
// writes the tables (docs/benchmarks.md) and the data (.json), and exits 1
// when a check failed. make bench runs it, make profile its -profile mode.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
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

// options are the command-line settings, BILLING_DATABASE_URL and
// BENCH_BROKERS.
type options struct {
	bin, baseline, out, jsonPath, only, profileDir string
	brokers                                        []string
	dbURL                                          string
	scale                                          float64
	repeat, profileSeconds, profileBacklog         int
	profilePartitions                              int           // of -profile's topic
	profileLarge                                   bool          // -profile's producer: the sweep's large batches
	stageFor                                       time.Duration // of the recovery (recovery.go)
}

// logPath is where the consumers' logs go.
const logPath = "bin/billing-bench.log"

// parts are the names -only accepts.
var parts = []string{"drain", "partitions", "recovery"}

// selected reports whether -only (empty: every part) names part.
func (o options) selected(part string) bool {
	return o.only == "" || slices.Contains(strings.Split(o.only, ","), part)
}

// parseOptions reads the flags and BILLING_DATABASE_URL and BENCH_BROKERS.
func parseOptions(args []string) (options, error) {
	fs := flag.NewFlagSet("billing-bench", flag.ContinueOnError)
	var o options
	fs.StringVar(&o.bin, "consumer", "bin/billing-consumer", "the billing-consumer binary under test")
	fs.StringVar(&o.baseline, "baseline", "", "another binary (the code before a change): its drains alternate with the binary under test's, and the report gives the median of the paired ratios")
	fs.StringVar(&o.out, "out", "", "write the Markdown tables here (empty: stdout only)")
	fs.StringVar(&o.jsonPath, "json", "", "write the results as JSON here (empty: none)")
	fs.Float64Var(&o.scale, "scale", 1, "multiplies every backlog and the recovery's stages (at least 10 s): 0.1 for a quick try")
	fs.IntVar(&o.repeat, "repeat", 3, "drains of each backlog; with -baseline, pairs of drains (at least 4)")
	fs.StringVar(&o.only, "only", "", "run only these parts, comma-separated: "+strings.Join(parts, ", "))
	fs.StringVar(&o.profileDir, "profile", "", "profile instead: drain one backlog and write the consumer's cpu.pprof and allocs.pprof here")
	fs.IntVar(&o.profileSeconds, "profile-seconds", 20, "length of -profile's CPU profile, from the first finished event")
	fs.IntVar(&o.profileBacklog, "profile-backlog", 500_000, "records of -profile's backlog: enough to outlast -profile-seconds")
	fs.IntVar(&o.profilePartitions, "profile-partitions", drainPartitions, "partitions of -profile's topic (the sweep's: 12, 160)")
	fs.BoolVar(&o.profileLarge, "profile-large", false, "-profile's producer makes the sweep's large batches (1 MB, GOMEMLIMIT as the sweep's)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.repeat < 1 || o.scale <= 0:
		return o, errors.New("-repeat and -scale must be positive")
	case o.profileDir != "" && (o.profileSeconds < 1 || o.profileBacklog < 1 || o.profilePartitions < 1):
		return o, errors.New("-profile-seconds, -profile-backlog and -profile-partitions must be positive")
	}
	for _, p := range strings.Split(o.only, ",") {
		if o.only != "" && !slices.Contains(parts, p) {
			return o, fmt.Errorf("-only: unknown part %q (known: %s)", p, strings.Join(parts, ", "))
		}
	}
	if o.baseline != "" { // issue 31: at least four pairs
		o.repeat = max(4, o.repeat)
	}
	o.stageFor = max(10*time.Second, time.Duration(float64(stageFor)*o.scale))
	if o.dbURL = os.Getenv("BILLING_DATABASE_URL"); o.dbURL == "" {
		return o, errors.New("BILLING_DATABASE_URL: required (make bench starts a local Postgres and sets it)")
	}
	if b := strings.TrimSpace(os.Getenv("BENCH_BROKERS")); b != "" {
		o.brokers = strings.Split(b, ",")
	} else {
		return o, errors.New("BENCH_BROKERS: required, the real Kafka broker (make bench runs scripts/kafka.sh start)")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseOptions(args)
	if err != nil {
		return err
	}
	began := time.Now()
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	b, err := openBench(ctx, o, logf, stdout)
	if b != nil {
		defer b.close()
	}
	if err != nil {
		return err
	}
	if o.profileDir != "" {
		return b.runProfile(ctx)
	}
	rep := &report{Machine: b.machine, Scale: o.scale, Repeat: o.repeat}
	if err := b.measureAll(ctx, rep); err != nil {
		return err
	}
	rep.TookS = time.Since(began).Round(time.Second).Seconds()
	md := rep.markdown()
	fmt.Fprint(stdout, "\n", md)
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if o.jsonPath != "" {
		if err := rep.writeJSON(o.jsonPath); err != nil {
			return err
		}
	}
	if f := rep.problems(); len(f) > 0 {
		return fmt.Errorf("exactly-once charging violated: %s", strings.Join(f, "; "))
	}
	return nil
}

// measureAll runs the parts -only selects, in order, into rep, up to the
// first error.
func (b *bench) measureAll(ctx context.Context, rep *report) (err error) {
	if b.o.selected("drain") {
		rep.Drains, err = b.runDrains(ctx)
	}
	if b.o.selected("partitions") && err == nil {
		rep.Partitions, err = b.runPartitions(ctx)
	}
	if b.o.selected("recovery") && err == nil {
		rep.Recovery = &recovery{}
		if *rep.Recovery, err = b.runRecovery(ctx); err != nil {
			err = fmt.Errorf("recovery: %w", err)
		}
	}
	return err
}
