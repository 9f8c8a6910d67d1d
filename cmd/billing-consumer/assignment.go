package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// idleCheck is what the group's coordinator said while this instance was
// a member of generation gen with no partition: why it is idle.
type idleCheck struct {
	gen int32
	consumer.GroupAssignment
}

// stranded reports the partitions a Stable group leaves to nobody while
// this instance idles in the same generation: then nobody consumes them,
// and /readyz says so instead of "ready". An instance with no partition in
// a group whose every partition is taken (more replicas than partitions)
// is not stranded: it is a hot standby.
func (c *idleCheck) stranded(g consumer.Generation) []int {
	if c == nil || c.gen != g.ID || g.Partitions > 0 || c.State != "Stable" {
		return nil
	}
	return c.Unassigned
}

// idleWatcher asks the brokers, every interval while this instance is a
// member owning no partition, how the group has assigned the topic, keeps
// the answer for readyCheck and logs each change of verdict.
type idleWatcher struct {
	client   *kafka.Client
	topic    string
	group    string
	consumer interface {
		Generation() (consumer.Generation, bool)
	}
	logger *slog.Logger
	last   atomic.Pointer[idleCheck]
}

func (w *idleWatcher) run(ctx context.Context, interval time.Duration) {
	verdict := ""
	kafkagroup.Every(ctx, interval, func(qctx context.Context) {
		g, member := w.consumer.Generation()
		if !member || g.Partitions > 0 {
			w.last.Store(nil)
			verdict = ""
			return
		}
		a, err := consumer.AssignmentOf(qctx, w.client, w.topic, w.group)
		if err != nil {
			if ctx.Err() == nil {
				w.logger.Warn("cannot tell why this instance owns no partition", "err", err)
			}
			return
		}
		c := &idleCheck{gen: g.ID, GroupAssignment: a}
		w.last.Store(c)
		now := "standby"
		if len(c.stranded(g)) > 0 {
			now = "stranded"
		}
		if now == verdict {
			return
		}
		verdict = now
		if now == "stranded" {
			w.logger.Error("this instance owns no partition while the group leaves partitions unassigned: nobody consumes them",
				"group", w.group, "generation", g.ID, "unassigned", a.Unassigned, "members", a.Members)
		} else {
			w.logger.Info("this instance owns no partition: every partition is assigned to another member",
				"group", w.group, "generation", g.ID, "state", a.State, "members", a.Members)
		}
	})
}

// notReady is readyCheck's verdict: an error when this instance idles
// while partitions are stranded.
func (w *idleWatcher) notReady() error {
	g, member := w.consumer.Generation()
	if !member {
		return nil
	}
	if p := w.last.Load().stranded(g); len(p) > 0 {
		return fmt.Errorf("owns no partition while the group leaves partitions %v of %s to nobody", p, w.topic)
	}
	return nil
}
