package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// GroupAssignment is how a consumer group has divided a topic, as the
// group coordinator reports it.
type GroupAssignment struct {
	// State is the group's state: Stable, PreparingRebalance,
	// CompletingRebalance, Empty or Dead. Assignments mean something only
	// when it is Stable.
	State string
	// Members is the number of members of the group; Idle how many of
	// them are assigned no partition of the topic.
	Members, Idle int
	// Unassigned are the partitions of the topic no member is assigned,
	// in order.
	Unassigned []int
}

// AssignmentOf asks the brokers how group has assigned the partitions of
// topic (Metadata and DescribeGroups). Like GroupLag it reads broker
// state only, so it can tell a member that owns no partition whether that
// is because every partition is taken by another member (more members
// than partitions: nothing to do) or because the group left some
// partitions to nobody (a stuck rebalance: nobody consumes them).
func AssignmentOf(ctx context.Context, client *kafka.Client, topic, group string) (GroupAssignment, error) {
	ids, err := kafkagroup.Partitions(ctx, client, topic)
	if err != nil {
		return GroupAssignment{}, err
	}
	res, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return GroupAssignment{}, fmt.Errorf("describe group %s: %w", group, err)
	}
	if len(res.Groups) != 1 || res.Groups[0].Error != nil {
		var gerr error = errors.New("not found")
		if len(res.Groups) == 1 {
			gerr = res.Groups[0].Error
		}
		return GroupAssignment{}, fmt.Errorf("describe group %s: %w", group, gerr)
	}
	return Assignment(res.Groups[0], topic, ids), nil
}

// Assignment is how the group g, as DescribeGroups described it, has
// assigned the partitions ids of topic.
func Assignment(g kafka.DescribeGroupsResponseGroup, topic string, ids []int) GroupAssignment {
	out := GroupAssignment{State: g.GroupState, Members: len(g.Members)}
	taken := map[int]bool{}
	for _, m := range g.Members {
		n := 0
		for _, t := range m.MemberAssignments.Topics {
			if t.Topic == topic {
				for _, p := range t.Partitions {
					taken[p] = true
				}
				n += len(t.Partitions)
			}
		}
		if n == 0 {
			out.Idle++
		}
	}
	for _, id := range ids {
		if !taken[id] {
			out.Unassigned = append(out.Unassigned, id)
		}
	}
	slices.Sort(out.Unassigned)
	return out
}
