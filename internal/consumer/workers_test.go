package consumer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/poll"
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
