package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/pgtest"
	"github.com/billing-consumer/billing-consumer/internal/poll"
)

// rogueBalancer is a "range" balancer that gives the partitions in keep to
// the member that announces itself with the user data "rogue" and nothing
// to anybody else: as the group's leader, it leaves the other partitions
// to nobody, the state a stuck rebalance can leave a group in.
type rogueBalancer struct{ keep []int }

func (rogueBalancer) ProtocolName() string      { return "range" }
func (rogueBalancer) UserData() ([]byte, error) { return []byte("rogue"), nil }
func (b rogueBalancer) AssignGroups(members []kafka.GroupMember, partitions []kafka.Partition) kafka.GroupMemberAssignments {
	out := kafka.GroupMemberAssignments{}
	for _, m := range members {
		out[m.ID] = map[string][]int{}
		if bytes.Equal(m.UserData, []byte("rogue")) && len(partitions) > 0 {
			out[m.ID][partitions[0].Topic] = b.keep
		}
	}
	return out
}

// startRogueLeader joins group on topic first, so that it leads every
// generation, and stays a member (idle on its partitions) until the test
// ends. It returns once it has its first generation.
func startRogueLeader(t *testing.T, brokers []string, topic, group string, keep []int) {
	t.Helper()
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: group, Brokers: brokers, Topics: []string{topic},
		GroupBalancers: []kafka.GroupBalancer{rogueBalancer{keep: keep}},
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
// group is led by a rogue leader keeping the partitions keep, and returns
// the base URL of its ops endpoints and the service.
func startIdleService(t *testing.T, keep []int) (string, *inProcess) {
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
	startRogueLeader(t, brokers, topic, group, keep)
	svc := startRun(t)
	return "http://" + svc.httpAddr(t), svc
}

// TestReadyzFalseWhileIdleAndPartitionsUnassigned: an instance that owns
// no partition while the group leaves partitions to nobody is not ready,
// and says why.
func TestReadyzFalseWhileIdleAndPartitionsUnassigned(t *testing.T) {
	base, svc := startIdleService(t, []int{0})
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
	base, svc := startIdleService(t, []int{0, 1, 2})
	poll.Until(t, 60*time.Second, "the idle check's verdict", func() bool {
		return strings.Contains(svc.stderr.String(), "every partition is assigned to another member")
	})
	if code, body := httpGet(base + "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d %q, want 200: every partition is taken", code, body)
	}
}
