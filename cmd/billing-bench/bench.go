package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

const (
	// drainPartitions is the partition count of the drains and of the
	// recovery scenario's topic.
	drainPartitions = 6
	dlqTopic        = "billing-bench.dlq"
	// underDB and baselineDB are the scratch databases the binary under
	// test and the -baseline binary bill into, each created empty when
	// the bench opens, migrated by its own binary (a binary refuses a
	// schema newer than it understands, so the code before a migration
	// cannot share the database of the code after it) and dropped at the
	// end. Both start alike: a binary billing into a database that earlier
	// runs had filled (millions of charge rows) would pay for their index
	// depth and cache misses, and the comparison with a binary on an empty
	// one would measure the databases.
	underDB, baselineDB = "billing_bench_under", "billing_bench_baseline"
)

// binary is a billing-consumer binary and the database it bills into.
type binary struct {
	Label  string // "under test" or "baseline"
	path   string
	dbURL  string
	dbName string
	db     *pgxpool.Pool
}

// bench holds what the runs share. Its methods run one at a time.
type bench struct {
	o           options
	admin       *pgxpool.Pool // BILLING_DATABASE_URL's: creates and drops the scratch databases
	under, base *binary       // base is nil without -baseline
	machine     machine
	postmaster  int   // pid of the Postgres server, for its CPU (proc.go)
	nextOrder   int64 // first free order id: fresh per invocation (from the clock)
	log, out    io.Writer
}

// openBench describes the machine, refuses a Postgres without fsync,
// creates the dead-letter topic and the database of each binary. The
// caller closes the bench.
func openBench(ctx context.Context, o options, log, out io.Writer) (*bench, error) {
	admin, err := pgxpool.New(ctx, o.dbURL)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	b := &bench{o: o, admin: admin, log: log, out: out, nextOrder: time.Now().UnixMilli() * 1000}
	if b.machine, err = describe(ctx, admin, o); err != nil {
		return b, err
	}
	if b.machine.Fsync != "on" {
		return b, fmt.Errorf("postgres runs with fsync=%s: the numbers would not be those of durable commits", b.machine.Fsync)
	}
	if b.postmaster, err = postmasterPID(ctx, admin); err != nil {
		return b, err
	}
	if err := kafkatest.CreateTopicErr(ctx, o.brokers, dlqTopic, 3); err != nil {
		return b, fmt.Errorf("create topic %s: %w", dlqTopic, err)
	}
	if b.under, err = b.scratch(ctx, "under test", o.bin, underDB); err != nil {
		return b, err
	}
	if o.baseline != "" && o.profileDir == "" {
		b.base, err = b.scratch(ctx, "baseline", o.baseline, baselineDB)
	}
	return b, err
}

// close closes the pools and drops the scratch databases.
func (b *bench) close() {
	for _, bin := range []*binary{b.under, b.base} {
		if bin != nil && bin.db != nil {
			bin.db.Close()
			_, _ = b.admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+bin.dbName+" WITH (FORCE)")
		}
	}
	b.admin.Close()
}

// scratch creates the database name afresh and migrates it with the binary
// at path.
func (b *bench) scratch(ctx context.Context, label, path, name string) (*binary, error) {
	u, err := url.Parse(b.o.dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, errors.New("BILLING_DATABASE_URL must be a postgres:// URL: the bench creates its scratch databases beside its database")
	}
	u.Path = "/" + name
	for _, sql := range []string{"DROP DATABASE IF EXISTS " + name + " WITH (FORCE)", "CREATE DATABASE " + name} {
		if _, err := b.admin.Exec(ctx, sql); err != nil {
			return nil, fmt.Errorf("%s: %w", sql, err)
		}
	}
	bin := &binary{Label: label, path: path, dbURL: u.String(), dbName: name}
	if bin.db, err = pgxpool.New(ctx, bin.dbURL); err != nil {
		return nil, err
	}
	if err := b.migrate(ctx, bin); err != nil {
		return bin, fmt.Errorf("%s: %w", label, err)
	}
	return bin, nil
}

// migrate runs the binary's migrate and retention commands (retention
// creates today's dedup partitions) on its database.
func (b *bench) migrate(ctx context.Context, bin *binary) error {
	for _, command := range []string{"migrate", "retention"} {
		cmd := exec.CommandContext(ctx, bin.path, command)
		cmd.Env = []string{"BILLING_DATABASE_URL=" + bin.dbURL}
		cmd.Stdout, cmd.Stderr = b.log, b.log
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w (see %s)", bin.path, command, err, logPath)
		}
	}
	return nil
}

