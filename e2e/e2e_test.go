// Package e2e runs the built billing-consumer binary as a subprocess
// against Kafka (the real broker of BILLING_TEST_KAFKA_BROKERS under make
// test, else kfake), a scratch Postgres database and the payment simulator,
// and checks SPEC §9 from the outside.
package e2e

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// world is everything one end-to-end run needs.
type world struct {
	bin                    string
	brokers                []string
	topic, dlqTopic, group string
	dbURL                  string
	db                     *pgxpool.Pool
	sim                    *paysim.Sim
	simURL                 string
	log                    io.Writer
	logPath                string
	// extraEnv is added to the environment of every process of the world.
	extraEnv []string
}

// buildBinary compiles billing-consumer once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "billing-consumer")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/billing-consumer")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

func newWorld(t *testing.T, partitions int, faults paysim.Faults) *world {
	t.Helper()
	return newWorldOn(t, kafkatest.Brokers(t), pgtest.NewDatabase(t), partitions, faults)
}

// newWorldOn is newWorld on the given brokers and (fresh) database.
func newWorldOn(t *testing.T, brokers []string, dbURL string, partitions int, faults paysim.Faults) *world {
	t.Helper()
	w := newWorldFor(t, buildBinary(t), brokers, dbURL, partitions, faults)
	if err := w.run(t, "migrate").Wait(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if err := w.run(t, "retention").Wait(context.Background()); err != nil {
		t.Fatalf("retention: %v", err)
	}
	return w
}

// newWorldFor is a world's topics, simulator and log for the consumer bin
// (empty for one that runs elsewhere, as in the image test), on a database
// not yet migrated.
func newWorldFor(t *testing.T, bin string, brokers []string, dbURL string, partitions int, faults paysim.Faults) *world {
	t.Helper()
	w := &world{
		bin:      bin,
		brokers:  brokers,
		topic:    kafkatest.UniqueName("orders"),
		dlqTopic: kafkatest.UniqueName("orders-dlq"),
		group:    kafkatest.UniqueName("billing"),
		dbURL:    dbURL,
	}
	kafkatest.CreateTopic(t, w.brokers, w.topic, partitions)
	kafkatest.CreateTopic(t, w.brokers, w.dlqTopic, 1)
	w.db = pgtest.Open(t, w.dbURL)
	w.sim = paysim.New(paysim.Config{Seed: 42, Faults: faults})
	srv := httptest.NewServer(w.sim)
	t.Cleanup(srv.Close)
	w.simURL = srv.URL
	w.logPath = filepath.Join(t.TempDir(), "consumer.log")
	f, err := os.Create(w.logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(w.logPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("last consumer log lines:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	w.log = f
	return w
}

// EnvPaymentClient, when set, is the BILLING_PAYMENT_CLIENT of every
// consumer the suite starts, so that it can be run against either payment
// client (unset: the binary's default).
const EnvPaymentClient = "BILLING_TEST_PAYMENT_CLIENT"

func (w *world) env(extra ...string) []string {
	if c := os.Getenv(EnvPaymentClient); c != "" {
		extra = append([]string{"BILLING_PAYMENT_CLIENT=" + c}, extra...)
	}
	return append([]string{
		"BILLING_KAFKA_BROKERS=" + strings.Join(w.brokers, ","),
		"BILLING_KAFKA_TOPIC=" + w.topic,
		"BILLING_KAFKA_DLQ_TOPIC=" + w.dlqTopic,
		"BILLING_KAFKA_GROUP_ID=" + w.group,
		"BILLING_DATABASE_URL=" + w.dbURL,
		"BILLING_PAYMENT_URL=" + w.simURL,
		"BILLING_HTTP_ADDR=127.0.0.1:0",
		"BILLING_KAFKA_SESSION_TIMEOUT=6s",
		"BILLING_KAFKA_REBALANCE_TIMEOUT=10s",
		"BILLING_DRAIN_TIMEOUT=5s",
		"BILLING_SHUTDOWN_TIMEOUT=20s",
		"BILLING_RETRY_BACKOFF=20ms",
		"BILLING_RETRY_BACKOFF_MAX=500ms",
		"BILLING_PAYMENT_TIMEOUT=2s",
		"BILLING_KAFKA_LAG_INTERVAL=1s",
	}, append(append(completerEnv, w.extraEnv...), extra...)...)
}

func (w *world) run(t *testing.T, args ...string) *harness.Process {
	t.Helper()
	return w.start(t, nil, args...)
}

func (w *world) start(t *testing.T, extraEnv []string, args ...string) *harness.Process {
	t.Helper()
	p, err := harness.Start(w.bin, args, w.env(extraEnv...), w.log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	return p
}

func (w *world) verify(t *testing.T, plan harness.Plan, first int64, orders int) harness.Report {
	t.Helper()
	return w.verifyWith(t, w.check(plan, first, orders))
}

// check is what verify checks; fault tests tighten it before verifyWith.
func (w *world) check(plan harness.Plan, first int64, orders int) harness.Check {
	return harness.Check{
		Brokers: w.brokers, Topic: w.topic, DLQTopic: w.dlqTopic, Group: w.group, DB: w.db, Sim: w.sim,
		Plan: plan, FirstOrderID: first, LastOrderID: first + int64(orders),
	}
}

func (w *world) verifyWith(t *testing.T, c harness.Check) harness.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := harness.Verify(ctx, c)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	return rep
}

func (w *world) waitDrained(t *testing.T, p *harness.Process, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- harness.WaitDrained(ctx, w.brokers, w.topic, w.group) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return
		case <-time.After(200 * time.Millisecond):
			if exited, err := p.Exited(); exited {
				t.Fatalf("consumer exited early: %v", err)
			}
		}
	}
}

// waitSettled waits, while p runs, up to pendingWait for the ledger claims
// left pending (by a killed attempt, say) to be settled by their
// redelivery or p's completer, as they are in production.
func (w *world) waitSettled(t *testing.T, p *harness.Process) {
	t.Helper()
	for start := time.Now(); time.Since(start) < pendingWait; time.Sleep(200 * time.Millisecond) {
		var n int
		qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := w.db.QueryRow(qctx, "SELECT count(*) FROM charge WHERE status = 'pending'").Scan(&n)
		cancel()
		if err != nil {
			t.Fatalf("count pending claims: %v", err)
		}
		if exited, _ := p.Exited(); n == 0 || exited {
			return
		}
	}
}

func mustPlan(t *testing.T, spec harness.Spec) harness.Plan {
	t.Helper()
	p, err := harness.Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func report(t *testing.T, rep harness.Report) {
	t.Helper()
	t.Logf("verify: %d expected charges, %d provider charges, %d ledger rows, DLQ %v, declined orders left blocked for an operator %v (their event deferred: %v)",
		rep.ExpectedCharges, rep.ProviderCharges, rep.LedgerRows, rep.DLQ, rep.BlockedDeclined, rep.HeldDeclined)
	if !rep.OK() {
		t.Fatalf("SPEC §9 violated:\n%s", strings.Join(rep.Problems, "\n"))
	}
}
