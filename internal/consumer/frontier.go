package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// The dispatch frontier (issue 30, docs/design.md "Positions"). Every
// commit carries a kafkagroup.Mark whose Frontier promises that this
// member dispatches no record of the partition at or past it until a
// later commit raises it. After a database failover, the last commit's
// Frontier thus bounds what the old primary can have decided, and the
// heal (internal/heal) re-reads only committed..Frontier.
//
// A partition hands a record to a worker only if its offset is below the
// frontier of the generation's last successful commit for the partition:
// the first commit of the generation (begin) sets it, and a flush raises
// it once the records dispatched come within half a window of it, to the
// highest offset dispatched + 1 + window. A partition whose next record
// reaches the frontier asks the commit loop for a flush at once and waits
// for it (one commit round trip, two if a flush was already under way).
//
// The window adapts per partition: twice the offsets it dispatched during
// the last commit tick (so the frontier is raised about once a tick, ahead
// of the stream), doubled whenever the partition had to wait at its
// frontier, between minWindow and maxWindow. It is counted in offsets,
// not records: the frontier is an offset, and a compacted or
// transactional topic's gaps count against it too.
const (
	// minWindow is the smallest window: a quiet partition's frontier
	// stays this close to its last dispatch.
	minWindow = 256
	// maxWindow caps the window, so that the heal's range
	// (committed..frontier) stays some seconds of traffic at most rather
	// than the whole backlog: at the default 1 s interval a partition
	// faster than maxWindow/2 offsets a second waits at its frontier
	// once a round trip instead.
	maxWindow = 1 << 16
)

// tickWindow is the window of a partition that dispatched delta offsets
// during the last commit tick.
func tickWindow(delta int64) int64 { return min(max(minWindow, 2*delta), maxWindow) }

// raised is the frontier a flush commits for a partition whose frontier
// and reach (see lane) are given, and whether it is a raise: once the
// highest offset dispatched (reach-1) plus half the window is at or past
// the frontier, the new frontier is reach + window.
func raised(frontier, reach, window int64) (int64, bool) {
	if reach+window/2 <= frontier {
		return frontier, false
	}
	return max(frontier, reach+window), true
}

// lane is what a partition goroutine and the committer share about the
// partition's frontier.
type lane struct {
	// frontier is the Frontier of the last successful commit of the
	// generation for the partition: only records below it may be
	// dispatched. 0 until the generation's first commit (nothing may).
	// Written by the committer only, after the commit succeeded.
	frontier atomic.Int64
	// reach is one past the highest offset the partition dispatched, or
	// one past the offset of the record it waits with at its frontier,
	// whichever is higher. Written by the partition goroutine (the
	// committer sets it at begin, before the partition starts).
	reach atomic.Int64
	// soon is where the partition asks for the next raise ahead of time
	// (frontier minus half the window it was raised with), so that the
	// commit carrying it is on its way while the partition goes on: a
	// partition that waited at its frontier for each raise lost a commit
	// round trip every half window (the bench's drain: 0.80x events/s,
	// 1.22x consumer CPU per event against the code before the frontier).
	soon atomic.Int64
	// moved holds a token once the frontier moved: a partition waiting
	// at its frontier looks again.
	moved chan struct{}
}

func newLane() *lane { return &lane{moved: make(chan struct{}, 1)} }

// raise publishes frontier, raised with window, if it is higher than the
// current one, and wakes the partition.
func (l *lane) raise(frontier, window int64) {
	if frontier <= l.frontier.Load() {
		return
	}
	l.soon.Store(frontier - window/2)
	l.frontier.Store(frontier)
	select {
	case l.moved <- struct{}{}:
	default: // a token waits already
	}
}

// startPoint is where a partition starts in a generation, and the mark of
// its first commit.
type startPoint struct{ offset, frontier, since int64 }

// begin is the generation's first commit: every assigned partition at its
// start offset with its first frontier, positions written first (the heal
// reads "a marked commit and no position row" as a loss). Only once it
// succeeded do the lanes get their frontiers; the progress of each
// partition starts there.
func (cm *committer) begin(starts map[int]startPoint) error {
	cm.sending.Lock()
	defer cm.sending.Unlock()
	positions := make(map[int]int64, len(starts))
	commits := make(map[int]kafkagroup.MarkedOffset, len(starts))
	for id, s := range starts {
		positions[id] = s.offset
		commits[id] = kafkagroup.MarkedOffset{Offset: s.offset, Mark: kafkagroup.Mark{Frontier: s.frontier, Since: s.since}}
	}
	if err := cm.gen(positions, commits); err != nil {
		return err
	}
	cm.mu.Lock()
	defer cm.mu.Unlock()
	for id, s := range starts {
		p := cm.part(id)
		p.next, p.committed, p.since, p.lastReach = s.offset, s.offset, s.since, s.offset
		p.lane.reach.Store(s.offset)
		p.lane.raise(s.frontier, minWindow)
	}
	return nil
}

