package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// replayRun is the state of one Run.
type replayRun struct {
	r      *Replayer
	opts   Options
	sum    *Summary
	bounds map[int]kafkagroup.Bounds
	writer *kafka.Writer // nil in a dry run
	log    *slog.Logger
}

// errRebalanced ends a partition whose group generation ended.
var errRebalanced = errors.New("replay group rebalanced")

// Timeouts of the group's bookkeeping; a hung broker must not hold the
// command.
const (
	commitTimeout = 10 * time.Second
	joinPatience  = 30 * time.Second
)

// asGroup replays the partitions the group assigns, rejoining after a
// rebalance, until every assigned partition reached its end of the start.
func (run *replayRun) asGroup(ctx context.Context) error {
	cfg := run.r.cfg
	group, err := kafkagroup.Join(kafkagroup.GroupConfig{
		ID: cfg.GroupID, Brokers: cfg.Brokers, Topic: cfg.DLQTopic, Dialer: cfg.Dialer,
		SessionTimeout: cfg.SessionTimeout, RebalanceTimeout: cfg.RebalanceTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval, Logger: run.log,
	})
	if err != nil {
		return fmt.Errorf("replay group %s: %w", cfg.GroupID, err)
	}
	defer run.leave(group)
	var failingSince time.Time
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// kafka-go retries by itself; a rebalance in progress is
			// routine, a coordinator that never answers is not.
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > joinPatience {
				return fmt.Errorf("join replay group %s: %w", cfg.GroupID, err)
			}
			run.log.Warn("joining replay group failed, retrying", "err", err)
			continue
		}
		failingSince = time.Time{}
		err = run.generation(ctx, gen)
		if !errors.Is(err, errRebalanced) {
			return err
		}
		run.log.Info("replay group rebalanced, rejoining")
	}
}

// leave leaves the group (the next run joins at once), bounded.
func (run *replayRun) leave(group *kafka.ConsumerGroup) {
	if !kafkagroup.Leave(group, commitTimeout) {
		run.log.Warn("leaving replay group timed out")
	}
}

// generation replays the partitions of gen in order. It returns
// errRebalanced when the generation ended first.
func (run *replayRun) generation(ctx context.Context, gen *kafka.Generation) error {
	topic := run.r.cfg.DLQTopic
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	// The work runs here, not in a Start function (one returning ends the
	// generation); this one only watches for the generation's end.
	gen.Start(func(genCtx context.Context) {
		<-genCtx.Done()
		cancel()
	})
	assigned := slices.SortedFunc(slices.Values(gen.Assignments[topic]), func(a, b kafka.PartitionAssignment) int {
		return cmp.Compare(a.ID, b.ID)
	})
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		ids = append(ids, a.ID)
	}
	run.log.Info("replay partitions assigned", "generation", gen.ID, "partitions", ids)
	for _, a := range assigned {
		commit := func(next int64) error {
			err := kafkagroup.Commit(gen, topic, map[int]int64{a.ID: next}, commitTimeout)
			if kafkagroup.Rebalanced(err) {
				return fmt.Errorf("%w: %w", errRebalanced, err)
			}
			return err
		}
		stop, err := run.partition(ctx, work, a.ID, a.Offset, commit)
		if err != nil {
			if ctx.Err() == nil && work.Err() != nil {
				return errRebalanced
			}
			return err
		}
		if stop {
			return nil
		}
	}
	return nil
}

// dryRun judges every partition from the group's committed offsets without
// joining the group.
func (run *replayRun) dryRun(ctx context.Context) error {
	topic := run.r.cfg.DLQTopic
	ids := slices.Sorted(maps.Keys(run.bounds))
	committed, err := kafkagroup.CommittedOffsets(ctx, run.r.client, run.r.cfg.GroupID, topic, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		from, ok := committed[id]
		if !ok {
			from = -1
		}
		stop, err := run.partition(ctx, ctx, id, from, nil)
		if err != nil || stop {
			return err
		}
	}
	return nil
}

