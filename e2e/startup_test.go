package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// A SIGTERM while the binary waits for its dependencies (a rollout during
// a Kafka or Postgres outage) is a clean stop: exit 0, not a pod in Error.
// The real process and signal, at several moments of the start, from its
// first log line on (before main has installed its handler, during the Go
// runtime's and the packages' initialisation, the signal's default action
// ends any Go program).
func TestSIGTERMBeforeReadyExitsZero(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; runs in make test")
	}
	bin := buildBinary(t)
	env := []string{
		"BILLING_KAFKA_BROKERS=" + kafkatest.FreePort(t),
		"BILLING_DATABASE_URL=postgres://u:p@" + kafkatest.FreePort(t) + "/x",
		"BILLING_PAYMENT_URL=http://" + kafkatest.FreePort(t),
		"BILLING_HTTP_ADDR=" + kafkatest.FreePort(t),
	}
	for _, after := range []time.Duration{0, 20 * time.Millisecond, 2 * time.Second} {
		var out logtest.Buffer
		p, err := harness.Start(bin, []string{"run"}, env, &out)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Kill)
		poll.Until(t, 30*time.Second, "the first log line", func() bool { return out.String() != "" })
		time.Sleep(after) // the moment of the signal is the point: nothing to poll
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("SIGTERM %s after the start: %v, want exit 0\n%s", after, err, out.String())
		}
		if s := out.String(); after >= time.Second && !strings.Contains(s, "stopped before ready") {
			t.Errorf("SIGTERM %s after the start: no line says it stopped before ready\n%s", after, s)
		}
	}
}
