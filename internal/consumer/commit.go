package consumer

import (
	"log/slog"
	"sync"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// committer commits the offsets of every partition of one generation in
// one request: the partitions report how far their finished prefix has
// advanced, and flush sends the offsets of all partitions with progress
// since the last successful commit, each with its kafkagroup.Mark. The
// generation first commits every assigned partition at its start offset
// (begin, see frontier.go), calls flush on CommitInterval (tick) and when
// a partition reaches its frontier (urge), and once more after every
// partition has drained (final), before it releases the generation; with
// CommitInterval 0 a partition flushes after each completed message (the
// sequential mode).
//
// The committer also owns each partition's dispatch frontier (see lane):
// a flush raises the frontier of a partition whose dispatches come near it,
// and publishes the raise only after the commit carrying it succeeded.
//
// committer is safe for concurrent use. Commit requests are serialized, so
// a partition's committed offset never moves backwards and its frontier
// never moves down.
type committer struct {
	gen     commitFunc
	onDone  func(partition int, offset int64, covered []Timing)
	log     *slog.Logger
	sending sync.Mutex // held across a commit request
	// urge holds a token while a partition at its frontier waits for a
	// flush; the generation's commit loop flushes when it sees one.
	urge chan struct{}

	mu    sync.Mutex // guards parts and final
	parts map[int]*progress
	// final is set for the generation's last flush: nothing dispatches
	// any more, so no frontier is raised.
	final bool
}

// commitFunc sends one commit request: positions are the offsets to write
// to Config.Positions first (the partitions whose offset moved; none when
// only frontiers are raised), commits the offsets and marks of every
// partition the request carries.
type commitFunc func(positions map[int]int64, commits map[int]kafkagroup.MarkedOffset) error

// progress is one partition's position: next is the offset its finished
// prefix has reached, committed the last offset a commit request carried
// successfully, covered the timings of the messages between the two;
// since and the lane's frontier are the mark of that commit, window the
// partition's current frontier window and lastReach the lane's reach at
// the last tick.
type progress struct {
	next, committed int64
	covered         []Timing
	since, window   int64
	lastReach       int64
	lane            *lane
}

func newCommitter(commit commitFunc, onDone func(int, int64, []Timing), log *slog.Logger) *committer {
	return &committer{gen: commit, onDone: onDone, log: log, parts: map[int]*progress{}, urge: make(chan struct{}, 1)}
}

// part returns partition's progress, creating it (nothing committed, no
// frontier: nothing may be dispatched) if needed; cm.mu is held.
func (cm *committer) part(partition int) *progress {
	p := cm.parts[partition]
	if p == nil {
		p = &progress{committed: -1, window: minWindow, lane: newLane()}
		cm.parts[partition] = p
	}
	return p
}

// lane returns partition's lane, which its partition goroutine reads the
// frontier from and reports its reach to.
func (cm *committer) lane(partition int) *lane {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	return cm.part(partition).lane
}

// advance records that partition's finished prefix now ends before next,
// newly covering the messages whose timings are given.
func (cm *committer) advance(partition int, next int64, covered []Timing) {
	cm.mu.Lock()
	defer cm.mu.Unlock()
	p := cm.part(partition)
	p.next = next
	p.covered = append(p.covered, covered...)
}

// urgeFlush asks the commit loop for a flush now, without waiting.
func (cm *committer) urgeFlush() {
	select {
	case cm.urge <- struct{}{}:
	default: // one is asked for already
	}
}

// tick is the flush of a commit interval: it first sizes each
// partition's window from what it dispatched since the last tick.
func (cm *committer) tick() {
	cm.mu.Lock()
	for _, p := range cm.parts {
		reach := p.lane.reach.Load()
		p.window = tickWindow(reach - p.lastReach)
		p.lastReach = reach
	}
	cm.mu.Unlock()
	cm.flush()
}

// finish is the generation's last flush, after every partition drained:
// it commits what finished and raises no frontier.
func (cm *committer) finish() {
	cm.mu.Lock()
	cm.final = true
	cm.mu.Unlock()
	cm.flush()
}

// request is one flush's commit request and what it covers.
type request struct {
	positions map[int]int64
	commits   map[int]kafkagroup.MarkedOffset
	covered   map[int][]Timing
}

// collect builds the next request: every partition whose finished prefix
// is ahead of its last commit, and every partition whose frontier needs
// raising (see raise), at its last committed offset if it has no
// progress. It returns nil when there is nothing to send; cm.mu is held.
func (cm *committer) collect() *request {
	var r *request
	for id, p := range cm.parts {
		if p.committed < 0 {
			continue // not begun: begin commits it first
		}
		frontier, raise := p.lane.frontier.Load(), false
		if !cm.final {
			reach := p.lane.reach.Load()
			if reach > frontier { // it waits at its frontier: the window was short
				p.window = min(2*p.window, maxWindow)
			}
			frontier, raise = raised(frontier, reach, p.window)
		}
		progressed := p.next > p.committed
		if !progressed && !raise {
			continue
		}
		if r == nil {
			r = &request{positions: map[int]int64{}, commits: map[int]kafkagroup.MarkedOffset{}, covered: map[int][]Timing{}}
		}
		offset := p.committed
		if progressed {
			offset = p.next
			r.positions[id], r.covered[id] = p.next, p.covered
			p.covered = nil
		}
		r.commits[id] = kafkagroup.MarkedOffset{Offset: offset, Mark: kafkagroup.Mark{Frontier: frontier, Since: p.since}}
	}
	return r
}

// flush sends one commit request (see collect), then calls onDone for
// each partition whose offset it moved, and publishes the raised
// frontiers. A failed request is logged and its progress kept for the
// next flush: the messages are redelivered only if no later commit
// succeeds, and no frontier moves.
func (cm *committer) flush() {
	cm.sending.Lock()
	defer cm.sending.Unlock()

	cm.mu.Lock()
	r := cm.collect()
	cm.mu.Unlock()
	if r == nil {
		return
	}

	if err := cm.gen(r.positions, r.commits); err != nil {
		cm.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds",
			"offsets", r.positions, "err", err)
		cm.mu.Lock()
		for id, c := range r.covered {
			p := cm.parts[id]
			p.covered = append(c, p.covered...)
		}
		cm.mu.Unlock()
		return
	}
	cm.mu.Lock()
	for id, c := range r.commits {
		p := cm.parts[id]
		p.committed = c.Offset
		p.lane.raise(c.Mark.Frontier, p.window)
	}
	cm.mu.Unlock()
	if cm.onDone != nil {
		for id, next := range r.positions {
			cm.onDone(id, next, r.covered[id])
		}
	}
}