// startOf returns the bounds of partition at the start of the run and the
// offset to replay it from, given the group's offset from (negative:
// none); ok is false when there is nothing to replay: the partition was
// created after the start, or the group is at its end.
func (run *replayRun) startOf(partition int, from int64) (b kafkagroup.Bounds, start int64, ok bool) {
	b, ok = run.bounds[partition]
	if !ok {
		return b, 0, false // created after the start
	}
	start = from
	if start < b.First {
		if start >= 0 {
			run.log.Warn("dead-letter records expired before they were replayed", "partition", partition,
				"from", start, "first", b.First)
		}
		start = b.First
	}
	return b, start, start < b.End
}

// partition replays one partition from the group's offset from (negative:
// none) up to its end at the start of the run. commit is nil in a dry run.
// Skipped records are committed with the next republished one or at the
// end. stop reports that the run must end here (--max reached).
func (run *replayRun) partition(ctx, work context.Context, partition int, from int64, commit func(int64) error) (stop bool, err error) {
	cfg := run.r.cfg
	b, start, ok := run.startOf(partition, from)
	if !ok {
		return false, nil
	}
	log := run.log.With("partition", partition)
	rd, err := kafkagroup.OpenPartition(kafkagroup.ReaderConfig{Brokers: cfg.Brokers, Topic: cfg.DLQTopic,
		Partition: partition, Dialer: cfg.Dialer, Logger: log}, start)
	if err != nil {
		return false, err
	}
	defer rd.Close()

	// The DLQ writer is not transactional, so offsets are dense up to the
	// end: the loop reaches it.
	next, committed := start, start
	flush := func() error {
		if commit == nil || next == committed {
			return nil
		}
		if err := commit(next); err != nil {
			return fmt.Errorf("commit %s/%d at %d: %w", cfg.DLQTopic, partition, next, err)
		}
		committed = next
		return nil
	}
	for next < b.End {
		msg, err := rd.FetchMessage(work)
		if err != nil {
			_ = flush() // best effort: the skipped records before
			return false, fmt.Errorf("read %s/%d at %d: %w", cfg.DLQTopic, partition, next, err)
		}
		if msg.Offset >= b.End {
			break
		}
		v := run.r.judge(msg, run.opts.Reason)
		at := []any{"offset", msg.Offset, "reason", string(v.reason)}
		switch {
		case v.skip:
			run.sum.count(v.reason, func(c *Counts) { c.Skipped++ })
			next = msg.Offset + 1
			log.Debug("dead-letter record skipped by the reason filter", at...)
		case v.why != "":
			run.sum.count(v.reason, func(c *Counts) { c.Refused++ })
			log.Error("dead-letter record refused, replay stops", append(at, "why", v.why)...)
			if err := flush(); err != nil {
				return false, err
			}
			return true, &RefusedError{Topic: cfg.DLQTopic, Partition: partition, Offset: msg.Offset, Why: v.why}
		default:
			if commit != nil {
				// The operator's ctx, not work: a rebalance must not
				// abort a write half-way (it would be retried anyway).
				if err := run.writer.WriteMessages(ctx, v.out); err != nil {
					_ = flush()
					return false, fmt.Errorf("republish %s/%d@%d to %s: %w", cfg.DLQTopic, partition, msg.Offset, cfg.SourceTopic, err)
				}
			}
			run.sum.count(v.reason, func(c *Counts) { c.Replayed++ })
			next = msg.Offset + 1
			if err := flush(); err != nil {
				return false, fmt.Errorf("%w (the record was republished and will be again, which is harmless)", err)
			}
			msgText := "dead-letter record replayed"
			if commit == nil {
				msgText = "dead-letter record would be replayed"
			}
			log.Info(msgText, append(at, "replay_count", v.count, "topic", cfg.SourceTopic)...)
			if run.opts.Max > 0 && run.sum.Total.Replayed >= run.opts.Max {
				run.sum.MaxReached = true
				return true, nil
			}
		}
	}
	return false, flush()
}
