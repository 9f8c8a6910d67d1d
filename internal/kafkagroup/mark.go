package kafkagroup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Mark is what the billing consumer writes in the metadata of every offset
// commit it makes (issue 30): the commit's own proof that the database's
// position was written before it, and the frontier the consumer promised
// to stay below.
//
//   - Frontier: the member that committed dispatched no record of the
//     partition at or past Frontier, and will dispatch none until a later
//     commit raises it. So after a database failover every decision the
//     old primary can have taken on the partition is below the last
//     commit's Frontier (or the log end, if lower).
//   - Since: the offset from which the group's positions track the
//     partition (the first marked commit's offset, carried forward). A
//     marked commit with no position row in the database means the row's
//     first insert was lost, and everything from Since on with it.
//
// A commit without a mark (an older release, Kafka's own tools resetting
// offsets, the dead-letter replayer's group) proves nothing: the heal
// (internal/heal) never treats it as a loss.
type Mark struct{ Frontier, Since int64 }

// markPrefix starts every mark; the version lets a later format coexist.
const markPrefix = "billing-consumer/1"

// String is the mark's commit metadata.
func (m Mark) String() string {
	return fmt.Sprintf("%s frontier=%d since=%d", markPrefix, m.Frontier, m.Since)
}

// ParseMark reads a commit's metadata; ok is false for metadata that is
// not a mark (empty, another writer's, a later format).
func ParseMark(meta string) (m Mark, ok bool) {
	var prefix string
	n, err := fmt.Sscanf(meta, "%s frontier=%d since=%d", &prefix, &m.Frontier, &m.Since)
	if err != nil || n != 3 || prefix != markPrefix || m.Frontier < 0 || m.Since < 0 {
		return Mark{}, false
	}
	return m, true
}

// Committed is a group's committed offset of one partition with its mark.
type Committed struct {
	Offset int64
	Mark   Mark
	Marked bool
}

// CommittedMarks is CommittedOffsets with each commit's mark. A partition
// the group never committed is absent.
func CommittedMarks(ctx context.Context, client *kafka.Client, group, topic string, ids []int) (map[int]Committed, error) {
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if res.Error != nil && !errors.Is(res.Error, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, res.Error)
	}
	out := map[int]Committed{}
	for _, po := range res.Topics[topic] {
		if po.Error != nil {
			return nil, fmt.Errorf("committed offset of %s/%d: %w", topic, po.Partition, po.Error)
		}
		if po.CommittedOffset < 0 {
			continue
		}
		m, ok := ParseMark(po.Metadata)
		out[po.Partition] = Committed{Offset: po.CommittedOffset, Mark: m, Marked: ok}
	}
	return out, nil
}

// MarkedOffset is one partition's offset commit with its mark: Offset is
// the offset of the next record to consume.
type MarkedOffset struct {
	Offset int64
	Mark   Mark
}

// CommitMarked commits offsets of topic in gen, each with its Mark as the
// commit's metadata, in one OffsetCommit request sent through client
// with gen's group, generation id and member id (kafka-go's
// Generation.CommitOffsets sends no metadata). It waits at most timeout,
// as Commit does: after a timeout the commit may still land, and
// committing the same or a later offset again is harmless. An error of
// any partition in the response is an error; a fenced or ended generation
// is one Rebalanced recognises. Callers that commit from several
// goroutines must serialize their calls, or an older offset may land
// after a newer one.
func CommitMarked(client *kafka.Client, gen *kafka.Generation, topic string, offsets map[int]MarkedOffset, timeout time.Duration) error {
	if len(offsets) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	commits := make([]kafka.OffsetCommit, 0, len(offsets))
	for id, o := range offsets {
		commits = append(commits, kafka.OffsetCommit{Partition: id, Offset: o.Offset, Metadata: o.Mark.String()})
	}
	res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: gen.GroupID, GenerationID: int(gen.ID),
		MemberID: gen.MemberID, Topics: map[string][]kafka.OffsetCommit{topic: commits}})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("offset commit timed out: %w", err)
		}
		return err
	}
	var errs []error
	answered := 0
	for _, pc := range res.Topics[topic] {
		answered++
		if pc.Error != nil {
			errs = append(errs, fmt.Errorf("offset commit of %s/%d: %w", topic, pc.Partition, pc.Error))
		}
	}
	if len(errs) == 0 && answered != len(offsets) {
		return fmt.Errorf("offset commit of %s: %d partitions answered of %d", topic, answered, len(offsets))
	}
	return errors.Join(errs...)
}
