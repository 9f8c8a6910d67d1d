package consumer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// TestFailedHandlerRetriesInPlaceWithoutHoldingAWorker: a handler that
// fails before its partition stops is retried with the same message, in
// place (no rebalance, nothing skipped), and during the pause between
// attempts the only worker (Concurrency 1) runs another key's message.
// Everything is committed to the end.
func TestFailedHandlerRetriesInPlaceWithoutHoldingAWorker(t *testing.T) {
	env := newKafkaEnv(t, 1)
	w := env.writer()
	defer w.Close()
	if err := w.WriteMessages(context.Background(),
		kafka.Message{Key: []byte("0/a"), Value: []byte("v")},
		kafka.Message{Key: []byte("0/b"), Value: []byte("v")},
	); err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts = map[string]int{}
		order    []string
	)
	cfg := env.config(t)
	cfg.Concurrency = 1
	cfg.CommitInterval = 50 * time.Millisecond
	r := startConsumer(t, cfg, func(ctx context.Context, msg kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		k := string(msg.Key)
		attempts[k]++
		if k == "0/a" && attempts[k] == 1 {
			order = append(order, "a failed")
			return errors.New("transient, before the partition stopped")
		}
		order = append(order, k+" done")
		return nil
	})
	poll.Until(t, waitLong, "both records committed", func() bool { return committedAtEnd(env.lags(t)) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"a failed", "0/b done", "0/a done"}; !slices.Equal(order, want) {
		t.Errorf("handler calls %v, want %v (b runs on the one worker during a's pause)", order, want)
	}
	if attempts["0/a"] != 2 || attempts["0/b"] != 1 {
		t.Errorf("attempts %v, want a twice and b once", attempts)
	}
}

// TestRetryPauseEndsWhenThePartitionStops: a message waiting out its retry
// pause when its partition stops is abandoned at once, as an in-flight
// handler would be, instead of holding the drain (and with it the
// rebalance or shutdown) until the pause is over: with a DrainTimeout
// shorter than the pause it would otherwise outlast the drain.
func TestRetryPauseEndsWhenThePartitionStops(t *testing.T) {
	logs := testLogger(t)
	c := &Consumer{cfg: Config{Concurrency: 1, Logger: logs.Logger},
		handle: func(context.Context, kafka.Message) error {
			return errors.New("transient, before the partition stopped")
		}}
	stopWorkers := c.startWorkers()
	defer stopWorkers()
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := newPartitionState(c, newCommitter(nil, nil, logs.Logger), nil, 0, logs.Logger, stop, context.WithoutCancel(stop))
	c.pool.Slots <- struct{}{}
	c.pool.Spawn(job{p: p, msg: kafka.Message{Offset: 7}})
	poll.Until(t, retryPause/2, "the handler to fail and its retry to be scheduled", func() bool {
		return logs.count("retrying the message in place") > 0
	})
	cancel()
	select {
	case <-p.done.ready:
		got := p.done.take(nil)
		if len(got) != 1 || got[0].err == nil || got[0].msg.Offset != 7 {
			t.Errorf("verdicts %+v, want offset 7 abandoned with an error", got)
		}
	case <-time.After(retryPause / 2):
		<-p.done.ready // before stopWorkers closes the jobs channel the pause sends on
		t.Fatalf("the message still waited out its %v retry pause %v after its partition stopped", retryPause, retryPause/2)
	}
}
