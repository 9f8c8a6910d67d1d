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
	pending fifo[pendingMsg] // fetched, in offset order; front may be done
	// next is the offset to commit: the lowest unfinished offset, or one
	// past the highest fetched when everything fetched is done. -1 until
	// the first message completes.
	next int64
	// committed is the last offset handed to the committer, which commits
	// it with the other partitions' offsets.
	committed int64
}

type pendingMsg struct {
	offset int64
	timing Timing
	cost   int32 // what the budget charged for it (see budget.cost)
	done   bool
}

// Timing is when a message was produced (its record timestamp) and when it
// was fetched, for the histograms observed when its offset is committed.
type Timing struct{ Produced, Fetched time.Time }

func newOffsets() *offsets { return &offsets{next: -1, committed: -1} }

// fetched records a message that was read, and what the budget charged
// for it; offsets must increase.
func (o *offsets) fetched(offset int64, at Timing, cost int64) {
	o.pending.Push(pendingMsg{offset: offset, timing: at, cost: int32(cost)})
}

// done marks offset complete and appends to into the timings of the
// messages that thereby joined the committable prefix (for the
// fetch-to-commit and event-age histograms; observed when the commit
// succeeds). It also returns the cost fetched recorded for offset (0 when
// it was not pending, or already done).
func (o *offsets) done(offset int64, into []Timing) ([]Timing, int64) {
	var cost int64
	pending := o.pending.Items()
	if i, found := slices.BinarySearchFunc(pending, offset, func(p pendingMsg, off int64) int {
		return cmp.Compare(p.offset, off)
	}); found && !pending[i].done {
		pending[i].done = true
		cost = int64(pending[i].cost)
	}
	advanced := into
	i := 0
	for ; i < len(pending) && pending[i].done; i++ {
		advanced = append(advanced, pending[i].timing)
		o.next = pending[i].offset + 1
	}
	if i > 0 && i < len(pending) {
		o.next = pending[i].offset
	}
	o.pending.Pop(i)
	return advanced, cost
}

// committable returns the offset to commit and whether it is ahead of the
// last commit.
func (o *offsets) committable() (int64, bool) {
	return o.next, o.next > o.committed
}
