package consumer

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fetchTime is the fetch time the tests give offset o, so the times done
// returns name the offsets they belong to.
func fetchTime(o int64) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(o) * time.Second)
}

func offsetsOf(times []Timing) []int64 {
	var out []int64
	for _, at := range times {
		out = append(out, int64(at.Fetched.Sub(fetchTime(0))/time.Second))
	}
	return out
}

// op is one call on the tracker and what must hold after it.
type op struct {
	fetch     []int64 // fetched, in order
	done      *int64  // done(offset)
	committed *int64  // the owner records a successful commit of this offset
	// after the call:
	wantAdvanced []int64 // offsets whose fetch times done returned (done only)
	wantNext     int64
	wantAhead    bool
	wantInFlight int
}

func ptr(o int64) *int64 { return &o }

func fetch(offs ...int64) op { return op{fetch: offs} }
func done(o int64) op        { return op{done: ptr(o)} }
func committed(o int64) op   { return op{committed: ptr(o)} }

// want sets the expectations of o.
func (o op) want(next int64, ahead bool, inFlight int, advanced ...int64) op {
	o.wantNext, o.wantAhead, o.wantInFlight, o.wantAdvanced = next, ahead, inFlight, advanced
	return o
}

func TestOffsets(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
	}{
		{"nothing fetched", []op{
			fetch().want(-1, false, 0),
		}},
		{"fetched, nothing done", []op{
			fetch(0, 1, 2).want(-1, false, 3),
		}},
		{"in order", []op{
			fetch(0, 1, 2).want(-1, false, 3),
			done(0).want(1, true, 2, 0),
			done(1).want(2, true, 1, 1),
			done(2).want(3, true, 0, 2),
		}},
		{"resumes at a committed offset", []op{
			fetch(100, 101).want(-1, false, 2),
			done(100).want(101, true, 1, 100),
			done(101).want(102, true, 0, 101),
		}},
		{"out of order: nothing committable until the lowest is done", []op{
			fetch(0, 1, 2, 3).want(-1, false, 4),
			done(2).want(-1, false, 3),
			done(1).want(-1, false, 2),
			done(0).want(3, true, 1, 0, 1, 2),
			done(3).want(4, true, 0, 3),
		}},
		{"out of order mid-stream: never passes an unfinished offset", []op{
			fetch(10, 11, 12, 13).want(-1, false, 4),
			done(10).want(11, true, 3, 10),
			done(12).want(11, true, 2),
			done(13).want(11, true, 1),
			done(11).want(14, true, 0, 11, 12, 13),
		}},
		{"gaps from compaction, in order", []op{
			fetch(5, 7, 10).want(-1, false, 3),
			// Nothing lives between 5 and 7: committing 7 skips no record.
			done(5).want(7, true, 2, 5),
			done(7).want(10, true, 1, 7),
			done(10).want(11, true, 0, 10),
		}},
		{"gaps from compaction, out of order", []op{
			fetch(5, 7, 10).want(-1, false, 3),
			done(10).want(-1, false, 2),
			done(5).want(7, true, 1, 5),
			done(7).want(11, true, 0, 7, 10),
		}},
		{"committable only ahead of the last commit", []op{
			fetch(0, 1, 2).want(-1, false, 3),
			done(0).want(1, true, 2, 0),
			committed(1).want(1, false, 2),
			done(2).want(1, false, 1),
			done(1).want(3, true, 0, 1, 2),
			committed(3).want(3, false, 0),
		}},
		{"fetch after everything was done", []op{
			fetch(0).want(-1, false, 1),
			done(0).want(1, true, 0, 0),
			committed(1).want(1, false, 0),
			fetch(1, 2).want(1, false, 2),
			done(2).want(1, false, 1),
			done(1).want(3, true, 0, 1, 2),
		}},
		{"fetches interleaved with completions", []op{
			fetch(0, 1).want(-1, false, 2),
			done(1).want(-1, false, 1),
			fetch(2).want(-1, false, 2),
			done(0).want(2, true, 1, 0, 1),
			fetch(3).want(2, true, 2),
			done(3).want(2, true, 1),
			done(2).want(4, true, 0, 2, 3),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := newOffsets()
			for i, step := range tt.ops {
				var advanced []int64
				switch {
				case step.fetch != nil:
					for _, f := range step.fetch {
						o.fetched(f, Timing{Fetched: fetchTime(f)}, 100+f)
					}
				case step.done != nil:
					timings, cost := o.done(*step.done, nil)
					advanced = offsetsOf(timings)
					if cost != 100+*step.done {
						t.Errorf("step %d: done(%d) returned the cost %d, want the %d fetched recorded", i, *step.done, cost, 100+*step.done)
					}
				case step.committed != nil:
					o.committed = *step.committed
				}
				if !slices.Equal(advanced, step.wantAdvanced) {
					t.Errorf("step %d: done returned the fetch times of %v, want %v", i, advanced, step.wantAdvanced)
				}
				next, ahead := o.committable()
				if next != step.wantNext || ahead != step.wantAhead {
					t.Errorf("step %d: committable() = %d, %v; want %d, %v", i, next, ahead, step.wantNext, step.wantAhead)
				}
				if got := undone(o); got != step.wantInFlight {
					t.Errorf("step %d: %d entries not done, want %d", i, got, step.wantInFlight)
				}
			}
		})
	}
}

// TestOffsetsRandomCompletion completes random offset lists (with gaps) in
// random orders, committing now and then, and checks after every step that
// the committable offset is the lowest unfinished one (or one past the
// highest when all are done), and that done hands out each fetch time
// exactly once, in offset order.
func TestOffsetsRandomCompletion(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 500 {
		var fetched []int64
		off := int64(rng.IntN(1000))
		for range 1 + rng.IntN(30) {
			fetched = append(fetched, off)
			off += 1 + int64(rng.IntN(3)) // gaps of 0, 1 or 2 offsets
		}
		o := newOffsets()
		for _, f := range fetched {
			o.fetched(f, Timing{Fetched: fetchTime(f)}, 1)
		}
		isDone := map[int64]bool{}
		var handedOut []int64
		for _, i := range rng.Perm(len(fetched)) {
			timings, _ := o.done(fetched[i], nil)
			handedOut = append(handedOut, offsetsOf(timings)...)
			isDone[fetched[i]] = true

			want := int64(-1)
			for j, f := range fetched {
				if !isDone[f] {
					if j > 0 {
						want = f
					}
					break
				}
				want = f + 1
			}
			next, ahead := o.committable()
			if next != want {
				t.Fatalf("round %d: fetched %v, done %v: committable %d, want %d", round, fetched, isDone, next, want)
			}
			if ahead != (next > o.committed) {
				t.Fatalf("round %d: ahead = %v with next %d and committed %d", round, ahead, next, o.committed)
			}
			if ahead && rng.IntN(2) == 0 {
				o.committed = next
			}
		}
		if !slices.Equal(handedOut, fetched) {
			t.Fatalf("round %d: done handed out fetch times of %v, want each of %v once, in order", round, handedOut, fetched)
		}
		if n := undone(o); n != 0 {
			t.Fatalf("round %d: %d entries not done after all done", round, n)
		}
	}
}

// undone counts the messages o tracks that are not done.
func undone(o *offsets) int {
	n := 0
	for _, p := range o.pending.Items() {
		if !p.done {
			n++
		}
	}
	return n
}
