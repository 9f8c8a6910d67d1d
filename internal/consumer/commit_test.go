package consumer

import (
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// commitLog is a commitFunc that records each request and fails while
// failing is set, and an OnCommit that records each call.
type commitLog struct {
	failing  bool
	requests []map[int]int64 // the offsets of each request
	// positions and marks are each request's positions to write and
	// its commits.
	positions []map[int]int64
	marks     []map[int]kafkagroup.MarkedOffset
	onDone    map[int][][]int64 // partition: the offsets covered, per call
	offsets   map[int][]int64   // partition: the offsets OnCommit reported
}

func newCommitLog() *commitLog {
	return &commitLog{onDone: map[int][][]int64{}, offsets: map[int][]int64{}}
}

func (l *commitLog) commit(positions map[int]int64, commits map[int]kafkagroup.MarkedOffset) error {
	offsets := map[int]int64{}
	for id, c := range commits {
		offsets[id] = c.Offset
	}
	l.requests = append(l.requests, offsets)
	l.positions = append(l.positions, maps.Clone(positions))
	l.marks = append(l.marks, maps.Clone(commits))
	if l.failing {
		return errors.New("broker says no")
	}
	return nil
}

func (l *commitLog) done(partition int, offset int64, covered []Timing) {
	l.onDone[partition] = append(l.onDone[partition], offsetsOf(covered))
	l.offsets[partition] = append(l.offsets[partition], offset)
}

// begun is a committer on l whose partitions have made the generation's
// first commit at the given offsets (their frontiers far ahead, so that
// no flush raises them); the log starts after it.
func begun(t *testing.T, l *commitLog, starts map[int]int64) *committer {
	t.Helper()
	cm := newCommitter(l.commit, l.done, slog.New(slog.NewTextHandler(io.Discard, nil)))
	sp := map[int]startPoint{}
	for id, o := range starts {
		sp[id] = startPoint{offset: o, frontier: o + 1<<20, since: o}
	}
	if err := cm.begin(sp); err != nil {
		t.Fatal(err)
	}
	l.requests, l.positions, l.marks = nil, nil, nil
	return cm
}

func timings(offs ...int64) []Timing {
	var out []Timing
	for _, o := range offs {
		out = append(out, Timing{Fetched: fetchTime(o)})
	}
	return out
}

// TestCommitterOneRequestForAllPartitions: a flush sends one request with
// every partition that progressed since its last commit (and no other),
// and OnCommit gets, per partition, the committed offset and exactly the
// messages it newly covers.
func TestCommitterOneRequestForAllPartitions(t *testing.T) {
	l := newCommitLog()
	cm := begun(t, l, map[int]int64{0: 0, 1: 0, 2: 4})
	cm.flush()
	if len(l.requests) != 0 {
		t.Fatalf("flush with no progress sent %v, want no request", l.requests)
	}
	cm.advance(0, 2, timings(0, 1))
	cm.advance(1, 1, timings(0))
	cm.advance(0, 3, timings(2))
	cm.advance(2, 5, timings(4)) // resumed at a committed offset 4
	cm.flush()
	if want := []map[int]int64{{0: 3, 1: 1, 2: 5}}; !slices.EqualFunc(l.requests, want, maps.Equal) {
		t.Fatalf("requests %v, want %v", l.requests, want)
	}
	cm.advance(1, 4, timings(1, 2, 3))
	cm.flush()
	cm.flush()
	if len(l.requests) != 2 || !maps.Equal(l.requests[1], map[int]int64{1: 4}) {
		t.Fatalf("requests %v, want a second one for partition 1 only, and nothing more", l.requests)
	}
	wantCovered := map[int][][]int64{0: {{0, 1, 2}}, 1: {{0}, {1, 2, 3}}, 2: {{4}}}
	for p, want := range wantCovered {
		if got := l.onDone[p]; !slices.EqualFunc(got, want, slices.Equal) {
			t.Errorf("partition %d: OnCommit covered %v, want %v", p, got, want)
		}
	}
	if got := l.offsets[1]; !slices.Equal(got, []int64{1, 4}) {
		t.Errorf("partition 1: OnCommit offsets %v, want [1 4]", got)
	}
}

// TestCommitterKeepsProgressOfAFailedRequest: a failed request calls no
// OnCommit; the next flush sends the same partitions again (with any
// newer progress) and reports every message since the last success once.
func TestCommitterKeepsProgressOfAFailedRequest(t *testing.T) {
	l := newCommitLog()
	cm := begun(t, l, map[int]int64{0: 0, 1: 0})
	cm.advance(0, 1, timings(0))
	cm.advance(1, 1, timings(0))
	l.failing = true
	cm.flush()
	if len(l.onDone) != 0 {
		t.Fatalf("OnCommit called after a failed commit: %v", l.onDone)
	}
	l.failing = false
	cm.advance(0, 2, timings(1))
	cm.flush()
	want := []map[int]int64{{0: 1, 1: 1}, {0: 2, 1: 1}}
	if !slices.EqualFunc(l.requests, want, maps.Equal) {
		t.Fatalf("requests %v, want %v", l.requests, want)
	}
	if got := l.onDone[0]; !slices.EqualFunc(got, [][]int64{{0, 1}}, slices.Equal) {
		t.Errorf("partition 0: OnCommit covered %v, want [[0 1]]", got)
	}
	if got := l.onDone[1]; !slices.EqualFunc(got, [][]int64{{0}}, slices.Equal) {
		t.Errorf("partition 1: OnCommit covered %v, want [[0]]", got)
	}
}
