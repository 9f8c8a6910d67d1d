// Command billing-demo shows billing-consumer at work on a laptop: an
// in-process Kafka broker (franz-go's kfake), the payment-provider
// simulator with a few injected faults, and the real billing-consumer
// binary as a subprocess, against the Postgres of BILLING_DATABASE_URL
// (make demo starts a scratch one). It publishes about 10,000 order events
// with duplicates, invalid records and second events for one order, waits
// until the consumer group has drained the topic, stops the consumer with
// SIGTERM and prints what happened. It exits 1 when any guarantee of SPEC
// §9 failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

const (
	topic    = "order-service.order.confirmed"
	dlqTopic = "billing-order-confirmed.dlq"
	group    = "billing-order-confirmed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "billing-demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("billing-demo", flag.ContinueOnError)
	bin := fs.String("consumer", "bin/billing-consumer", "path of the billing-consumer binary")
	orders := fs.Int("orders", 9000, "distinct orders")
	partitions := fs.Int("partitions", 6, "partitions of the source topic")
	latency := fs.Duration("latency", 2*time.Millisecond, "payment provider latency")
	logFile := fs.String("log", "bin/billing-demo.log", "where the consumer's JSON log goes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dbURL := os.Getenv("BILLING_DATABASE_URL")
	if dbURL == "" {
		return errors.New("BILLING_DATABASE_URL: required (make demo starts a local Postgres and sets it)")
	}

	cluster, err := startKafka(ctx, *partitions)
	if err != nil {
		return err
	}
	defer cluster.Close()
	brokers := cluster.ListenAddrs()

	firstOrder := time.Now().UnixMilli() * 10 // fresh order ids on every run
	plan, err := harness.Generate(harness.Spec{
		Orders: *orders, FirstOrderID: firstOrder, DuplicateRate: 0.11, CrossPartitionRate: 0.3,
		Invalid: 24, SecondEvents: 1, Conflicts: 1, Declined: 3, Seed: uint64(firstOrder), Now: time.Now(),
	})
	if err != nil {
		return err
	}
	sim, simURL, stopSim, err := startSimulator(plan, *latency)
	if err != nil {
		return err
	}
	defer stopSim()

	logf, err := createLog(*logFile)
	if err != nil {
		return err
	}
	defer logf.Close()
	httpAddr, err := freeAddr()
	if err != nil {
		return err
	}
	env := consumerEnv(brokers, dbURL, simURL, httpAddr)
	if err := migrate(ctx, *bin, env, logf); err != nil {
		return fmt.Errorf("billing-consumer migrate failed (see %s): %w", *logFile, err)
	}

	fmt.Fprintf(out, "publishing %d records (%d orders, %d duplicates, %d invalid) to %d partitions...\n",
		len(plan.Records), *orders, plan.Outcomes["duplicate"], len(plan.InvalidValues), *partitions)
	if err := harness.Produce(ctx, brokers, topic, plan.Records); err != nil {
		return err
	}

	outcomes, elapsed, err := consume(ctx, *bin, env, logf, brokers, httpAddr, func() {
		fmt.Fprintf(out, "billing-consumer running (log: %s, metrics: http://%s/metrics); waiting for the group to drain the topic...\n", *logFile, httpAddr)
	})
	if err != nil {
		return err
	}

	rep, err := verify(ctx, dbURL, harness.Check{
		Brokers: brokers, Topic: topic, DLQTopic: dlqTopic, Group: group, Sim: sim, Plan: plan,
		FirstOrderID: firstOrder, LastOrderID: firstOrder + int64(*orders),
	})
	if err != nil {
		return err
	}
	problems := append(slices.Clone(rep.Problems), countMismatches(plan, outcomes)...)
	printSummary(out, plan, rep, outcomes, sim, elapsed, problems)
	if len(problems) > 0 {
		return fmt.Errorf("guarantees violated: %s", strings.Join(problems, "; "))
	}
	return nil
}

// outcomeKeys are the rows of the summary's first table: the result labels
// of billing_events_total that the plan predicts.
var outcomeKeys = []string{"charged", "duplicate", "duplicate_order", "dlq"}

// countMismatches compares what the consumer counted (billing_events_total
// by result) with what the plan expects: the demo runs one consumer with
// no restart, so every record is processed exactly once and each count
// must match exactly.
func countMismatches(plan harness.Plan, outcomes map[string]float64) []string {
	var out []string
	total := 0.0
	for _, k := range outcomeKeys {
		total += outcomes[k]
		if outcomes[k] != float64(plan.Outcomes[k]) {
			out = append(out, fmt.Sprintf("the consumer counted %.0f %s events, the plan expects %d", outcomes[k], k, plan.Outcomes[k]))
		}
	}
	if total != float64(len(plan.Records)) {
		out = append(out, fmt.Sprintf("the consumer counted %.0f events in all, %d records were published", total, len(plan.Records)))
	}
	return out
}

// consume runs `bin run` with env until the group has drained the topic
// (started is called once it runs), reads the consumer's counts of
// billing_events_total by result, and stops it with SIGTERM, which must
// end it cleanly. elapsed is from the start to the drained topic.
func consume(ctx context.Context, bin string, env []string, logf io.Writer, brokers []string, httpAddr string,
	started func()) (outcomes map[string]float64, elapsed time.Duration, err error) {
	start := time.Now()
	proc, err := harness.Start(bin, []string{"run"}, env, logf)
	if err != nil {
		return nil, 0, err
	}
	defer proc.Kill()
	started()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	if err := waitDrained(wctx, brokers, proc); err != nil {
		return nil, 0, err
	}
	elapsed = time.Since(start)
	if outcomes, err = scrape(ctx, httpAddr); err != nil {
		return nil, 0, err
	}
	if err := proc.Stop(40 * time.Second); err != nil {
		return nil, 0, fmt.Errorf("billing-consumer did not shut down cleanly: %w", err)
	}
	return outcomes, elapsed, nil
}

// consumerEnv is the whole environment of the consumer's commands: the
// demo's services, short retries and a lag gauge that follows quickly.
func consumerEnv(brokers []string, dbURL, simURL, httpAddr string) []string {
	return []string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(brokers, ","),
		"BILLING_DATABASE_URL=" + dbURL,
		"BILLING_PAYMENT_URL=" + simURL,
		"BILLING_HTTP_ADDR=" + httpAddr,
		"BILLING_RETRY_BACKOFF=20ms",
		"BILLING_KAFKA_LAG_INTERVAL=1s",
	}
}

