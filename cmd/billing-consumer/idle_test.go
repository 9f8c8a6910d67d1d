package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// rogueBalancer is a "range" balancer that gives the partitions in keep to
// the member that announces itself with the user data "rogue", the
// partitions in others to every other member, and nothing else: as the
// group's leader, it leaves the rest to nobody, the state a stuck
// rebalance can leave a group in.
type rogueBalancer struct{ keep, others []int }

func (rogueBalancer) ProtocolName() string      { return "range" }
func (rogueBalancer) UserData() ([]byte, error) { return []byte("rogue"), nil }
func (b rogueBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	out := kafka.GroupMemberAssignments{}
	for _, m := range members {
		out[m.ID] = map[string][]int{}
		if len(partitions) == 0 {
			continue
		}
		if bytes.Equal(m.UserData, []byte("rogue")) {
			out[m.ID][partitions[0].Topic] = b.keep
		} else if len(b.others) > 0 {
			out[m.ID][partitions[0].Topic] = b.others
		}
	}
	return out
}

// startRogueLeader joins group on topic first, so that it leads every
// generation, and stays a member (idle on its partitions) until the test
// ends. It returns once it has its first generation.
func startRogueLeader(t *testing.T, brokers []string, topic, group string, b rogueBalancer) {
	t.Helper()
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: group, Brokers: brokers, Topics: []string{topic},
		GroupBalancers: []kafka.GroupBalancer{b},
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 10 * time.Second, HeartbeatInterval: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for once := false; ; {
			gen, err := cg.Next(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			gen.Start(func(gctx context.Context) { <-gctx.Done() })
			if !once {
				once = true
				close(first)
			}
		}
	}()
	t.Cleanup(func() { cancel(); _ = cg.Close(); <-stopped })
	select {
	case <-first:
	case <-time.After(60 * time.Second):
		t.Fatal("the rogue leader got no generation within 60s")
	}
}

// startIdleService runs the service on a fresh 3-partition topic whose
// group is led by the rogue leader b, and returns the base URL of its ops
// endpoints and the service; produce, when set, writes records to the
// topic before the service starts.
func startIdleService(t *testing.T, b rogueBalancer, produce ...func(brokers []string, topic string)) (string, *inProcess) {
	t.Helper()
	dbURL := pgtest.NewDatabase(t)
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("billing-idle")
	group := kafkatest.UniqueName("billing-idle-group")
	kafkatest.CreateTopic(t, brokers, topic, 3)
	kafkatest.CreateTopic(t, brokers, topic+".dlq", 1)
	srv := httptest.NewServer(&provider{})
	t.Cleanup(srv.Close)
	setEnv(t, runTimings, map[string]string{
		"BILLING_DATABASE_URL":       dbURL,
		"BILLING_KAFKA_BROKERS":      strings.Join(brokers, ","),
		"BILLING_KAFKA_TOPIC":        topic,
		"BILLING_KAFKA_DLQ_TOPIC":    topic + ".dlq",
		"BILLING_KAFKA_GROUP_ID":     group,
		"BILLING_PAYMENT_URL":        srv.URL,
		"BILLING_HTTP_ADDR":          "127.0.0.1:0",
		"BILLING_KAFKA_LAG_INTERVAL": "1s",
	})
	if _, err := runCmd(t, "migrate"); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	for _, p := range produce {
		p(brokers, topic)
	}
	startRogueLeader(t, brokers, topic, group, b)
	svc := startRun(t)
	return "http://" + svc.httpAddr(t), svc
}

// TestReadyzFalseWhileIdleAndPartitionsUnassigned: an instance that owns
// no partition while the group leaves partitions to nobody is not ready,
// and says why.
func TestReadyzFalseWhileIdleAndPartitionsUnassigned(t *testing.T) {
	base, svc := startIdleService(t, rogueBalancer{keep: []int{0}})
	last := ""
	poll.Until(t, 60*time.Second, "/readyz not ready, naming the unassigned partitions", func() bool {
		code, body := httpGet(base + "/readyz")
		if now := fmt.Sprintf("%d %q", code, body); now != last {
			t.Logf("/readyz: %s", now)
			last = now
		}
		return code == http.StatusServiceUnavailable && strings.Contains(body, "partitions [1 2]")
	})
	if !strings.Contains(svc.stderr.String(), "the group leaves partitions unassigned") {
		t.Errorf("no log line about the unassigned partitions:\n%s", svc.stderr.String())
	}
}

// TestReadyzTrueWhileIdleAndEveryPartitionTaken: with more members than
// partitions, an instance owning none is a standby, and ready.
func TestReadyzTrueWhileIdleAndEveryPartitionTaken(t *testing.T) {
	base, svc := startIdleService(t, rogueBalancer{keep: []int{0, 1, 2}})
	poll.Until(t, 60*time.Second, "the idle check's verdict", func() bool {
		return strings.Contains(svc.stderr.String(), "every partition is assigned to another member")
	})
	if code, body := httpGet(base + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %q, want 200: every partition is taken", code, body)
	}
}

// TestUnownedPartitionsWithLag: while the group leaves partitions with
// lag to nobody (a rogue leader gives this instance partition 0 only),
// billing_kafka_partitions_unowned and billing_kafka_partitions_unowned_lag
// say how many and how much, and /readyz, still ready (this instance
// consumes what it owns), names them with their lag.
func TestUnownedPartitionsWithLag(t *testing.T) {
	// Two records to partition 1, three to partition 2; nobody consumes
	// them, so they stay lag.
	produce := func(brokers []string, topic string) {
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: &kafka.Transport{},
			Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return int(m.Key[0] - '0') })}
		defer w.Close()
		msgs := []kafka.Message{{Key: []byte("1")}, {Key: []byte("1")}, {Key: []byte("2")}, {Key: []byte("2")}, {Key: []byte("2")}}
		for i := range msgs {
			msgs[i].Value = []byte("not an event")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	base, svc := startIdleService(t, rogueBalancer{others: []int{0}}, produce)
	want := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^billing_kafka_partitions_unowned\{group="billing-idle-group[^"]*",topic="billing-idle[^"]*"\} 2$`),
		regexp.MustCompile(`(?m)^billing_kafka_partitions_unowned_lag\{group="billing-idle-group[^"]*",topic="billing-idle[^"]*"\} 5$`),
	}
	last := ""
	poll.Until(t, 60*time.Second, "/readyz ready, naming partitions 1 and 2 with their lag, and the gauges", func() bool {
		code, body := httpGet(base + "/readyz")
		_, metrics := httpGet(base + "/metrics")
		if now := fmt.Sprintf("%d %q", code, body); now != last {
			t.Logf("/readyz: %s", now)
			last = now
		}
		for _, w := range want {
			if !w.MatchString(metrics) {
				return false
			}
		}
		return code == http.StatusOK && strings.HasPrefix(body, "ready\n") &&
			strings.Contains(body, ": 1 (lag 2), 2 (lag 3)")
	})
	if !strings.Contains(svc.stderr.String(), "partitions with lag are owned by no member of the group") {
		t.Errorf("no log line about the unowned partitions:\n%s", svc.stderr.String())
	}
}
