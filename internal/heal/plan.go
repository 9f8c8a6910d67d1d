package heal

import (
	"maps"
	"slices"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Found is what a replica reads of one partition of the topic, Kafka
// first, the database second (a position is written before its commit,
// so this order can only hide a gap, never invent one).
type Found struct {
	// Committed is the group's committed offset and its mark; Kafka
	// has none when HasCommit is false.
	Committed kafkagroup.Committed
	HasCommit bool
	// Position is the database's consumer_position row, if HasPosition.
	Position    int64
	HasPosition bool
	// First and End are the partition's earliest retained offset and
	// its log end when the heal was planned.
	First, End int64
}

// Range is one partition's part of a heal: the records in [Lo, Hi) are
// re-decided while the gate is up, every record at or past Hi waits.
// Committed and Position are what was found (Position -1: no row).
type Range struct {
	Lo, Hi, Committed, Position int64
}

// Lost reports whether the partition's decisions were lost: a commit
// that carries the consumer's mark (so a position write of its offset
// preceded it) with no position row, or a position behind it. An
// unmarked commit (an older release, Kafka's tools) proves nothing.
func (f Found) Lost() bool {
	if !f.HasCommit || !f.Committed.Marked {
		return false
	}
	return !f.HasPosition || f.Position < f.Committed.Offset
}

// Plan returns the heal for what was found, or nil when no partition
// lost anything. When one did, every partition a marked commit covers
// gets a range, lost or not: the old primary decided records past every
// partition's committed offset (up to its frontier) and lost those
// decisions with the rest, so those records are re-decided under the
// gate too, and an order with events in two ranges is told apart nowhere.
//
//   - Lo is the surviving position (every decision below it survived,
//     whether it is behind the commit or ahead of it); the mark's Since
//     when the position row itself was lost. Never below the log's first
//     offset (what retention deleted cannot be re-read: Expired says how
//     many).
//   - Hi is the mark's frontier (no decision at or past it was taken
//     before the loss), at most the log end (nothing past it existed),
//     at least Lo.
//
// A partition with no marked commit gets no range: the gate holds all of
// its records until the lift.
func Plan(found map[int]Found) map[int]Range {
	lost := false
	for _, f := range found {
		lost = lost || f.Lost()
	}
	if !lost {
		return nil
	}
	out := map[int]Range{}
	for _, id := range slices.Sorted(maps.Keys(found)) {
		f := found[id]
		if !f.HasCommit || !f.Committed.Marked {
			continue
		}
		c := f.Committed
		r := Range{Lo: c.Offset, Committed: c.Offset, Position: -1}
		if f.HasPosition {
			r.Lo = f.Position // every decision below it survived
		} else {
			r.Lo = min(c.Mark.Since, c.Offset)
		}
		if f.HasPosition {
			r.Position = f.Position
		}
		r.Lo = max(r.Lo, f.First)
		r.Hi = max(r.Lo, min(max(c.Mark.Frontier, c.Offset), f.End))
		out[id] = r
	}
	return out
}

// Expired is how many records of the partition's lost range retention
// deleted before the heal could re-read them (their decisions cannot be
// healed: docs/operations.md, "After a failover").
func (f Found) Expired() int64 {
	if !f.Lost() {
		return 0
	}
	lo := f.Committed.Offset
	if f.HasPosition {
		lo = f.Position
	} else {
		lo = min(f.Committed.Mark.Since, lo)
	}
	return max(0, f.First-lo)
}

// Rewound is how many records below the committed offsets the heal
// re-decides: decisions Kafka had committed and the database lost.
func Rewound(ranges map[int]Range) int64 {
	var n int64
	for _, r := range ranges {
		n += max(0, r.Committed-r.Lo)
	}
	return n
}
