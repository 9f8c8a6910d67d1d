package dlq

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/segmentio/kafka-go"
)

// Position is what dlq replay has replayed of one partition of the
// dead-letter topic, kept as its replay group's committed offset (Next)
// and the commit's metadata (the replayed records past Next). Only records
// that were republished are ever marked: a record a run did not select
// (another reason, another order) stays not replayed, for the backlog
// gauge, the retention alert and a later run.
//
// The zero value is not meaningful; use NewPosition or ReadPositions.
type Position struct {
	// Next is the first record not yet replayed: every record before it
	// was replayed, or expired before it was. -1: nothing committed yet.
	Next int64
	// done are the replayed offsets past Next, as sorted, disjoint,
	// non-adjacent [from, to) spans, none starting at Next.
	done []span
}

type span struct{ from, to int64 }

// metadataVersion starts the commit metadata of a Position.
const metadataVersion = "r1:"

// MaxMetadata bounds the metadata a Position commits, below the brokers'
// offset.metadata.max.bytes (4096 by default).
const MaxMetadata = 3000

// ErrScattered is returned by Mark when the replayed records past Next are
// too scattered to be kept in one commit's metadata.
var ErrScattered = errors.New("too many replayed records past the first record not replayed")

// NewPosition is the position of a committed offset (negative: none) and
// its metadata. Metadata that is not a Position's (a commit by an older
// release, which moved the offset past every record it decided) means
// nothing is replayed past the offset.
func NewPosition(offset int64, metadata string) Position {
	p := Position{Next: max(offset, -1)}
	rest, ok := strings.CutPrefix(metadata, metadataVersion)
	if !ok || rest == "" || p.Next < 0 {
		return p
	}
	end := p.Next
	for _, pair := range strings.Split(rest, ",") {
		g, l, ok := strings.Cut(pair, ".")
		gap, err1 := strconv.ParseInt(g, 36, 64)
		n, err2 := strconv.ParseInt(l, 36, 64)
		if !ok || err1 != nil || err2 != nil || gap < 1 || n < 1 {
			return Position{Next: p.Next} // not ours: trust only the offset
		}
		from := end + gap
		p.done = append(p.done, span{from, from + n})
		end = from + n
	}
	return p
}

// Metadata is the commit metadata of p.
func (p Position) Metadata() string {
	if len(p.done) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(metadataVersion)
	end := p.Next
	for i, s := range p.done {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(s.from-end, 36))
		b.WriteByte('.')
		b.WriteString(strconv.FormatInt(s.to-s.from, 36))
		end = s.to
	}
	return b.String()
}

// Replayed reports whether the record at offset was replayed.
func (p Position) Replayed(offset int64) bool {
	if offset < p.Next {
		return true
	}
	for _, s := range p.done {
		if offset >= s.from && offset < s.to {
			return true
		}
	}
	return false
}

// ReplayedIn counts the replayed records in [from, to).
func (p Position) ReplayedIn(from, to int64) int64 {
	var n int64
	if p.Next > from {
		n += min(p.Next, to) - from
	}
	for _, s := range p.done {
		if lo, hi := max(s.from, from), min(s.to, to); hi > lo {
			n += hi - lo
		}
	}
	return max(n, 0)
}

// Start moves Next up to first, the partition's earliest retained offset:
// the records before it are gone.
func (p *Position) Start(first int64) {
	if p.Next >= first {
		return
	}
	p.Next = first
	p.done = slices.DeleteFunc(p.done, func(s span) bool { return s.to <= first })
	p.absorb()
}

// Mark records the record at offset as replayed. It returns ErrScattered,
// leaving p unchanged, when the metadata would outgrow MaxMetadata.
func (p *Position) Mark(offset int64) error {
	if p.Replayed(offset) {
		return nil
	}
	old := Position{Next: p.Next, done: slices.Clone(p.done)}
	i, _ := slices.BinarySearchFunc(p.done, offset, func(s span, o int64) int { return cmpInt(s.from, o) })
	p.done = slices.Insert(p.done, i, span{offset, offset + 1})
	p.merge()
	p.absorb()
	if len(p.Metadata()) > MaxMetadata {
		*p = old
		return fmt.Errorf("%w (offset %d, first not replayed %d)", ErrScattered, offset, p.Next)
	}
	return nil
}

// merge joins adjacent spans.
func (p *Position) merge() {
	out := p.done[:0]
	for _, s := range p.done {
		if n := len(out); n > 0 && out[n-1].to >= s.from {
			out[n-1].to = max(out[n-1].to, s.to)
			continue
		}
		out = append(out, s)
	}
	p.done = out
}

// absorb moves Next past the spans that start at it.
func (p *Position) absorb() {
	for len(p.done) > 0 && p.done[0].from <= p.Next {
		p.Next = max(p.Next, p.done[0].to)
		p.done = p.done[1:]
	}
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ReadPositions asks the brokers for group's position in the partitions ids
// of topic. A partition without a commit has Next -1. A group that never
// committed is "not found" on some brokers (kfake): nothing committed.
func ReadPositions(ctx context.Context, client *kafka.Client, group, topic string, ids []int) (map[int]Position, error) {
	out := make(map[int]Position, len(ids))
	for _, id := range ids {
		out[id] = Position{Next: -1}
	}
	res, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, err)
	}
	if res.Error != nil && !errors.Is(res.Error, kafka.GroupIdNotFound) {
		return nil, fmt.Errorf("committed offsets of %s: %w", group, res.Error)
	}
	for _, po := range res.Topics[topic] {
		if po.Error == nil {
			out[po.Partition] = NewPosition(po.CommittedOffset, po.Metadata)
		}
	}
	return out, nil
}

// CommitPosition commits p for partition of topic as a member of group's
// generation (genID, memberID): a commit by a run that lost the partition
// in a rebalance is refused by the broker.
func CommitPosition(ctx context.Context, client *kafka.Client, group string, genID int32, memberID, topic string,
	partition int, p Position) error {
	res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: int(genID), MemberID: memberID,
		Topics: map[string][]kafka.OffsetCommit{topic: {{Partition: partition, Offset: p.Next, Metadata: p.Metadata()}}}})
	if err != nil {
		return err
	}
	for _, pc := range res.Topics[topic] {
		if pc.Error != nil {
			return pc.Error
		}
	}
	return nil
}

// Clone is a copy of p that shares nothing with it.
func (p Position) Clone() Position { return Position{Next: p.Next, done: slices.Clone(p.done)} }
