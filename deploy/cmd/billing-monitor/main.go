// Command billing-monitor (make monitor) shows billing-consumer's
// monitoring in a real tool with no cluster: two replicas of the built
// binary on the demo's services (an in-process Kafka, the Postgres of
// BILLING_DATABASE_URL, the payment simulator), a real Prometheus that
// scrapes them every second and evaluates deploy/base's PrometheusRule
// with its durations scaled down (deploy/monitoring), a steady stream of
// orders, and a fault every minute — a replica killed, a replica stopped
// (its partitions stall), a provider 5xx storm, Postgres unreachable — in
// turn, until Ctrl-C. It prints the Prometheus URLs of the lag and the
// alerts, and each fault with the alerts firing at its end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/billing-consumer/billing-consumer/deploy/monitoring"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "billing-monitor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("billing-monitor", flag.ContinueOnError)
	bin := fs.String("consumer", "../bin/billing-consumer", "the billing-consumer binary")
	prom := fs.String("prometheus", "", "the prometheus binary (make monitor: scripts/prometheus.sh path)")
	db := fs.String("db", os.Getenv("BILLING_DATABASE_URL"), "Postgres URL (default $BILLING_DATABASE_URL)")
	addr := fs.String("addr", "127.0.0.1:9091", "Prometheus' listen address")
	every := fs.Duration("every", time.Minute, "interval between two faults")
	hold := fs.Duration("hold", 40*time.Second, "how long each fault lasts")
	logPath := fs.String("log", "../bin/billing-monitor.log", "where the replicas' and Prometheus' output goes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prom == "" || *db == "" {
		return errors.New("-prometheus and -db (or BILLING_DATABASE_URL) are required")
	}
	if *hold >= *every {
		return errors.New("-hold must be shorter than -every")
	}
	logf, err := os.Create(*logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	dir, err := os.MkdirTemp("", "billing-monitor-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return fmt.Errorf("start in-process Kafka: %w", err)
	}
	defer cluster.Close()
	rig, err := monitoring.NewRig(ctx, monitoring.RigConfig{Bin: *bin, Prometheus: *prom, Brokers: cluster.ListenAddrs(),
		DBURL: *db, Dir: dir, RulesDir: "base", Namespace: "billing-demo", Partitions: 4, Replicas: 2,
		PrometheusAddr: *addr, Interval: time.Second, OrdersPerSecond: 20, Log: logf})
	if err != nil {
		return fmt.Errorf("%w (the replicas' and Prometheus' output: %s)", err, *logPath)
	}
	defer rig.Close()
	if err := rig.Produce(); err != nil {
		return err
	}
	printURLs(out, rig, *logPath, *every)
	faults := monitoring.Phases(10 * time.Second)[1:5]
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "stopping")
			return nil
		case <-time.After(*every - *hold):
		}
		if err := inject(ctx, out, rig, faults[i%len(faults)], *hold); err != nil {
			return err
		}
	}
}

// inject applies one fault for hold, prints the alerts firing at its end,
// and undoes it (also when interrupted).
//
// A fault that must raise no alert (a replica killed) lasts 5s only: its
// pod would restart it at once, while a replica down for the whole hold
// would stall its partitions.
func inject(ctx context.Context, out io.Writer, rig *monitoring.Rig, f monitoring.Phase, hold time.Duration) error {
	expect := "expected alerts: " + strings.Join(f.Alerts, ", ")
	if len(f.Alerts) == 0 {
		hold, expect = 5*time.Second, "no alert expected"
	}
	fmt.Fprintf(out, "%s fault: %s, for %v (%s)\n", time.Now().Format("15:04:05"), f.Fault, hold, expect)
	if err := f.Start(ctx, rig); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(hold):
	}
	firing, err := rig.Prom.Firing(context.WithoutCancel(ctx))
	if err == nil {
		fmt.Fprintf(out, "%s firing: %v; undoing the fault\n", time.Now().Format("15:04:05"), firing)
	}
	return f.End(context.WithoutCancel(ctx), rig)
}

func printURLs(out io.Writer, rig *monitoring.Rig, logPath string, every time.Duration) {
	q := func(expr string) string { return rig.Prom.URL + "/api/v1/query?query=" + url.QueryEscape(expr) }
	lag := "namespace_partition:billing_kafka_consumer_lag:max"
	fmt.Fprintf(out, "billing-monitor: %d replicas of billing-consumer on an in-process Kafka, Postgres and the payment simulator, 20 orders/s\n", len(rig.Replicas))
	fmt.Fprintf(out, "Prometheus %s scrapes them every second; the alert rules run %dx faster than in production\n", rig.Prom.URL, rig.Factor)
	fmt.Fprintf(out, "  lag per partition: %s\n", q(lag))
	fmt.Fprintf(out, "  lag over 5 min:    %s\n", q(lag+"[5m]"))
	fmt.Fprintf(out, "  alerts:            %s/api/v1/alerts\n", rig.Prom.URL)
	fmt.Fprintf(out, "  rules and states:  %s/api/v1/rules?type=alert\n", rig.Prom.URL)
	fmt.Fprintf(out, "  web UI (a Prometheus built with its assets, e.g. make monitor PROMETHEUS=/usr/bin/prometheus): %s/graph?g0.expr=%s&g0.range_input=15m and %s/alerts\n",
		rig.Prom.URL, url.QueryEscape(lag), rig.Prom.URL)
	fmt.Fprintf(out, "replica and Prometheus output: %s. A fault every %v; Ctrl-C stops.\n", logPath, every)
}
