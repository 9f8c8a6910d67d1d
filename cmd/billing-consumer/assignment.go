package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
)

// groupView is what the group's coordinator said, in one DescribeGroups
// reading, while this instance was a member of generation gen (gen is -1
// when it was between generations), with the lag of each partition from
// the latest lag query.
type groupView struct {
	gen        int32
	partitions int // how many partitions generation gen gave this instance
	consumer.GroupAssignment
	lag map[int]int64 // nil before the first lag query succeeded
}

// stranded reports the partitions a Stable group leaves to nobody while
// this instance idles in the same generation: then nobody consumes them,
// and /readyz says so instead of "ready". An instance with no partition in
// a group whose every partition is taken (more replicas than partitions)
// is not stranded: it is a hot standby.
func (v *groupView) stranded(g consumer.Generation) []int {
	if v == nil || v.gen != g.ID || g.Partitions > 0 || v.State != "Stable" {
		return nil
	}
	return v.Unassigned
}

// lagging returns the partitions no member owns that have lag, and the
// sum of their lag. While the group rebalances (any state but Stable) the
// coordinator reports no assignment: every partition counts as unowned
// then, which is true of kafka-go's eager protocol (nobody consumes during
// a rebalance) and is why the alert waits 5 minutes.
func (v *groupView) lagging() (ids []int, lag []int64, total int64) {
	if v == nil {
		return nil, nil, 0
	}
	for _, p := range v.Unassigned {
		if l := v.lag[p]; l > 0 {
			ids, lag, total = append(ids, p), append(lag, l), total+l
		}
	}
	return ids, lag, total
}

// rejoinEvery bounds how often a member rejoins a stable group that leaves
// partitions to nobody (see needsRejoin): a leader that keeps doing so
// (not one of ours) must not make it churn.
const rejoinEvery = time.Minute

// needsRejoin reports whether prev and v, two consecutive readings, both
// found this member in the same Stable generation with partitions of the
// topic assigned to nobody. The group's leader missed them: kafka-go's
// partition watcher takes its baseline count when a generation starts, so
// partitions added between the leader's metadata read and that baseline go
// unnoticed until the next rebalance. Only the leader's JoinGroup
// rebalances a stable group, and no member knows who leads, so every
// member rejoins (consumer.Rejoin).
func needsRejoin(prev, v *groupView) bool {
	stranded := func(x *groupView) bool { return x.gen >= 0 && x.State == "Stable" && len(x.Unassigned) > 0 }
	return prev != nil && stranded(prev) && stranded(v) && prev.gen == v.gen
}

// groupWatcher asks the brokers, every BILLING_KAFKA_LAG_INTERVAL (its
// loop, runOnce), how the group has
// assigned the topic (consumer.AssignmentOf: Metadata and DescribeGroups,
// the broker's view, right whatever this instance owns), and
//   - exports billing_kafka_partitions_unowned and
//     billing_kafka_partitions_unowned_lag (through report);
//   - keeps the reading for /readyz: an instance that idles while a Stable
//     group leaves partitions to nobody is not ready (notReady), and every
//     answer names the unowned partitions that have lag (detail);
//   - rejoins the group when two readings in a row find a stable
//     generation that leaves partitions to nobody (needsRejoin), at most
//     once per rejoinEvery;
//   - logs each change of the idle verdict, and each change of the set of
//     unowned partitions with lag.
//
// The lag of each partition comes from the lag loop (observeLag), not from
// a second query of the same offsets.
type groupWatcher struct {
	client   *kafka.Client
	topic    string
	group    string
	consumer interface {
		Generation() (consumer.Generation, bool)
		Rejoin()
	}
	logger *slog.Logger
	// report receives each reading's unowned partition count and the sum
	// of their lag.
	report func(unowned int, lag int64)

	last atomic.Pointer[groupView]
	lags atomic.Pointer[map[int]int64]

	// What runOnce remembers between passes (the loop's goroutine only):
	// the idle verdict and the lagging partitions last logged, the
	// previous reading, and the time of the last rejoin.
	verdict, lagging string
	prev             *groupView
	rejoined         time.Time
}

