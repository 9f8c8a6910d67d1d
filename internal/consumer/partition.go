package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// consumePartition reads one partition from offset until stop ends, hands
// each message to the handler and commits the finished prefix through gen.
func (c *Consumer) consumePartition(stop context.Context, gen *kafka.Generation, partition int, offset int64) {
	log := c.cfg.Logger.With("topic", c.cfg.Topic, "partition", partition)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   c.cfg.Brokers,
		Topic:     c.cfg.Topic,
		Partition: partition,
		Dialer:    c.cfg.Dialer,
		MinBytes:  1,
		MaxBytes:  c.cfg.MaxBytes,
		MaxWait:   250 * time.Millisecond,
		// The group's lag comes from WatchLag; the reader's own per
		// partition lag poller would only add load and noise.
		ReadLagInterval: -1,
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			log.Warn("kafka reader", "detail", fmt.Sprintf(msg, args...))
		}),
	})
	defer r.Close()
	if err := r.SetOffset(offset); err != nil {
		log.Error("set start offset", "offset", offset, "err", err)
		return
	}

	// work is the handlers' context: it outlives stop by DrainTimeout, so
	// an in-flight charge can finish and be committed during a rebalance
	// or shutdown instead of being abandoned half-way.
	work, cancelWork := context.WithCancel(context.WithoutCancel(stop))
	defer cancelWork()
	go func() {
		<-stop.Done()
		select {
		case <-time.After(c.cfg.DrainTimeout):
			cancelWork()
		case <-work.Done():
		}
	}()

	offs := newOffsets()
	var uncommitted []time.Time
	commit := func() {
		next, ahead := offs.committable()
		if !ahead {
			return
		}
		if err := c.commit(gen, partition, next); err != nil {
			log.Warn("offset commit failed; the messages will be redelivered if it never succeeds", "offset", next, "err", err)
			return
		}
		offs.committed = next
		if c.cfg.OnCommit != nil {
			c.cfg.OnCommit(partition, next, uncommitted)
		}
		uncommitted = nil
	}
	defer commit()

	// The reader fetches in its own goroutine so that the interval commit
	// runs while the partition is idle.
	fetched := make(chan kafka.Message)
	fetchCtx, stopFetch := context.WithCancel(stop)
	fetcherDone := make(chan struct{})
	defer func() { stopFetch(); <-fetcherDone }() // before the reader closes
	go func() {
		defer close(fetcherDone)
		defer close(fetched)
		for {
			msg, err := r.FetchMessage(fetchCtx)
			if err != nil {
				if fetchCtx.Err() != nil {
					return
				}
				log.Warn("fetch failed", "err", err)
				select {
				case <-fetchCtx.Done():
					return
				case <-time.After(250 * time.Millisecond):
				}
				continue
			}
			select {
			case fetched <- msg:
			case <-fetchCtx.Done():
				return
			}
		}
	}()
	var tick <-chan time.Time
	if c.cfg.CommitInterval > 0 {
		t := time.NewTicker(c.cfg.CommitInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-stop.Done():
			return
		case <-tick:
			commit()
		case msg, ok := <-fetched:
			if !ok || stop.Err() != nil {
				return // never start a message after the partition was revoked
			}
			offs.fetched(msg.Offset, time.Now())
			if err := c.handleInPlace(stop, work, msg, log); err != nil {
				log.Info("message abandoned, it will be redelivered", "offset", msg.Offset, "err", err)
				return
			}
			uncommitted = append(uncommitted, offs.done(msg.Offset)...)
			if c.cfg.CommitInterval == 0 {
				commit()
			}
		}
	}
}

// handleInPlace runs the handler until it succeeds or stop ends. The
// handler fails only when its context ends; should it fail earlier, the
// same message is retried here after a pause rather than by ending the
// generation, which would rebalance the whole group for one message.
func (c *Consumer) handleInPlace(stop, work context.Context, msg kafka.Message, log *slog.Logger) error {
	for {
		err := c.handle(work, msg)
		if err == nil || stop.Err() != nil || work.Err() != nil {
			return err
		}
		log.Error("handler failed, retrying the message in place", "offset", msg.Offset, "err", err)
		select {
		case <-stop.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// commit commits next (the offset of the next message to consume) for
// partition, bounded by CommitTimeout.
func (c *Consumer) commit(gen *kafka.Generation, partition int, next int64) error {
	done := make(chan error, 1)
	go func() {
		done <- gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: {partition: next}})
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(c.cfg.CommitTimeout):
		return errors.New("offset commit timed out")
	}
}