// beginRetry and maxBeginRetry are the first and the longest pause
// between two attempts at a generation's first commit.
const (
	beginRetry    = 250 * time.Millisecond
	maxBeginRetry = 4 * time.Second
)

// begin makes the generation's first commit (see committer.begin) and
// returns each assigned partition's start offset. It retries until the
// commit succeeds, and returns an error only when stop ended first or the
// generation is over (kafkagroup.Rebalanced): then nothing may be
// dispatched in it.
func (c *Consumer) begin(stop context.Context, cm *committer, assigned []kafka.PartitionAssignment) (map[int]int64, error) {
	if len(assigned) == 0 {
		return map[int]int64{}, nil
	}
	wait := beginRetry
	for {
		err := c.look(stop)
		var starts map[int]startPoint
		if err == nil {
			starts, err = c.startPoints(stop, assigned)
		}
		if err == nil {
			err = cm.begin(starts)
		}
		if err == nil {
			offsets := make(map[int]int64, len(starts))
			for id, s := range starts {
				offsets[id] = s.offset
			}
			return offsets, nil
		}
		if stop.Err() != nil || kafkagroup.Rebalanced(err) {
			return nil, err
		}
		c.cfg.Logger.Warn("the generation's first commit failed; nothing is dispatched until it succeeds",
			"group", c.cfg.GroupID, "retry_in", wait, "err", err)
		select {
		case <-stop.Done():
			return nil, stop.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBeginRetry)
	}
}

// lookTimeout bounds the Gate's Look: when it finds a loss it re-reads
// the lost ranges from Kafka before it installs the heal.
const lookTimeout = 30 * time.Second

// look asks the Gate, if any, to look for a loss before the generation's
// first commit writes the committed offsets as the positions.
func (c *Consumer) look(stop context.Context) error {
	if c.cfg.Gate == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(stop, lookTimeout)
	defer cancel()
	if err := c.cfg.Gate.Look(ctx); err != nil {
		return fmt.Errorf("the failover heal's look before the first commit: %w", err)
	}
	return nil
}

// startPoints reads what the generation's first commit needs: the
// group's committed offsets (kafka-go's assignment; a partition the group
// never committed starts at its earliest retained record, asked of the
// brokers), the previous commits' marks (one OffsetFetch), and the Gate's
// start offsets. Frontier = max(previous Frontier, start + minWindow),
// Since = the previous Since; without a previous mark, Since = start.
func (c *Consumer) startPoints(stop context.Context, assigned []kafka.PartitionAssignment) (map[int]startPoint, error) {
	ctx, cancel := context.WithTimeout(stop, c.cfg.CommitTimeout)
	defer cancel()
	ids := make([]int, 0, len(assigned))
	var bounds map[int]kafkagroup.Bounds
	for _, a := range assigned {
		ids = append(ids, a.ID)
		if a.Offset < 0 && bounds == nil {
			var err error
			if bounds, err = kafkagroup.LogBounds(ctx, c.client, c.cfg.Topic); err != nil {
				return nil, err
			}
		}
	}
	marks, err := kafkagroup.CommittedMarks(ctx, c.client, c.cfg.GroupID, c.cfg.Topic, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int]startPoint, len(assigned))
	for _, a := range assigned {
		committed := a.Offset
		if committed < 0 {
			b, ok := bounds[a.ID]
			if !ok {
				return nil, errors.Join(errNoBounds, fmt.Errorf("partition %d", a.ID))
			}
			committed = b.First
		}
		s := startPoint{offset: committed}
		if c.cfg.Gate != nil {
			s.offset = c.cfg.Gate.Start(a.ID, committed)
		}
		s.frontier, s.since = s.offset+minWindow, s.offset
		if prev := marks[a.ID]; prev.Marked {
			s.frontier, s.since = max(s.frontier, prev.Mark.Frontier), prev.Mark.Since
		}
		out[a.ID] = s
	}
	return out, nil
}

// errNoBounds: the brokers did not say where a partition begins.
var errNoBounds = errors.New("no log bounds for an assigned partition")