// createLog creates the file at path, and its directory.
func createLog(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.Create(path)
}

// migrate runs `bin migrate` with env and waits for it.
func migrate(ctx context.Context, bin string, env []string, logf io.Writer) error {
	p, err := harness.Start(bin, []string{"migrate"}, env, logf)
	if err != nil {
		return err
	}
	return p.Wait(ctx)
}

// startKafka starts an in-process Kafka (kfake) with the source topic of
// partitions partitions and the dead-letter topic. The caller closes it.
func startKafka(ctx context.Context, partitions int) (*kfake.Cluster, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start in-process Kafka: %w", err)
	}
	for t, n := range map[string]int{topic: partitions, dlqTopic: 3} {
		if err := kafkatest.CreateTopicErr(ctx, cluster.ListenAddrs(), t, n); err != nil {
			cluster.Close()
			return nil, fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	return cluster, nil
}

// startSimulator serves a payment-provider simulator with latency and a
// few faults, declining the plan's declined orders; stop closes it.
func startSimulator(plan harness.Plan, latency time.Duration) (sim *paysim.Sim, url string, stop func(), err error) {
	sim = paysim.New(paysim.Config{Seed: 7, Faults: paysim.Faults{
		Latency: latency, LatencyJitter: latency, ErrorRate: 0.01, ResetRate: 0.005,
		Decline: func(order int64) bool { return plan.Declined[order] },
	}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	return sim, "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// verify checks SPEC §9 on the database at dbURL and the topics.
func verify(ctx context.Context, dbURL string, check harness.Check) (harness.Report, error) {
	return harness.VerifyAt(ctx, dbURL, check)
}

func waitDrained(ctx context.Context, brokers []string, proc *harness.Process) error {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- harness.WaitDrained(dctx, brokers, topic, group) }()
	for {
		select {
		case err := <-done:
			return err
		case <-time.After(200 * time.Millisecond):
			if exited, err := proc.Exited(); exited {
				return fmt.Errorf("billing-consumer exited early: %v", err)
			}
		}
	}
}

// scrape reads billing_events_total by result from the consumer's /metrics.
func scrape(ctx context.Context, addr string) (map[string]float64, error) {
	families, err := harness.Scrape(ctx, addr)
	if err != nil {
		return nil, err
	}
	return harness.CounterBy(families["billing_events_total"], "result"), nil
}

// printSummary prints the run's figures beside the expected ones, then OK
// or the problems found.
func printSummary(w io.Writer, plan harness.Plan, rep harness.Report, outcomes map[string]float64, sim *paysim.Sim,
	elapsed time.Duration, problems []string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\nEVENTS BY OUTCOME\tcounted by the consumer\texpected")
	total := 0.0
	for _, k := range outcomeKeys {
		total += outcomes[k]
		fmt.Fprintf(tw, "  %s\t%.0f\t%d\n", k, outcomes[k], plan.Outcomes[k])
	}
	fmt.Fprintf(tw, "  total\t%.0f\t%d\n", total, len(plan.Records))
	fmt.Fprintln(tw, "DEAD-LETTER TOPIC\t\t")
	reasons := make([]string, 0, len(rep.DLQ))
	for r := range rep.DLQ {
		reasons = append(reasons, string(r))
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		fmt.Fprintf(tw, "  %s\t%d\t%d\n", r, rep.DLQ[dlq.Reason(r)], plan.DLQ[dlq.Reason(r)])
	}
	inj := sim.Injected()
	fmt.Fprintln(tw, "PAYMENT PROVIDER\t\t")
	fmt.Fprintf(tw, "  distinct charges taken\t%d\t%d\n", rep.ProviderCharges, rep.ExpectedCharges)
	fmt.Fprintf(tw, "  orders charged twice\t%d\t0\n", len(rep.DoubleCharged))
	fmt.Fprintf(tw, "  injected 5xx / accept-then-reset / declines\t%d / %d / %d\t\n", inj.Errors, inj.Resets, inj.Declines)
	fmt.Fprintf(tw, "  idempotent replays served\t%d\t\n", sim.Replays())
	fmt.Fprintln(tw, "LEDGER AND OFFSETS\t\t")
	fmt.Fprintf(tw, "  ledger rows\t%d\t%d\n", rep.LedgerRows, rep.ExpectedCharges)
	fmt.Fprintf(tw, "  partitions not fully committed\t%d\t0\n", len(rep.LaggingParts))
	fmt.Fprintln(tw, "THROUGHPUT\t\t")
	fmt.Fprintf(tw, "  %d records, start to drained\t%.1fs\t\n", len(plan.Records), elapsed.Seconds())
	fmt.Fprintf(tw, "  events/s (incl. process start and group join)\t%.0f\t\n", float64(len(plan.Records))/elapsed.Seconds())
	tw.Flush()
	if len(problems) == 0 {
		fmt.Fprintln(w, "\nOK: every valid order charged exactly once, every invalid record dead-lettered, offsets at the end,")
		fmt.Fprintln(w, "    and the consumer's own counts match the expected ones.")
	} else {
		fmt.Fprintln(w, "\nFAILED:")
		for _, p := range problems {
			fmt.Fprintln(w, "  -", p)
		}
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
