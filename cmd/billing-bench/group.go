package main

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// waitGroup waits until the broker describes the group as Stable with
// exactly members members, each assigned at least one partition: the end
// of a rebalance as the coordinator sees it. A replica's /readyz is not
// enough: it may say ready before its first assignment, and a stage
// timed from it would charge that rebalance to the next stage.
func waitGroup(ctx context.Context, brokers []string, group string, members int, within time.Duration) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: tr}
	deadline := time.Now().Add(within)
	last := "no answer"
	for {
		res, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		switch {
		case err != nil:
			last = err.Error()
		case len(res.Groups) != 1 || res.Groups[0].Error != nil:
			last = fmt.Sprintf("%+v", res.Groups)
		default:
			g := res.Groups[0]
			if groupSettled(g, members) {
				return nil
			}
			last = fmt.Sprintf("state %s, %d members", g.GroupState, len(g.Members))
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

// groupSettled reports whether g is Stable with exactly members members,
// each assigned at least one partition.
func groupSettled(g kafka.DescribeGroupsResponseGroup, members int) bool {
	if g.GroupState != "Stable" || len(g.Members) != members {
		return false
	}
	for _, m := range g.Members {
		n := 0
		for _, t := range m.MemberAssignments.Topics {
			n += len(t.Partitions)
		}
		if n == 0 {
			return false
		}
	}
	return true
}
