package consumer

import (
	"cmp"
	"slices"
	"time"
)

// offsets tracks the messages of one partition from fetch to completion and
// yields the offset that may be committed: the contiguous prefix of
// completed messages. Messages may complete out of order; the committable
// offset never passes one that has not completed, so a crash or a revoke
// redelivers everything unfinished and skips nothing.
//
// offsets is not safe for concurrent use; its owner serializes access.
type offsets struct {
	pending []pendingMsg // fetched, in offset order; front may be done
	// undone counts the entries of pending not yet done.
	undone int
	// next is the offset to commit: the lowest unfinished offset, or one
	// past the highest fetched when everything fetched is done. -1 until
	// the first message completes.
	next int64
	// committed is the last offset handed to the committer, which commits
	// it with the other partitions' offsets.
	committed int64
}

// pendingMsg is one tracked message: 32 bytes, since a partition may
// track tens of thousands of them behind one waiting message. Its times
// are Unix nanoseconds (0 for a zero time), not time.Time's 24 bytes each.
type pendingMsg struct {
	offset            int64
	produced, fetched int64
	done              bool
}

// unixNano is t in Unix nanoseconds, 0 for the zero time.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// timeOf is the time of Unix nanoseconds ns, the zero time for 0.
func timeOf(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// timing is the message's Timing.
func (p pendingMsg) timing() Timing {
	return Timing{Produced: timeOf(p.produced), Fetched: timeOf(p.fetched)}
}

// Timing is when a message was produced (its record timestamp) and when it
// was fetched, for the histograms observed when its offset is committed.
type Timing struct{ Produced, Fetched time.Time }

func newOffsets() *offsets { return &offsets{next: -1, committed: -1} }

// fetched records a message that was read; offsets must increase.
func (o *offsets) fetched(offset int64, at Timing) {
	o.pending = append(o.pending, pendingMsg{offset: offset, produced: unixNano(at.Produced), fetched: unixNano(at.Fetched)})
	o.undone++
}

// done marks offset complete and appends to into the timings of the
// messages that thereby joined the committable prefix (for the
// fetch-to-commit and event-age histograms; observed when the commit
// succeeds).
func (o *offsets) done(offset int64, into []Timing) []Timing {
	if i, found := slices.BinarySearchFunc(o.pending, offset, func(p pendingMsg, off int64) int {
		return cmp.Compare(p.offset, off)
	}); found && !o.pending[i].done {
		o.pending[i].done = true
		o.undone--
	}
	advanced := into
	i := 0
	for ; i < len(o.pending) && o.pending[i].done; i++ {
		advanced = append(advanced, o.pending[i].timing())
		o.next = o.pending[i].offset + 1
	}
	o.pending = o.pending[i:]
	if len(o.pending) > 0 && i > 0 {
		o.next = o.pending[0].offset
	}
	return advanced
}

// committable returns the offset to commit and whether it is ahead of the
// last commit.
func (o *offsets) committable() (int64, bool) {
	return o.next, o.next > o.committed
}

// tracked is the number of fetched messages not yet committable, done or
// not: an entry each (its offset and timings, the message itself is gone
// once done), kept until the unfinished message before it finishes.
func (o *offsets) tracked() int { return len(o.pending) }

// inFlight is the number of fetched messages not yet done: what counts
// against the partition's window. Messages done behind an unfinished one
// do not, so that one waiting message (its order failing at the provider,
// until it is parked) does not stop its partition from billing the rest.
func (o *offsets) inFlight() int { return o.undone }
