package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// provider is a payment provider that charges every request and records
// the Idempotency-Key and Authorization headers.
type provider struct {
	mu    sync.Mutex
	keys  []string
	auths []string
}

func (p *provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/payments/charge" {
		http.NotFound(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	p.mu.Lock()
	p.keys = append(p.keys, r.Header.Get("Idempotency-Key"))
	p.auths = append(p.auths, r.Header.Get("Authorization"))
	n := len(p.keys)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"charge_id":"ch_%d"}`, n)
}

func (p *provider) requests() ([]string, []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.keys...), append([]string(nil), p.auths...)
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// `billing-consumer run` end to end: it serves /healthz, /readyz and
// /metrics, charges a valid event once, dead-letters an invalid one,
// commits both, and stops cleanly when its context ends (SIGTERM).
func TestRunEndToEnd(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("billing-e2e")
	dlqTopic := topic + ".dlq"
	group := kafkatest.UniqueName("billing-e2e-group")
	kafkatest.CreateTopic(t, brokers, topic, 1)
	kafkatest.CreateTopic(t, brokers, dlqTopic, 1)
	prov := &provider{}
	srv := httptest.NewServer(prov)
	t.Cleanup(srv.Close)

	setEnv(t, runTimings, map[string]string{
		"BILLING_DATABASE_URL":       dbURL,
		"BILLING_KAFKA_BROKERS":      strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":        topic,
		"BILLING_KAFKA_DLQ_TOPIC":    dlqTopic,
		"BILLING_KAFKA_GROUP_ID":     group,
		"BILLING_PAYMENT_URL":        srv.URL,
		"BILLING_PAYMENT_TOKEN":      "tok-S3cr3t",
		"BILLING_HTTP_ADDR":          "127.0.0.1:0",
		"BILLING_KAFKA_LAG_INTERVAL": "1s",
		"BILLING_RETRY_BACKOFF":      "10ms",
		"BILLING_RETRY_BACKOFF_MAX":  "50ms",
	})
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	svc := startRun(t)
	ctx, stdout, stderr := svc.ctx, svc.stdout, svc.stderr
	addr := svc.httpAddr(t)
	base := "http://" + addr
	if code, body := httpGet(base + "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d %q", code, body)
	}
	poll.Until(t, 60*time.Second, "/readyz", func() bool {
		code, _ := httpGet(base + "/readyz")
		return code == http.StatusOK
	})

	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	valid := fmt.Appendf(nil, `{"event_id":%q,"event_type":"order.confirmed.v1","occurred_at":%q,"order_id":1001,"customer_id":42,"total_amount":"99.95"}`,
		id.String(), time.Now().UTC().Format(time.RFC3339))
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: &kafka.Transport{}, BatchTimeout: time.Millisecond}
	t.Cleanup(func() { _ = w.Close() })
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	// The same event twice, and garbage.
	if err := w.WriteMessages(wctx,
		kafka.Message{Key: []byte("1001"), Value: valid},
		kafka.Message{Key: []byte("1001"), Value: valid},
		kafka.Message{Key: []byte("x"), Value: []byte("garbage")},
	); err != nil {
		t.Fatalf("produce: %v", err)
	}

	pool := pgtest.Open(t, dbURL)
	poll.Until(t, 60*time.Second, "the charge row", func() bool {
		var n int
		_ = pool.QueryRow(context.Background(), "SELECT count(*) FROM charge WHERE order_id = 1001 AND event_id = $1", id).Scan(&n)
		return n == 1
	})
	metric := func(line string) bool {
		_, body := httpGet(base + "/metrics")
		return strings.Contains(body, line+"\n")
	}
	want := fmt.Sprintf(`billing_kafka_committed_offset{group=%q,partition="0",topic=%q} 3`, group, topic)
	poll.Until(t, 60*time.Second, want, func() bool { return metric(want) })
	for _, line := range []string{
		`billing_events_total{result="charged"} 1`,
		`billing_events_total{result="duplicate"} 1`,
		`billing_events_total{result="dlq"} 1`,
		`billing_dlq_total{reason="invalid"} 1`,
		`billing_position_writes_failed_total 0`,
	} {
		if !metric(line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// The position was written before the commit the metric shows.
	var position int64
	if err := pool.QueryRow(context.Background(), `SELECT next_offset FROM consumer_position
WHERE consumer_group = $1 AND topic = $2 AND partition = 0`, group, topic).Scan(&position); err != nil || position != 3 {
		t.Errorf("database position of partition 0: %d, %v; want 3, the committed offset", position, err)
	}

	keys, auths := prov.requests()
	if len(keys) != 1 || keys[0] != id.String() || auths[0] != "Bearer tok-S3cr3t" {
		t.Errorf("provider saw keys %q auth %q, want one charge with key %s", keys, auths, id)
	}

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: dlqTopic, Partition: 0,
		Dialer: &kafka.Dialer{Timeout: 10 * time.Second}, MaxWait: 100 * time.Millisecond})
	t.Cleanup(func() { _ = r.Close() })
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	m, err := r.ReadMessage(rctx)
	if err != nil {
		t.Fatalf("read DLQ: %v", err)
	}
	if string(m.Value) != "garbage" {
		t.Errorf("DLQ value %q", m.Value)
	}
	for _, h := range m.Headers {
		if h.Key == dlq.HeaderReason && string(h.Value) != "invalid" {
			t.Errorf("dlq-reason %q", h.Value)
		}
		if h.Key == dlq.HeaderConsumerGroup && string(h.Value) != group {
			t.Errorf("dlq-consumer-group %q", h.Value)
		}
	}

	if err := svc.stop(t); err != nil {
		t.Fatalf("run after cancel: %v", err)
	}
	logs := stderr.String()
	if len(logsWithMsg(logLines(t, logs), "billing-consumer stopped cleanly")) != 1 {
		t.Errorf("no clean stop logged:\n%s", logs)
	}
	if strings.Contains(logs, "tok-S3cr3t") {
		t.Errorf("logs reveal the token:\n%s", logs)
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "99.95") && strings.Contains(l, "customer") {
			t.Errorf("log line has an amount with customer identity: %s", l)
		}
	}
	if stdout.String() != "" {
		t.Errorf("run wrote to stdout: %q", stdout.String())
	}
}