// observeLag keeps the partitions' lag of a successful lag query, for the
// next reading; a failed query forgets it (an unknown lag is not reported
// as lag).
func (w *groupWatcher) observeLag(lags []consumer.PartitionLag, err error) {
	if err != nil {
		w.lags.Store(nil)
		return
	}
	m := make(map[int]int64, len(lags))
	for _, l := range lags {
		m[l.Partition] = l.Lag
	}
	w.lags.Store(&m)
}

// runOnce is the group assignment loop's pass: one reading, exported,
// kept, logged on change, and a rejoin when it is due. Its error is the
// reading's, which the loop logs. One goroutine at a time.
func (w *groupWatcher) runOnce(ctx context.Context) error {
	a, err := consumer.AssignmentOf(ctx, w.client, w.topic, w.group)
	if err != nil {
		return err
	}
	v := &groupView{gen: -1, GroupAssignment: a}
	if g, member := w.consumer.Generation(); member {
		v.gen, v.partitions = g.ID, g.Partitions
	}
	if m := w.lags.Load(); m != nil {
		v.lag = *m
	}
	w.last.Store(v)
	ids, _, total := v.lagging()
	w.report(len(a.Unassigned), total)
	if now := fmt.Sprint(ids); now != w.lagging {
		w.lagging = now
		if len(ids) > 0 {
			w.logger.Warn("partitions with lag are owned by no member of the group", "group", w.group,
				"state", a.State, "partitions", ids, "lag", total)
		} else {
			w.logger.Info("every partition with lag is owned by a member of the group", "group", w.group, "state", a.State)
		}
	}
	w.verdict = w.logIdle(v, w.verdict)
	if needsRejoin(w.prev, v) && time.Since(w.rejoined) >= rejoinEvery {
		w.rejoined = time.Now()
		w.logger.Warn("the group is stable but leaves partitions to nobody: rejoining, so that the leader assigns them",
			"group", w.group, "generation", v.gen, "unassigned", v.Unassigned)
		w.consumer.Rejoin()
	}
	w.prev = v
	return nil
}

// logIdle logs a change of the verdict on an instance owning no
// partition (standby or stranded) and returns the verdict now.
func (w *groupWatcher) logIdle(v *groupView, verdict string) string {
	now := ""
	if v.gen >= 0 && v.partitions == 0 {
		now = "standby"
		if len(v.stranded(consumer.Generation{ID: v.gen})) > 0 {
			now = "stranded"
		}
	}
	if now == verdict {
		return now
	}
	switch now {
	case "stranded":
		w.logger.Error("this instance owns no partition while the group leaves partitions unassigned: nobody consumes them",
			"group", w.group, "generation", v.gen, "unassigned", v.Unassigned, "members", v.Members)
	case "standby":
		w.logger.Info("this instance owns no partition: every partition is assigned to another member",
			"group", w.group, "generation", v.gen, "state", v.State, "members", v.Members)
	}
	return now
}

// notReady is readyCheck's verdict: an error when this instance idles
// while partitions are stranded.
func (w *groupWatcher) notReady() error {
	g, member := w.consumer.Generation()
	if !member {
		return nil
	}
	if p := w.last.Load().stranded(g); len(p) > 0 {
		return fmt.Errorf("owns no partition while the group leaves partitions %v of %s to nobody", p, w.topic)
	}
	return nil
}

// detail is the line /readyz adds to its answer, ready or not, when the
// last reading found partitions with lag that no member owns; "" when it
// found none.
func (w *groupWatcher) detail() string {
	v := w.last.Load()
	ids, lag, _ := v.lagging()
	if len(ids) == 0 {
		return ""
	}
	parts := make([]string, len(ids))
	for i, p := range ids {
		parts[i] = fmt.Sprintf("%d (lag %d)", p, lag[i])
	}
	return fmt.Sprintf("partitions of %s with lag that no member of group %s owns (group %s, by the brokers): %s",
		w.topic, w.group, v.State, strings.Join(parts, ", "))
}
