package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Positions is where the consumer records, before each Kafka offset
// commit, how far the decisions of each partition reach: in the database
// that holds the decisions, so that a database which loses its last
// commits (an asynchronous standby promoted) is seen to be behind Kafka
// (docs/design.md, "Positions"). internal/postgres implements it.
type Positions interface {
	// Advance moves group's positions of topic forward to offsets
	// (partition: the next offset, the one the Kafka commit will carry),
	// in one statement that never moves a position backwards; a partition
	// without a position gets one. It returns only once the write is
	// durable, or an error. Safe for concurrent use; ctx bounds it.
	Advance(ctx context.Context, group, topic string, offsets map[int]int64) error
}

// commitGeneration is the commitFunc of gen's topic: the positions of the
// partitions whose offset moves first (when Config.Positions is set and
// there are any), then the Kafka commit of every partition with its mark
// (kafkagroup.CommitMarked, as gen's member), both within one
// CommitTimeout. A position write that fails stops the Kafka commit: the
// messages stay uncommitted, and are redelivered (and decided as
// duplicates) only if no later commit succeeds. A commit that only raises
// frontiers carries the offsets already committed, whose positions are
// written already: it writes none. Once valid ends (Drop), nothing is
// written or committed: the write's context is valid's, so that a write
// whose connection is the first to a new database server (whose check
// calls Drop before handing the connection over) fails too.
func (c *Consumer) commitGeneration(gen *kafka.Generation, valid context.Context) commitFunc {
	return func(positions map[int]int64, commits map[int]kafkagroup.MarkedOffset) error {
		if valid.Err() != nil {
			return errDropped
		}
		deadline := time.Now().Add(c.cfg.CommitTimeout)
		if len(positions) > 0 {
			if err := c.advancePositions(valid, deadline, positions); err != nil {
				return err
			}
		}
		if valid.Err() != nil {
			return errDropped
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no time left for the offset commit after the positions write (commit timeout %v)", c.cfg.CommitTimeout)
		}
		return kafkagroup.CommitMarked(c.client, gen, c.cfg.Topic, commits, left)
	}
}

// errDropped is a commit of a generation that Drop invalidated.
var errDropped = errors.New("the generation's progress was dropped (the database is a new server): nothing more is committed")

// advancePositions writes offsets to Config.Positions, if any, by deadline;
// a failure is counted (OnPositionsFailed) and returned.
func (c *Consumer) advancePositions(valid context.Context, deadline time.Time, offsets map[int]int64) error {
	if c.cfg.Positions == nil {
		return nil
	}
	// Not the generation's context: the final commit runs after it ended.
	ctx, cancel := context.WithDeadline(valid, deadline)
	defer cancel()
	if err := c.cfg.Positions.Advance(ctx, c.cfg.GroupID, c.cfg.Topic, offsets); err != nil {
		if valid.Err() != nil {
			return errDropped
		}
		if c.cfg.OnPositionsFailed != nil {
			c.cfg.OnPositionsFailed()
		}
		return fmt.Errorf("positions not written, so no offset commit: %w", err)
	}
	return nil
}
