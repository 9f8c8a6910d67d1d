package consumer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// deepStack uses about n KiB of stack, like a handler running through the
// net/http and JSON call chains.
//
//go:noinline
func deepStack(n int) byte {
	var buf [1024]byte
	buf[n%1024] = byte(n)
	if n > 0 {
		return deepStack(n-1) + buf[0]
	}
	return buf[0]
}

// BenchmarkDispatch measures the partition loop's cost per message: fetch,
// key queue, start on a Concurrency slot, completion, offsets. The
// handler is a no-op or grows a 16 KiB stack.
func BenchmarkDispatch(b *testing.B) {
	for _, stackKiB := range []int{0, 16} {
		for _, keys := range []int{1, 1024} {
			b.Run(fmt.Sprintf("stack=%dKiB/keys=%d", stackKiB, keys), func(b *testing.B) {
				benchDispatch(b, keys, func(ctx context.Context, msg kafka.Message) error {
					if stackKiB > 0 {
						deepStack(stackKiB)
					}
					return nil
				})
			})
		}
	}
}

func benchDispatch(b *testing.B, keys int, handle Handler) {
	c, err := New(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "t", GroupID: "g", Concurrency: 64,
		CommitInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, handle)
	if err != nil {
		b.Fatal(err)
	}
	keyBytes := make([][]byte, keys)
	for i := range keyBytes {
		keyBytes[i] = fmt.Appendf(nil, "k%d", i)
	}
	run := newBenchPartition(b, c)
	b.ReportAllocs()
	b.ResetTimer()
	run(b.N, keyBytes)
}

// newBenchPartition returns a function that runs n messages with the given
// keys through one partition's loop and the workers, without a broker.
func newBenchPartition(b *testing.B, c *Consumer) func(n int, keys [][]byte) {
	return func(n int, keys [][]byte) {
		stopWorkers := c.startWorkers()
		defer stopWorkers()
		stop, cancel := context.WithCancel(context.Background())
		defer cancel()
		cm := newCommitter(func(map[int]int64, map[int]kafkagroup.MarkedOffset) error { return nil }, nil, c.cfg.Logger)
		if err := cm.begin(map[int]startPoint{0: {offset: 0, frontier: minWindow}}); err != nil {
			b.Fatal(err)
		}
		go func() { // the commit loop's answer to a partition at its frontier
			for {
				select {
				case <-cm.urge:
					cm.flush()
				case <-stop.Done():
					return
				}
			}
		}()
		bud := newBudget(c.cfg.MaxInFlightBytes, c.cfg.maxCost(), []int{0})
		p := newPartitionState(c, cm, bud, 0, c.cfg.Logger, stop, stop)
		fetched := make(chan fetchedMsg)
		go func() {
			for i := range n {
				msg := kafka.Message{Partition: 0, Offset: int64(i), Key: keys[i%len(keys)]}
				cost := bud.cost(msg)
				if bud.acquire(stop, 0, cost) != nil {
					return
				}
				fetched <- fetchedMsg{msg: msg, cost: cost}
			}
		}()
		for i := 0; p.offs.next < int64(n); i++ {
			p.run(fetched)
			if i%1024 == 0 {
				cm.tick() // as the commit loop would, now and then
			}
		}
	}
}
