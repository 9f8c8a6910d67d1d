package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
)

// waitGroup waits until the broker describes the group as Stable with
// exactly members members, each assigned at least one partition of topic:
// the end of a rebalance as the coordinator sees it. A replica's /readyz
// is not enough: it may say ready before its first assignment, and a stage
// timed from it would charge that rebalance to the next stage.
func waitGroup(ctx context.Context, brokers []string, topic, group string, members int, within time.Duration) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: tr}
	deadline := time.Now().Add(within)
	last := "no answer"
	for {
		a, err := consumer.AssignmentOf(ctx, client, topic, group)
		switch {
		case err != nil:
			last = err.Error()
		case groupSettled(a, members):
			return nil
		default:
			last = fmt.Sprintf("state %s, %d members, %d of them without partitions", a.State, a.Members, a.Idle)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s not stable with %d assigned members within %v (%s)", group, members, within, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// groupSettled reports whether a is Stable with exactly members members,
// each assigned at least one partition.
func groupSettled(a consumer.GroupAssignment, members int) bool {
	return a.State == "Stable" && a.Members == members && a.Idle == 0
}
