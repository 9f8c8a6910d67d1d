package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// consumePartition reads one partition from offset until stop ends and
// hands each message to the consumer's workers: messages with the same key
// one at a time in offset order, messages with different keys concurrently
// (bounded by the Concurrency workers shared by all partitions). It reports
// the contiguous finished prefix to cm (which commits it), and returns once
// every message it handed out has completed. It reports false when the
// partition could not be read at all.
//
// Only this goroutine touches the partition's state (offsets, key queues);
// workers report back on a channel.
func (c *Consumer) consumePartition(stop context.Context, cm *committer, partition int, offset int64) bool {
	log := c.cfg.Logger.With("topic", c.cfg.Topic, "partition", partition)
	r, err := kafkagroup.OpenPartition(kafkagroup.ReaderConfig{Brokers: c.cfg.Brokers, Topic: c.cfg.Topic,
		Partition: partition, Dialer: c.cfg.Dialer, MaxBytes: c.cfg.MaxBytes, Logger: log}, offset)
	if err != nil {
		log.Error("set start offset", "offset", offset, "err", err)
		return false
	}
	defer r.Close()

	// work is the handlers' context: it outlives stop by DrainTimeout, so
	// in-flight charges can finish and be committed during a rebalance or
	// shutdown instead of being abandoned half-way.
	work, cancelWork := context.WithCancel(context.WithoutCancel(stop))
	defer cancelWork()
	stopDrainTimer := context.AfterFunc(stop, func() {
		t := time.AfterFunc(c.cfg.DrainTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopDrainTimer()

	p := newPartitionState(c, cm, partition, log, stop, work)
	fetched, stopFetch := p.fetch(r)
	defer stopFetch() // before the reader closes

	for p.run(fetched) {
	}
	// Revoked or shutting down: start nothing new, let what runs finish
	// (DrainTimeout bounds it through work), hand over what finished.
	stopFetch()
	for p.running > 0 {
		p.complete(<-p.done)
	}
	return true
}

// partitionState is the bookkeeping of one partition's consumption.
// trackedPerWindow bounds the messages a partition tracks, done or not,
// to that many windows: at 1,024 a window, 32 Ki entries of 32 bytes (1
// MiB), about 15 s of a partition draining a backlog at full speed behind
// one waiting message (parked only after BILLING_PARK_AFTER). Past it the
// partition stops fetching until the waiting message finishes.
const trackedPerWindow = 32

type partitionState struct {
	c         *Consumer
	cm        *committer
	partition int
	log       *slog.Logger
	stop      context.Context
	work      context.Context

	offs     *offsets
	advanced []Timing // scratch: the timings offs.done returned last
	// keys holds, for each key with a message running, the messages of
	// that key waiting behind it, in offset order.
	keys map[string][]kafka.Message
	// ready holds messages free to start, in offset order, waiting for an
	// idle worker: with one worker, a partition runs strictly in order.
	ready   []kafka.Message
	running int // messages handed to workers and not yet completed
	// done receives the workers' verdicts; it holds a full window, so a
	// worker never waits to report.
	done chan completion
}

func newPartitionState(c *Consumer, cm *committer, partition int, log *slog.Logger, stop, work context.Context) *partitionState {
	return &partitionState{
		c: c, cm: cm, partition: partition, log: log, stop: stop, work: work,
		offs: newOffsets(),
		keys: map[string][]kafka.Message{},
		done: make(chan completion, c.cfg.PartitionWindow),
	}
}

// run handles one event of the partition loop and reports whether the
// loop goes on.
func (p *partitionState) run(fetched <-chan kafka.Message) bool {
	// A full window stops reading: memory stays bounded, and Kafka keeps
	// what has not been fetched. The window counts the messages not yet
	// done; those done behind an unfinished one cost an entry of offsets
	// each, bounded by trackedPerWindow windows.
	if p.offs.inFlight() >= p.c.cfg.PartitionWindow || p.offs.tracked() >= trackedPerWindow*p.c.cfg.PartitionWindow {
		fetched = nil
	}
	var jobs chan<- job
	var next job
	// resumed is the Gate while a pause holds back the ready records.
	var resumed <-chan struct{}
	if len(p.ready) > 0 {
		if resumed = p.pausedGate(); resumed == nil {
			jobs, next = p.c.jobs, job{p: p, msg: p.ready[0]}
		}
	}
	select {
	case <-resumed:
	case jobs <- next:
		p.ready = p.ready[1:]
		p.running++
	case <-p.stop.Done():
		return false
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

// complete records a worker's verdict and frees the next message of the
// same key. An error means the message was abandoned (the partition is
// stopping): it stays uncommitted, and so does everything after it.
func (p *partitionState) complete(c completion) {
	p.running--
	if c.err != nil {
		p.log.Info("message abandoned, it will be redelivered", "offset", c.msg.Offset, "err", c.err)
	} else {
		p.advanced = p.offs.done(c.msg.Offset, p.advanced[:0])
		if next, ahead := p.offs.committable(); ahead {
			p.cm.advance(p.partition, next, p.advanced)
			p.offs.committed = next
			// A waiting record that finishes (parked, at last) releases
			// the records done behind it, which have waited long enough
			// already: a window's worth or more is committed at once, not
			// at the next tick.
			if p.c.cfg.CommitInterval == 0 || len(p.advanced) >= p.c.cfg.PartitionWindow {
				p.cm.flush()
			}
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
			if !p.gateOpen(ctx) {
				return
			}
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
			// A pause that began while the fetch waited holds the
			// record back: it is not started, and if the partition is
			// revoked meanwhile it is redelivered.
			if !p.gateOpen(ctx) {
				return
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

// pausedGate returns the consumer's Gate when it is closed (a pause), nil
// when records may start.
func (p *partitionState) pausedGate() <-chan struct{} {
	if p.c.cfg.Gate == nil {
		return nil
	}
	g := p.c.cfg.Gate()
	select {
	case <-g:
		return nil
	default:
		return g
	}
}

// gateOpen waits while the consumer's Gate says fetching is paused and
// reports false when ctx ended first.
func (p *partitionState) gateOpen(ctx context.Context) bool {
	if p.c.cfg.Gate == nil {
		return true
	}
	select {
	case <-p.c.cfg.Gate():
		return true
	case <-ctx.Done():
		return false
	}
}
