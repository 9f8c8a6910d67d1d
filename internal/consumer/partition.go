package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// completion is a handler's verdict on one message.
type completion struct {
	msg kafka.Message
	err error
}

// consumePartition reads one partition from offset until stop ends and
// hands each message to the handler: messages with the same key one at a
// time in offset order, messages with different keys concurrently (bounded
// by the consumer-wide Concurrency). It commits the contiguous finished
// prefix through gen, on CommitInterval and once more at the end.
//
// Only this goroutine touches the partition's state (offsets, key queues);
// handlers report back on a channel.
func (c *Consumer) consumePartition(stop context.Context, gen *kafka.Generation, partition int, offset int64) {
	log := c.cfg.Logger.With("topic", c.cfg.Topic, "partition", partition)
	r, err := kafkagroup.OpenPartition(kafkagroup.ReaderConfig{Brokers: c.cfg.Brokers, Topic: c.cfg.Topic,
		Partition: partition, Dialer: c.cfg.Dialer, MaxBytes: c.cfg.MaxBytes, Logger: log}, offset)
	if err != nil {
		log.Error("set start offset", "offset", offset, "err", err)
		return
	}
	defer r.Close()

	// work is the handlers' context: it outlives stop by DrainTimeout, so
	// in-flight charges can finish and be committed during a rebalance or
	// shutdown instead of being abandoned half-way.
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

	p := &partitionState{
		c: c, gen: gen, partition: partition, log: log, stop: stop, work: work,
		offs: newOffsets(),
		keys: map[string][]kafka.Message{},
		done: make(chan completion, c.cfg.PartitionWindow),
	}
	fetched, stopFetch := p.fetch(r)
	defer stopFetch() // before the reader closes

	var tick <-chan time.Time
	if c.cfg.CommitInterval > 0 {
		t := time.NewTicker(c.cfg.CommitInterval)
		defer t.Stop()
		tick = t.C
	}
	for p.run(fetched, tick) {
	}
	// Revoked or shutting down: start nothing new, let what runs finish
	// (DrainTimeout bounds it through work), commit what finished.
	stopFetch()
	for p.running > 0 {
		p.complete(<-p.done)
	}
	p.commit()
}

// partitionState is the bookkeeping of one partition's consumption.
type partitionState struct {
	c         *Consumer
	gen       *kafka.Generation
	partition int
	log       *slog.Logger
	stop      context.Context
	work      context.Context

	offs        *offsets
	uncommitted []Timing // of the messages done since the last commit
	// keys holds, for each key with a message running, the messages of
	// that key waiting behind it, in offset order.
	keys map[string][]kafka.Message
	// ready holds messages free to start, in offset order, waiting for a
	// Concurrency slot: with one slot, a partition runs strictly in order.
	ready   []kafka.Message
	running int // handlers started and not yet completed
	done    chan completion
}

// run handles one event of the partition loop and reports whether the
// loop goes on.
func (p *partitionState) run(fetched <-chan kafka.Message, tick <-chan time.Time) bool {
	// A full window stops reading: memory stays bounded, and Kafka keeps
	// what has not been fetched.
	if p.offs.window() >= p.c.cfg.PartitionWindow {
		fetched = nil
	}
	var slot chan<- struct{}
	if len(p.ready) > 0 {
		slot = p.c.slots
	}
	select {
	case slot <- struct{}{}:
		msg := p.ready[0]
		p.ready = p.ready[1:]
		p.start(msg)
	case <-p.stop.Done():
		return false
	case <-tick:
		p.commit()
	case c := <-p.done:
		p.complete(c)
	case msg, ok := <-fetched:
		if !ok || p.stop.Err() != nil {
			return false // never start a message after the partition was revoked
		}
		p.offs.fetched(msg.Offset, Timing{Produced: msg.Time, Fetched: time.Now()})
		k, ordered := orderKey(msg)
		if !ordered {
			p.ready = append(p.ready, msg)
			break
		}
		if waiting, busy := p.keys[k]; busy {
			p.keys[k] = append(waiting, msg)
			break
		}
		p.keys[k] = nil
		p.ready = append(p.ready, msg)
	}
	return true
}

