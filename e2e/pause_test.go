package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/harness"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/paysim"
)

func readyz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Two replicas, two partitions: each exports billing_kafka_partition_owned
// = 1 for the partition it owns (one each, together both). `pause` reaches
// both within seconds (billing_paused 1, /readyz ready and saying who
// paused); records produced meanwhile are not charged, also across a
// restart of a replica; `resume` charges them all, once.
func TestPauseReachesEveryReplicaAndSurvivesRestart(t *testing.T) {
	w := newWorld(t, 2, paysim.Faults{})
	addrs := []string{kafkatest.FreePort(t), kafkatest.FreePort(t)}
	procs := make([]*harness.Process, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i, a := range addrs {
		procs[i] = w.start(t, []string{"BILLING_HTTP_ADDR=" + a}, "run")
	}
	for i, a := range addrs {
		if err := procs[i].WaitReady(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	owned := func(a string) map[string]float64 {
		out := map[string]float64{}
		for _, p := range []string{"0", "1"} {
			if v, ok := gauge(t, a, "billing_kafka_partition_owned", map[string]string{"topic": w.topic, "partition": p}); ok {
				out[p] = v
			}
		}
		return out
	}
	pollFor(t, time.Minute, "each replica owning one partition, both owned", func() bool {
		a, b := owned(addrs[0]), owned(addrs[1])
		return a["0"]+a["1"] == 1 && b["0"]+b["1"] == 1 && a["0"]+b["0"] == 1 && a["1"]+b["1"] == 1
	})
	t.Logf("owned: replica 0 %v, replica 1 %v", owned(addrs[0]), owned(addrs[1]))

	out, err := w.command(t, "pause", "--reason", "DRILL-2: provider maintenance", "--operator", "drill-operator")
	if err != nil {
		t.Fatalf("pause: %v\n%s", err, out)
	}
	t.Logf("pause:\n%s", out)
	for _, a := range addrs {
		pollFor(t, 15*time.Second, "billing_paused 1 on "+a, func() bool {
			v, ok := gauge(t, a, "billing_paused", nil)
			return ok && v == 1
		})
		code, body := readyz(t, a)
		if code != http.StatusOK || !strings.Contains(body, "paused by drill-operator") || !strings.Contains(body, "DRILL-2") {
			t.Fatalf("/readyz while paused: %d %q; want ready, saying who paused and why", code, body)
		}
		t.Logf("/readyz of %s while paused: %q", a, body)
	}
	const first = 9200001
	var recs []kafka.Message
	for i := range 20 {
		r, _ := orderRecord(first+int64(i), "10.00")
		recs = append(recs, r)
	}
	if err := harness.Produce(ctx, w.brokers, w.topic, recs); err != nil {
		t.Fatal(err)
	}
	// A restart during the pause: the new process reads the pause before
	// it joins the group.
	if err := procs[1].Stop(30 * time.Second); err != nil {
		t.Fatalf("stop replica 1: %v", err)
	}
	procs[1] = w.start(t, []string{"BILLING_HTTP_ADDR=" + addrs[1]}, "run")
	if err := procs[1].WaitReady(ctx, addrs[1]); err != nil {
		t.Fatal(err)
	}
	pollFor(t, time.Minute, "the restarted replica owning one partition, the other replica the other", func() bool {
		a, b := owned(addrs[0]), owned(addrs[1])
		return a["0"]+a["1"] == 1 && b["0"]+b["1"] == 1 && a["0"]+b["0"] == 1 && a["1"]+b["1"] == 1
	})
	if v, _ := gauge(t, addrs[1], "billing_paused", nil); v != 1 {
		t.Fatalf("billing_paused on the restarted replica = %v; want 1", v)
	}
	time.Sleep(3 * time.Second) // no event to poll for: nothing may be charged
	if n := w.sim.ChargesTaken(); n != 0 {
		t.Fatalf("%d charges taken while paused", n)
	}
	lags, err := harness.Lag(ctx, w.brokers, w.topic, w.group)
	if err != nil {
		t.Fatal(err)
	}
	var lag int64
	for _, l := range lags {
		lag += l.Lag
	}
	if lag != int64(len(recs)) {
		t.Fatalf("lag while paused = %d; want all %d records", lag, len(recs))
	}

	out, err = w.command(t, "resume", "--operator", "drill-operator")
	if err != nil || !strings.Contains(out, "billing resumed") {
		t.Fatalf("resume: %v\n%s", err, out)
	}
	t.Logf("resume:\n%s", out)
	w.waitDrained(t, procs[0], 2*time.Minute)
	for i := range recs {
		if n := w.sim.ChargesFor(first + int64(i)); n != 1 {
			t.Fatalf("order %s charged %d times; want once", strconv.Itoa(first+i), n)
		}
	}
	for _, a := range addrs {
		pollFor(t, 15*time.Second, "billing_paused 0 on "+a, func() bool {
			v, ok := gauge(t, a, "billing_paused", nil)
			return ok && v == 0
		})
	}
	for _, p := range procs {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("graceful stop: %v", err)
		}
	}
}