// phase is one fresh topic (its own group, order range and simulator) and
// the environment of the consumers that bill it.
type phase struct {
	topic  string
	bin    *binary
	first  int64 // the phase's orders are first .. first+orders-1
	orders int
	sim    *paysim.Sim
	srv    *http.Server
	env    []string
}

// newPhase creates a topic of partitions partitions and starts a simulator
// for a phase of orders orders, after a VACUUM of the binary's database so
// that no autovacuum of the earlier phases' rows lands in this one's
// measured window, and a CHECKPOINT, so that every phase starts just after
// one: the first change of a page after a checkpoint writes the whole page
// to the WAL, and a checkpoint that fell in one drain's window and not in
// its pair's showed as 10% more WAL per event in that drain. The
// checkpoint needs the pg_checkpoint role (scripts/pg.sh grants it); a
// refusal is logged and the phase goes on.
func (b *bench) newPhase(ctx context.Context, bin *binary, kind string, partitions, orders int, env []string) (*phase, error) {
	topic := kafkatest.UniqueName("bench-" + kind)
	if err := kafkatest.CreateTopicErr(ctx, b.o.brokers, topic, partitions); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
	if _, err := bin.db.Exec(ctx, "VACUUM (ANALYZE)", pgx.QueryExecModeSimpleProtocol); err != nil {
		return nil, fmt.Errorf("vacuum: %w", err)
	}
	if _, err := b.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		fmt.Fprintf(b.log, "billing-bench: checkpoint before the phase: %v\n", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &phase{topic: topic, bin: bin, first: b.nextOrder, orders: orders, sim: paysim.New(paysim.Config{Seed: uint64(b.nextOrder)})}
	b.nextOrder += int64(orders)
	p.srv = &http.Server{Handler: p.sim, ReadHeaderTimeout: 5 * time.Second}
	go p.srv.Serve(ln) //nolint:errcheck // ends with Close
	p.env = append([]string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(b.o.brokers, ","),
		"BILLING_KAFKA_TOPIC=" + topic,
		"BILLING_KAFKA_GROUP_ID=" + topic,
		"BILLING_KAFKA_DLQ_TOPIC=" + dlqTopic,
		"BILLING_DATABASE_URL=" + bin.dbURL,
		"BILLING_PAYMENT_URL=http://" + ln.Addr().String(),
	}, env...)
	return p, nil
}

// plan generates the phase's workload: one valid event per order, each
// order charged exactly once.
func (p *phase) plan() (harness.Plan, error) {
	return harness.Generate(harness.Spec{Orders: p.orders, FirstOrderID: p.first, Seed: uint64(p.first), Now: time.Now()})
}

// end stops the simulator and deletes the topic: thousands of partitions
// left on the one broker would cost it CPU in every later phase. A topic
// that cannot be deleted is only logged.
func (b *bench) end(p *phase) {
	_ = p.srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(b.o.brokers...), Timeout: 10 * time.Second}
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{p.topic}})
	if err == nil {
		err = res.Errors[p.topic]
	}
	if err != nil {
		fmt.Fprintf(b.log, "billing-bench: delete topic %s: %v\n", p.topic, err)
	}
}

// verify checks, once the consumers have stopped, that every order of plan
// was charged exactly once at the simulator with one settled ledger row
// naming that charge, and that the group committed every record (SPEC §9,
// harness.Verify); it returns the problems found.
func (b *bench) verify(ctx context.Context, p *phase, plan harness.Plan) ([]string, error) {
	rep, err := harness.Verify(ctx, harness.Check{
		Brokers: b.o.brokers, Topic: p.topic, DLQTopic: dlqTopic, Group: p.topic, DB: p.bin.db, Sim: p.sim,
		Plan: plan, FirstOrderID: p.first, LastOrderID: p.first + int64(p.orders) - 1,
	})
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", p.topic, err)
	}
	var out []string
	for _, pr := range rep.Problems {
		out = append(out, p.topic+": "+pr)
	}
	return out, nil
}

// consumerProc is a running `billing-consumer run` and its HTTP address.
type consumerProc struct {
	*harness.Process
	addr string
}

// start runs the phase's binary with exactly its environment (plus PATH
// and a free BILLING_HTTP_ADDR), its output going to the log.
func (b *bench) start(p *phase) (*consumerProc, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	proc, err := harness.Start(p.bin.path, []string{"run"}, append([]string{"BILLING_HTTP_ADDR=" + addr}, p.env...), b.log)
	if err != nil {
		return nil, err
	}
	return &consumerProc{Process: proc, addr: addr}, nil
}