// orderKey is the key whose messages must be handled one at a time. A
// record without a key has no order to keep: it runs on its own (the
// ledger still serializes two events of one order).
func orderKey(msg kafka.Message) (string, bool) {
	return string(msg.Key), len(msg.Key) > 0
}

// start runs msg's handler in a goroutine holding the slot taken for it.
func (p *partitionState) start(msg kafka.Message) {
	p.running++
	go func() {
		err := p.c.handleInPlace(p.stop, p.work, msg, p.log)
		p.c.release()
		p.done <- completion{msg: msg, err: err}
	}()
}

// complete records a handler's verdict and starts the next message of the
// same key. An error means the message was abandoned (the partition is
// stopping): it stays uncommitted, and so does everything after it.
func (p *partitionState) complete(c completion) {
	p.running--
	if c.err != nil {
		p.log.Info("message abandoned, it will be redelivered", "offset", c.msg.Offset, "err", c.err)
	} else {
		p.uncommitted = append(p.uncommitted, p.offs.done(c.msg.Offset)...)
		if p.c.cfg.CommitInterval == 0 {
			p.commit()
		}
	}
	k, ordered := orderKey(c.msg)
	if !ordered {
		return
	}
	waiting := p.keys[k]
	if len(waiting) == 0 || p.stop.Err() != nil {
		delete(p.keys, k)
		return
	}
	p.keys[k] = waiting[1:]
	p.ready = append(p.ready, waiting[0])
}

func (p *partitionState) commit() {
	next, ahead := p.offs.committable()
	if !ahead {
		return
	}
	if err := p.c.commit(p.gen, p.partition, next); err != nil {
		p.log.Warn("offset commit failed; the messages will be redelivered if it never succeeds", "offset", next, "err", err)
		return
	}
	p.offs.committed = next
	if p.c.cfg.OnCommit != nil {
		p.c.cfg.OnCommit(p.partition, next, p.uncommitted)
	}
	p.uncommitted = nil
}

// fetch reads the partition in its own goroutine, so that completions and
// interval commits go on while no message arrives. stopFetch ends it and
// waits for it.
func (p *partitionState) fetch(r *kafka.Reader) (<-chan kafka.Message, func()) {
	fetched := make(chan kafka.Message)
	ctx, cancel := context.WithCancel(p.stop)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		defer close(fetched)
		for {
			msg, err := r.FetchMessage(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Warn("fetch failed", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(250 * time.Millisecond):
				}
				continue
			}
			select {
			case fetched <- msg:
			case <-ctx.Done():
				return
			}
		}
	}()
	return fetched, func() { cancel(); <-finished }
}

// handleInPlace runs the handler, holding a Concurrency slot, until it
// succeeds or stop ends, and returns with the slot held. The handler fails
// only when its context ends; should it fail earlier, the same message is
// retried here after a pause (without its slot) rather than by ending the
// generation, which would rebalance the whole group for one message.
func (c *Consumer) handleInPlace(stop, work context.Context, msg kafka.Message, log *slog.Logger) error {
	for {
		err := c.handle(work, msg)
		if err == nil || stop.Err() != nil || work.Err() != nil {
			return err
		}
		log.Error("handler failed, retrying the message in place", "offset", msg.Offset, "err", err)
		c.release()
		select {
		case <-stop.Done():
		case <-time.After(time.Second):
		}
		c.slots <- struct{}{} // held again on return, as the caller expects
		if stop.Err() != nil {
			return err
		}
	}
}

func (c *Consumer) release() { <-c.slots }

// commit commits next (the offset of the next message to consume) for
// partition, bounded by CommitTimeout.
func (c *Consumer) commit(gen *kafka.Generation, partition int, next int64) error {
	return kafkagroup.Commit(gen, c.cfg.Topic, partition, next, c.cfg.CommitTimeout)
}
