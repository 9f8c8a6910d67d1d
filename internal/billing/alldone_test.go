package billing

import (
	"context"
	"testing"
	"time"
)

// allDone's context ends once every request's context has ended, not
// before, however many requests share one (the events of a partition share
// theirs), and its cancel ends it at once.
func TestAllDoneEndsWithTheLastContext(t *testing.T) {
	partA, cancelA := context.WithCancel(context.Background())
	partB, cancelB := context.WithCancel(context.Background())
	own, cancelOwn := context.WithCancel(partA)
	batch := []request{{ctx: partA}, {ctx: context.WithValue(partA, attemptKey{}, nil)}, {ctx: partB}, {ctx: own}, {ctx: partB}}
	ctx, stop := allDone(batch)
	defer stop()
	for i, end := range []func(){cancelOwn, cancelB, cancelA} {
		select { // the watches run on goroutines of their own: give them time
		case <-ctx.Done():
			t.Fatalf("ended after %d of 3 distinct contexts ended", i)
		case <-time.After(50 * time.Millisecond):
		}
		end()
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not ended after every request's context ended")
	}
	ctx2, stop2 := allDone([]request{{ctx: context.Background()}, {ctx: context.Background()}})
	stop2()
	if ctx2.Err() == nil {
		t.Fatal("its cancel did not end it")
	}
}
