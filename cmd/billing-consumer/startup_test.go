package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// A bad start is a wait, not a crash: with the database unreachable, run
// answers /healthz at once and /readyz 503 with the reason; with a
// database whose schema is behind, /readyz says to migrate; once migrated,
// run finishes its startup (the durability read and a dedup maintenance
// pass included) and joins the group.
func TestStartupWaitsUnready(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("billing-startup")
	kafkatest.CreateTopic(t, brokers, topic, 1)
	kafkatest.CreateTopic(t, brokers, topic+".dlq", 1)
	addr := kafkatest.FreePort(t)
	env := map[string]string{
		"BILLING_DATABASE_URL":        "postgres://u:p@127.0.0.1:1/x",
		"BILLING_KAFKA_BROKERS":       strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":         topic,
		"BILLING_KAFKA_DLQ_TOPIC":     topic + ".dlq",
		"BILLING_KAFKA_GROUP_ID":      kafkatest.UniqueName("billing-startup-group"),
		"BILLING_PAYMENT_URL":         "http://127.0.0.1:1",
		"BILLING_HTTP_ADDR":           addr,
		"BILLING_STARTUP_BACKOFF_MAX": "1s",
	}
	setEnv(t, runTimings, env)
	p := startRun(t)
	base := "http://" + addr
	readyz := func(want string) func() bool {
		return func() bool {
			code, body := httpGet(base + "/readyz")
			return code == http.StatusServiceUnavailable && strings.Contains(body, want)
		}
	}
	poll.Until(t, 10*time.Second, "/healthz 200 while the database is unreachable", func() bool {
		code, _ := httpGet(base + "/healthz")
		return code == http.StatusOK
	})
	poll.Until(t, 20*time.Second, "/readyz to say it waits for the database", readyz("waiting for the database"))
	select {
	case err := <-p.done:
		p.err, p.ended = err, true
		t.Fatalf("run returned while the database was unreachable: %v", err)
	default:
	}
	// A SIGTERM before ready is a clean stop (exit 0: a rollout during an
	// outage must not leave pods in Error), logged with the step it waited
	// for.
	if err := p.stop(t); err != nil {
		t.Errorf("run stopped during startup = %v, want a clean stop", err)
	}
	stopped := logsWithMsg(logLines(t, p.stderr.String()), "billing-consumer stopped before ready")
	if len(stopped) != 1 || !strings.Contains(fmt.Sprint(stopped[0]["reason"]), "waiting for the database") {
		t.Errorf("stop before ready logged %v, want one line naming the step it waited for", stopped)
	}

	// A reachable database that was never migrated.
	url := pgtest.NewDatabase(t)
	setEnv(t, env, map[string]string{"BILLING_DATABASE_URL": url})
	p = startRun(t)
	poll.Until(t, 20*time.Second, "/readyz to say the schema is behind", readyz("run billing-consumer migrate"))
	schema := 0
	for _, l := range logsWithMsg(logLines(t, p.stderr.String()), "not ready") {
		if l["step"] == "the schema" {
			schema++
		}
	}
	if schema != 1 {
		t.Errorf("the schema step logged %d times, want one line for the state\n%s", schema, p.stderr.String())
	}
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 60*time.Second, "/readyz 200 after migrate", func() bool {
		code, _ := httpGet(base + "/readyz")
		return code == http.StatusOK
	})
	// What the role sees of the durability, logged and exported once: the
	// scratch cluster has no standby.
	durable := logsWithMsg(logLines(t, p.stderr.String()), "database durability")
	if len(durable) != 1 || durable[0]["level"] != "WARN" || durable[0]["synchronous_commit"] != "on" || durable[0]["sync_standbys"] != "0" {
		t.Errorf("durability logged %v, want one warning: synchronous_commit on, 0 sync standbys", durable)
	}
	if _, body := httpGet(base + "/metrics"); !strings.Contains(body, "\nbilling_postgres_sync_standbys 0\n") ||
		!strings.Contains(body, `billing_postgres_synchronous_commit{setting="on"} 1`) {
		t.Errorf("/metrics lacks billing_postgres_sync_standbys 0 or billing_postgres_synchronous_commit{setting=\"on\"} 1")
	}
	var parts int
	if err := pgtest.Open(t, url).QueryRow(t.Context(), `SELECT count(*) FROM pg_inherits WHERE inhparent = 'processed_event'::regclass`).Scan(&parts); err != nil || parts < 3 {
		t.Errorf("processed_event partitions at ready = %d (%v), want today and the days ahead", parts, err)
	}
	if err := p.stop(t); err != nil {
		t.Errorf("run after a clean start: %v", err)
	}
}

// pprof is off by default and, when BILLING_PPROF_ADDR is set, served on
// that address only, never on the metrics port. It answers while the
// service still waits for its dependencies.
func TestPprofOptIn(t *testing.T) {
	addr, pprofAddr := kafkatest.FreePort(t), kafkatest.FreePort(t)
	env := map[string]string{
		"BILLING_DATABASE_URL":  "postgres://u:p@127.0.0.1:1/x",
		"BILLING_KAFKA_BROKERS": kafkatest.FreePort(t),
		"BILLING_PAYMENT_URL":   "http://127.0.0.1:1",
		"BILLING_HTTP_ADDR":     addr,
	}
	setEnv(t, validEnv, env)
	p := startRun(t)
	poll.Until(t, 10*time.Second, "/healthz", func() bool { code, _ := httpGet("http://" + addr + "/healthz"); return code == http.StatusOK })
	if code, _ := httpGet("http://" + addr + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof on the metrics port by default: %d, want 404", code)
	}
	_ = p.stop(t)

	setEnv(t, validEnv, env, map[string]string{"BILLING_PPROF_ADDR": pprofAddr})
	p = startRun(t)
	poll.Until(t, 10*time.Second, "pprof on BILLING_PPROF_ADDR", func() bool {
		code, body := httpGet("http://" + pprofAddr + "/debug/pprof/")
		return code == http.StatusOK && strings.Contains(body, "goroutine")
	})
	if code, _ := httpGet("http://" + addr + "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof on the metrics port with BILLING_PPROF_ADDR set: %d, want 404", code)
	}
	_ = p.stop(t)
}
