package consumer

import "context"

// Gate is the failover heal's hold on the stream (internal/heal implements it).
//
// The consumer asks Start once per assigned partition at the beginning of
// every generation, before its first commit, and Hold for the next record
// of a partition before it dispatches it (the lowest offset ready to
// start: a partition's ready records are kept in offset order, so when
// the first is held, every later one is too). Implementations must be
// safe for concurrent use and cheap: Hold runs once per record.
type Gate interface {
	// Start is the offset partition must start from in a new generation, given the
	// group's committed offset (rewinds it while a heal is up).
	Start(partition int, committed int64) int64
	// Hold reports whether the record at offset of partition must wait: the heal
	// is up and offset is at or past the partition's target.
	Hold(partition int, offset int64) bool
	// Changed is closed at the gate's next change; a held partition asks Hold again then.
	Changed() <-chan struct{}
	// Look is called at the beginning of every generation, before Start
	// and the first commit, which writes the committed offsets as the
	// positions: it returns once the gate reflects the group's committed
	// offsets and the database's positions of now (a loss it finds is
	// installed first). An error is retried like a failed first commit.
	Look(ctx context.Context) error
}
