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

	"github.com/billing-consumer/billing-consumer/internal/dlq"
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
	positions, err := dlq.ReadPositions(work, run.r.client, gen.GroupID, topic, ids)
	if err != nil {
		if ctx.Err() == nil && work.Err() != nil {
			return errRebalanced
		}
		return err
	}
	for _, id := range ids {
		commit := func(p dlq.Position) error {
			cctx, cancel := context.WithTimeout(ctx, commitTimeout)
			defer cancel()
			err := dlq.CommitPosition(cctx, run.r.client, gen.GroupID, gen.ID, gen.MemberID, topic, id, p)
			if kafkagroup.Rebalanced(err) {
				return fmt.Errorf("%w: %w", errRebalanced, err)
			}
			return err
		}
		stop, err := run.partition(ctx, work, id, positions[id], commit)
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

// dryRun judges every partition from the group's positions without
// joining the group.
func (run *replayRun) dryRun(ctx context.Context) error {
	ids := slices.Sorted(maps.Keys(run.bounds))
	positions, err := dlq.ReadPositions(ctx, run.r.client, run.r.cfg.GroupID, run.r.cfg.DLQTopic, ids)
	if err != nil {
		return err
	}
	for _, id := range ids {
		stop, err := run.partition(ctx, ctx, id, positions[id], nil)
		if err != nil || stop {
			return err
		}
	}
	return nil
}

// span returns the offsets [start, end) of partition to read, given its
// position (moved past the expired records); ok is false when there is
// nothing to read: another partition than Options.At's, one created after
// the start, or one the group has replayed to its end.
func (run *replayRun) span(partition int, pos *dlq.Position) (start, end int64, ok bool) {
	b, ok := run.bounds[partition]
	if !ok {
		return 0, 0, false // created after the start
	}
	if pos.Next >= 0 && pos.Next < b.First {
		run.log.Warn("dead-letter records expired before they were replayed", "partition", partition,
			"from", pos.Next, "first", b.First)
	}
	pos.Start(b.First)
	if at := run.opts.At; at != nil {
		return at.Offset, at.Offset + 1, at.Partition == partition
	}
	return pos.Next, b.End, pos.Next < b.End
}

// partition replays one partition from its first record not replayed (pos)
// up to its end at the start of the run. commit is nil in a dry run. stop
// reports that the run must end here (--max reached, or a refused record).
func (run *replayRun) partition(ctx, work context.Context, partition int, pos dlq.Position, commit func(dlq.Position) error) (stop bool, err error) {
	cfg := run.r.cfg
	start, end, ok := run.span(partition, &pos)
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
	for next := start; next < end; {
		msg, err := rd.FetchMessage(work)
		if err != nil {
			return false, fmt.Errorf("read %s/%d at %d: %w", cfg.DLQTopic, partition, next, err)
		}
		if msg.Offset >= end {
			break
		}
		next = msg.Offset + 1
		if run.opts.At == nil && pos.Replayed(msg.Offset) {
			continue // an earlier run's
		}
		v := run.r.judge(msg, run.opts)
		at := []any{"offset", msg.Offset, "reason", string(v.reason)}
		switch {
		case v.notSelected:
			run.sum.count(v.reason, func(c *Counts) { c.NotSelected++ })
			log.Debug("dead-letter record not selected, left as it is", at...)
		case v.why != "":
			run.sum.count(v.reason, func(c *Counts) { c.Refused++ })
			log.Error("dead-letter record refused, replay stops", append(at, "why", v.why)...)
			return true, &RefusedError{Topic: cfg.DLQTopic, Partition: partition, Offset: msg.Offset, Why: v.why}
		default:
			if stop, err := run.republish(ctx, msg, v, &pos, commit); err != nil || stop {
				return stop, err
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
	return false, nil
}

// republish writes v.out to the source topic, then marks msg replayed in
// pos and commits pos; in a dry run (commit nil) it only counts. A mark
// that no longer fits the commit is found before anything is written.
func (run *replayRun) republish(ctx context.Context, msg kafka.Message, v verdict, pos *dlq.Position, commit func(dlq.Position) error) (stop bool, err error) {
	cfg := run.r.cfg
	if commit == nil {
		run.sum.count(v.reason, func(c *Counts) { c.Replayed++ })
		return false, nil
	}
	marked := pos.Clone()
	if err := marked.Mark(msg.Offset); err != nil {
		return true, fmt.Errorf("%s/%d: %w; replay the records before it first (dlq list shows them)", cfg.DLQTopic, msg.Partition, err)
	}
	// The operator's ctx, not the generation's: a rebalance must not abort
	// a write half-way (it would be retried anyway).
	if err := run.writer.WriteMessages(ctx, v.out); err != nil {
		return false, fmt.Errorf("republish %s/%d@%d to %s: %w", cfg.DLQTopic, msg.Partition, msg.Offset, cfg.SourceTopic, err)
	}
	run.sum.count(v.reason, func(c *Counts) { c.Replayed++ })
	*pos = marked
	if err := commit(marked); err != nil {
		return false, fmt.Errorf("commit %s/%d at %d: %w (the record was republished and will be again, which is harmless)",
			cfg.DLQTopic, msg.Partition, marked.Next, err)
	}
	return false, nil
}
