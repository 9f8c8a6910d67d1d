package e2e

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

// replaceFile writes content to path as the kubelet updates a mounted
// secret: a new file renamed over the old one.
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// The provider rotates its token while the service runs: its requests are
// refused (401) until BILLING_PAYMENT_TOKEN_FILE holds the new token; then,
// without a restart, every order is charged once.
func TestPaymentTokenFileRotatedMidRun(t *testing.T) {
	w := newWorld(t, 1, paysim.Faults{})
	var want atomic.Value
	want.Store("Bearer tok-one")
	var refused atomic.Int64
	gate := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != want.Load().(string) {
			refused.Add(1)
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.sim.ServeHTTP(rw, r)
	}))
	t.Cleanup(gate.Close)
	w.simURL = gate.URL
	tokenFile := filepath.Join(t.TempDir(), "token")
	replaceFile(t, tokenFile, "tok-one\n")
	addr := kafkatest.FreePort(t)
	p := w.start(t, []string{"BILLING_HTTP_ADDR=" + addr, "BILLING_PAYMENT_TOKEN_FILE=" + tokenFile}, "run")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := p.WaitReady(ctx, addr); err != nil {
		t.Fatal(err)
	}
	produce := func(first int64, n int) {
		var recs []kafka.Message
		for i := range n {
			r, _ := orderRecord(first+int64(i), "5.00")
			recs = append(recs, r)
		}
		if err := harness.Produce(ctx, w.brokers, w.topic, recs); err != nil {
			t.Fatal(err)
		}
	}
	const first = 9300001
	produce(first, 5)
	pollFor(t, time.Minute, "the first orders charged with the first token", func() bool { return w.sim.ChargesTaken() == 5 })

	want.Store("Bearer tok-two") // rotated at the provider
	produce(first+5, 5)
	pollFor(t, time.Minute, "the provider refusing the old token", func() bool { return refused.Load() > 0 })
	replaceFile(t, tokenFile, "tok-two\n")
	pollFor(t, time.Minute, "every order charged after the token file changed", func() bool { return w.sim.ChargesTaken() == 10 })
	for i := range int64(10) {
		if n := w.sim.ChargesFor(first + i); n != 1 {
			t.Fatalf("order %d charged %d times", first+i, n)
		}
	}
	if exited, err := p.Exited(); exited {
		t.Fatalf("the service restarted or exited: %v", err)
	}
	b, _ := os.ReadFile(w.logPath)
	if strings.Contains(string(b), "tok-one") || strings.Contains(string(b), "tok-two") {
		t.Fatal("a token reached the log")
	}
	if !strings.Contains(string(b), "payment token file changed") {
		t.Fatal("no log line says the token file changed")
	}
	t.Logf("%d requests refused with the old token before the file changed", refused.Load())
	if err := p.Stop(30 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
}
