package replay

import (
	"context"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
)

// ReadBacklog counts what the replay group has not consumed, dates the
// oldest of it by its record timestamp, and reads the topic's retention;
// after a replay the backlog is empty.
func TestReadBacklog(t *testing.T) {
	env := newReplayEnv(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A topic just created may not have its leaders yet: the backlog loop
	// retries on its interval, the test polls.
	var b dlq.Backlog
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if b, err = dlq.ReadBacklog(ctx, env.client, env.dlq, env.group); err == nil {
			break
		}
	}
	if err != nil || b.Records != 0 || !b.Oldest.IsZero() {
		t.Fatalf("empty topic: %+v, %v; want no records", b, err)
	}
	oldest := deadLetter(env.source("a"), dlq.Exhausted)
	oldest.Time = time.Now().Add(-time.Hour) // the record timestamp the producer sets
	env.produce(t, 0, oldest, deadLetter(env.source("b"), dlq.Invalid))
	env.produce(t, 1, deadLetter(env.source("c"), dlq.Exhausted))
	b, err = dlq.ReadBacklog(ctx, env.client, env.dlq, env.group)
	if err != nil {
		t.Fatal(err)
	}
	if b.Records != 3 {
		t.Errorf("Records = %d, want 3", b.Records)
	}
	if d := b.Oldest.Sub(oldest.Time); d < -time.Millisecond || d > time.Millisecond {
		t.Errorf("Oldest = %v, want the timestamp of the oldest record, %v", b.Oldest, oldest.Time)
	}
	if b.Retention <= 0 {
		t.Errorf("Retention = %v, want the topic's retention.ms (the broker's default is finite)", b.Retention)
	}

	// The default replay takes the exhausted records only: the invalid
	// one stays in the backlog (a replay once marked it replayed, and the
	// retention alert went blind), dated by its own timestamp.
	env.mustRun(t, Options{})
	b, err = dlq.ReadBacklog(ctx, env.client, env.dlq, env.group)
	if err != nil || b.Records != 1 || b.Oldest.IsZero() || !b.Oldest.After(oldest.Time.Add(time.Minute)) {
		t.Errorf("after the default replay: %+v, %v; want the invalid record left", b, err)
	}
	env.mustRun(t, Options{Reason: dlq.Invalid})
	b, err = dlq.ReadBacklog(ctx, env.client, env.dlq, env.group)
	if err != nil || b.Records != 0 || !b.Oldest.IsZero() {
		t.Errorf("after replaying the invalid one too: %+v, %v; want no records", b, err)
	}
}
