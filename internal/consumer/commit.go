package consumer

import (
	"log/slog"
	"sync"
)

// committer commits the offsets of every partition of one generation in
// one request: the partitions report how far their finished prefix has
// advanced, and flush sends the offsets of all partitions with progress
// since the last successful commit. The generation calls flush on
// CommitInterval and once more after every partition has drained, before
// it releases the generation; with CommitInterval 0 a partition flushes
// after each completed message (the sequential mode).
//
// committer is safe for concurrent use. Commit requests are serialized, so
// a partition's committed offset never moves backwards.
type committer struct {
	gen     commitFunc
	onDone  func(partition int, offset int64, covered []Timing)
	log     *slog.Logger
	sending sync.Mutex // held across a commit request

	mu    sync.Mutex // guards parts
	parts map[int]*progress
}

// commitFunc sends one commit request for offsets (partition: next offset).
type commitFunc func(offsets map[int]int64) error

// progress is one partition's position: next is the offset its finished
// prefix has reached, committed the last offset a commit request carried
// successfully, covered the timings of the messages between the two.
type progress struct {
	next, committed int64
	covered         []Timing
}

func newCommitter(commit commitFunc, onDone func(int, int64, []Timing), log *slog.Logger) *committer {
	return &committer{gen: commit, onDone: onDone, log: log, parts: map[int]*progress{}}
}

// advance records that partition's finished prefix now ends before next,
// newly covering the messages whose timings are given.
func (cm *committer) advance(partition int, next int64, covered []Timing) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	p := cm.parts[partition]
	if p == nil {
		p = &progress{committed: -1}
		cm.parts[partition] = p
	}
	p.next = next
	p.covered = append(p.covered, covered...)
}

// flush sends one commit request for every partition whose finished prefix
// is ahead of its last commit, then calls onDone for each of them. A failed
// request is logged and its progress kept for the next flush: the messages
// are redelivered only if no later commit succeeds.
func (cm *committer) flush() {
	cm.sending.Lock()
	defer cm.sending.Unlock()

	cm.mu.Lock()
	var offsets map[int]int64
	var covered map[int][]Timing
	for id, p := range cm.parts {
		if p.next <= p.committed {
			continue
		}
		if offsets == nil {
			offsets, covered = map[int]int64{}, map[int][]Timing{}
		}
		offsets[id], covered[id] = p.next, p.covered
		p.covered = nil
	}
	cm.mu.Unlock()
	if offsets == nil {
		return
	}

	if err := cm.gen(offsets); err != nil {
		cm.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds",
			"offsets", offsets, "err", err)
		cm.mu.Lock()
		for id, c := range covered {
			p := cm.parts[id]
			p.covered = append(c, p.covered...)
		}
		cm.mu.Unlock()
		return
	}
	cm.mu.Lock()
	for id, next := range offsets {
		cm.parts[id].committed = next
	}
	cm.mu.Unlock()
	if cm.onDone != nil {
		for id, next := range offsets {
			cm.onDone(id, next, covered[id])
		}
	}
}
