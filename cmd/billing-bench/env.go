package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// machine describes where the numbers were taken.
type machine struct {
	CPUs         int
	CPUModel     string
	Memory       string
	Kernel       string
	LoadAvg      string // at the start, to show what else was running
	GoVersion    string
	Consumer     string // billing-consumer version line
	PGVersion    string
	Fsync        string
	SyncCommit   string
	KafkaVersion string
	Defaults     defaults // of the binary under test, from its help
	// BaselineConsumer is the version line of the -baseline binary.
	BaselineConsumer string
}

// defaults are the binary's defaults of the settings the default mode
// relies on, read from `billing-consumer help` so that the report never
// states a figure copied by hand.
type defaults struct {
	Concurrency int // BILLING_CONCURRENCY
	BatchSize   int // BILLING_BATCH_SIZE
	// Group are the defaults of the group and shutdown settings that the
	// recovery scenario depends on, as the help prints them, by variable;
	// only those the binary has (a heartbeat setting may not exist).
	Group map[string]string
}

// groupSettings are the variables of defaults.Group.
var groupSettings = []string{
	"BILLING_KAFKA_SESSION_TIMEOUT", "BILLING_KAFKA_HEARTBEAT_INTERVAL", "BILLING_KAFKA_REBALANCE_TIMEOUT",
	"BILLING_DRAIN_TIMEOUT", "BILLING_KAFKA_COMMIT_INTERVAL",
}

// readDefaults runs `bin help` and reads the defaults from its table of
// variables (name, type, default, description).
func readDefaults(ctx context.Context, bin string) (defaults, error) {
	out, err := exec.CommandContext(ctx, bin, "help").Output()
	if err != nil {
		return defaults{}, fmt.Errorf("%s help: %w (run make build)", bin, err)
	}
	return parseDefaults(string(out))
}

// parseDefaults reads the defaults from the output of `billing-consumer
// help`; a variable missing, or a default that is not an integer, is an
// error naming it.
func parseDefaults(help string) (defaults, error) {
	d := defaults{Group: map[string]string{}}
	want := map[string]*int{
		"BILLING_CONCURRENCY": &d.Concurrency, "BILLING_BATCH_SIZE": &d.BatchSize,
	}
	for line := range strings.Lines(help) {
		f := strings.Fields(line)
		if len(f) >= 3 && slices.Contains(groupSettings, f[0]) {
			d.Group[f[0]] = f[2]
		}
		if len(f) < 3 || want[f[0]] == nil {
			continue
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return defaults{}, fmt.Errorf("billing-consumer help: default of %s is %q, not an integer", f[0], f[2])
		}
		*want[f[0]] = n
		delete(want, f[0])
	}
	for name := range want {
		return defaults{}, fmt.Errorf("billing-consumer help does not list %s", name)
	}
	return d, nil
}

// describeEnv collects the machine, the Go toolchain and the versions and
// durability settings of the services.
func describeEnv(ctx context.Context, pool *pgxpool.Pool, o options) (machine, error) {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseFloat(strings.Fields(procField("/proc/meminfo", "MemTotal") + " 0")[0], 64); err == nil {
		m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if out, err := exec.CommandContext(ctx, o.bin, "version").Output(); err == nil {
		m.Consumer = strings.TrimSpace(string(out))
	} else {
		return m, fmt.Errorf("%s version: %w (run make build)", o.bin, err)
	}
	if o.baseline != "" {
		out, err := exec.CommandContext(ctx, o.baseline, "version").Output()
		if err != nil {
			return m, fmt.Errorf("-baseline %s version: %w", o.baseline, err)
		}
		m.BaselineConsumer = strings.TrimSpace(string(out))
	}
	var err error
	if m.Defaults, err = readDefaults(ctx, o.bin); err != nil {
		return m, err
	}
	for _, q := range []struct {
		sql string
		dst *string
	}{{"SHOW server_version", &m.PGVersion}, {"SHOW fsync", &m.Fsync}, {"SHOW synchronous_commit", &m.SyncCommit}} {
		if err := pool.QueryRow(ctx, q.sql).Scan(q.dst); err != nil {
			return m, fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	m.KafkaVersion = "unknown"
	if out, err := exec.CommandContext(ctx, o.kafkaScript, "version").Output(); err == nil {
		m.KafkaVersion = "Apache Kafka " + strings.TrimSpace(string(out))
	}
	return m, nil
}

// procField returns the value of the first "key: value" line of a /proc
// file, or "".
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// runOnce runs a one-shot billing-consumer command (migrate, retention)
// with env and waits for it.
func runOnce(ctx context.Context, bin string, env []string, log io.Writer, command string) error {
	cmd := exec.CommandContext(ctx, bin, command)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("billing-consumer %s: %w (see the log)", command, err)
	}
	return nil
}
