package consumer

import (
	"cmp"
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// consumePartition reads one partition from offset until stop ends and
// hands each message to the consumer's workers: messages with the same key
// one at a time in offset order, messages with different keys concurrently
// (bounded by the Concurrency workers shared by all partitions). It reports
// the contiguous finished prefix to cm (which commits it), and returns once
// every message it handed out has completed. It reports true: its fetcher
// retries a partition it cannot read rather than give it up.
//
// Only this goroutine touches the partition's state (offsets, key queues);
// workers report back on a channel.
func (c *Consumer) consumePartition(stop, genWork context.Context, cm *committer, b *budget, partition int, offset int64) bool {
	log := c.cfg.Logger.With("topic", c.cfg.Topic, "partition", partition)
	// work is the handlers' context: it outlives stop by DrainTimeout, so
	// in-flight charges can finish and be committed during a rebalance or
	// shutdown instead of being abandoned half-way (unless Abandon cancels
	// genWork).
	work, cancelWork := context.WithCancel(genWork)
	defer cancelWork()
	stopDrainTimer := context.AfterFunc(stop, func() {
		t := time.AfterFunc(c.cfg.DrainTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stopDrainTimer()

	p := newPartitionState(c, cm, b, partition, log, stop, work)
	defer b.releaseAll(partition)
	fetched, stopFetch := p.fetch(offset)
	defer stopFetch()

	for p.run(fetched) {
	}
	// Revoked or shutting down: start nothing new, let what runs finish
	// (DrainTimeout bounds it through work), hand over what finished.
	stopFetch()
	for p.running > 0 {
		<-p.done.ready
		p.completeAll()
	}
	return true
}

// partitionState is the bookkeeping of one partition's consumption.
type partitionState struct {
	c         *Consumer
	cm        *committer
	budget    *budget
	partition int
	log       *slog.Logger
	stop      context.Context
	work      context.Context

	offs     *offsets
	advanced []Timing     // scratch: the timings offs.done returned last
	verdicts []completion // scratch: the completions taken from done last
	// keys holds, for each key with a message running, the messages of
	// that key waiting behind it, in offset order; keysPeak is the most
	// keys it held since it was last rebuilt (see forget).
	keys     map[string]fifo[kafka.Message]
	keysPeak int
	// ready holds messages free to start, in offset order, waiting for an
	// idle worker: with one worker, a partition runs strictly in order.
	ready   fifo[kafka.Message]
	running int // messages handed to workers and not yet completed
	// done receives the workers' verdicts; a worker never waits to
	// report.
	done *inbox
	// lane is the partition's frontier, shared with the committer;
	// frontier its last value read (records below it may start), reach
	// the value last reported to lane.reach.
	lane            *lane
	frontier, reach int64
	// soon is the lane's soon read with frontier; urged is set once the
	// partition asked for the raise past it.
	soon  int64
	urged bool
}

func newPartitionState(c *Consumer, cm *committer, b *budget, partition int, log *slog.Logger, stop, work context.Context) *partitionState {
	lane := cm.lane(partition)
	return &partitionState{
		c: c, cm: cm, budget: b, partition: partition, log: log, stop: stop, work: work,
		offs: newOffsets(),
		keys: map[string]fifo[kafka.Message]{},
		done: newInbox(),
		lane: lane,
		// The generation's first commit set both before the partition
		// started.
		frontier: lane.frontier.Load(), reach: lane.reach.Load(), soon: lane.soon.Load(),
	}
}

// completeAll records every verdict the workers have reported.
func (p *partitionState) completeAll() {
	p.verdicts = p.done.take(p.verdicts)
	for _, c := range p.verdicts {
		p.complete(c)
	}
	p.verdicts = emptied(p.verdicts) // the messages are done with
}

// run handles one event of the partition loop and reports whether the
// loop goes on.
//
// The budget bounds what is fetched: the fetch goroutine charges each
// record before handing it over (see fetch), and complete gives it back.
func (p *partitionState) run(fetched <-chan fetchedMsg) bool {
	var jobs chan<- job
	var spawn chan<- struct{}
	var next job
	// resumed is what the ready records wait for while they are held
	// back (see blocked).
	var resumed <-chan struct{}
	if p.ready.Len() > 0 {
		first := p.ready.Items()[0]
		if resumed = p.blocked(first.Offset); resumed == nil {
			next = job{p: p, msg: first}
			// An idle worker first; a new one only when none is idle.
			select {
			case p.c.pool.Jobs <- next:
				p.started()
				return true
			default:
			}
			jobs, spawn = p.c.pool.Jobs, p.c.pool.Slots
		}
	}
	select {
	case <-resumed:
	case jobs <- next:
		p.started()
	case spawn <- struct{}{}:
		p.c.pool.Spawn(next)
		p.started()
	case <-p.stop.Done():
		return false
	case <-p.done.ready:
		p.completeAll()
	case f, ok := <-fetched:
		if !ok || p.stop.Err() != nil {
			if ok {
				p.budget.release(p.partition, f.cost)
			}
			return false // never start a message after the partition was revoked
		}
		msg := f.msg
		p.offs.fetched(msg.Offset, Timing{Produced: msg.Time, Fetched: time.Now()}, f.cost)
		k, ordered := orderKey(msg)
		if !ordered {
			p.ready.Push(msg)
			break
		}
		if waiting, busy := p.keys[k]; busy {
			waiting.Push(msg)
			p.keys[k] = waiting
			break
		}
		p.keys[k] = fifo[kafka.Message]{}
		p.keysPeak = max(p.keysPeak, len(p.keys))
		p.ready.Push(msg)
	}
	return true
}

// started records that the first ready message went to a worker.
func (p *partitionState) started() {
	if next := p.ready.Items()[0].Offset + 1; next > p.reach {
		p.reach = next
		p.lane.reach.Store(next)
	}
	p.ready.Pop(1)
	p.running++
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
// releaseFlush is how many records one completion must make committable
// to be committed at once rather than at the next commit tick.
const releaseFlush = 1024

func (p *partitionState) complete(c completion) {
	p.running--
	if c.err != nil {
		p.log.Info("message abandoned, it will be redelivered", "offset", c.msg.Offset, "err", c.err)
	} else {
		var payload int64
		p.advanced, payload = p.offs.done(c.msg.Offset, emptied(p.advanced))
		// The record itself is gone; its offsets entry stays charged
		// until it is committable.
		p.budget.release(p.partition, payload-entryCost+int64(len(p.advanced))*entryCost)
		if next, ahead := p.offs.committable(); ahead {
			p.cm.advance(p.partition, next, p.advanced)
			p.offs.committed = next
			// A waiting record that finishes (parked, at last) releases the
			// records done behind it, which have waited long enough
			// already: a thousand or more are committed at once, not at the
			// next tick (from the liveness work on the bench's failing row).
			if p.c.cfg.CommitInterval == 0 || len(p.advanced) >= releaseFlush {
				p.cm.flush()
			}
		}
	}
	k, ordered := orderKey(c.msg)
	if !ordered {
		return
	}
	waiting := p.keys[k]
	if waiting.Len() == 0 || p.stop.Err() != nil {
		p.forget(k)
		return
	}
	insertReady(&p.ready, waiting.Items()[0])
	waiting.Pop(1)
	p.keys[k] = waiting
}

// forget deletes key k, and rebuilds keys once it holds less than a
// quarter of its peak: a Go map never gives back what it grew to (see
// fifo.go for why a partition's queues must).
func (p *partitionState) forget(k string) {
	delete(p.keys, k)
	if n := len(p.keys); p.keysPeak > queueKeep && n < p.keysPeak/4 {
		keys := make(map[string]fifo[kafka.Message], n) // maps.Clone keeps the size
		maps.Copy(keys, p.keys)
		p.keys, p.keysPeak = keys, n
	}
}

// insertReady inserts msg into ready, which is in offset order, and keeps
// that order: a record freed by its key's predecessor may be older than
// records of other keys ready before it. The order is what makes a hold
// on the first ready record (a pause, the Gate, the frontier) a hold on
// all: a record below a held one never waits behind it.
func insertReady(ready *fifo[kafka.Message], msg kafka.Message) {
	items := ready.Items()
	if n := len(items); n == 0 || items[n-1].Offset < msg.Offset {
		ready.Push(msg)
		return
	}
	i, _ := slices.BinarySearchFunc(items, msg.Offset, func(m kafka.Message, off int64) int {
		return cmp.Compare(m.Offset, off)
	})
	ready.Insert(i, msg)
}

// blocked returns what the record at offset (the first ready one) waits
// for before it may start, or nil if it may start now: the operator's
// pause, the Gate's hold (its next change), or the partition's frontier
// (which it asks the committer to raise). The frontier costs one integer
// compare while the record is below it.
func (p *partitionState) blocked(offset int64) <-chan struct{} {
	if g := p.pausedGate(); g != nil {
		return g
	}
	if changed := p.heldAt(offset); changed != nil {
		return changed
	}
	if offset < p.frontier {
		if offset >= p.soon && !p.urged { // ask for the next raise ahead of time
			p.urged = true
			p.cm.urgeFlush()
		}
		return nil
	}
	if p.frontier = p.lane.frontier.Load(); offset < p.frontier {
		p.soon, p.urged = p.lane.soon.Load(), false
		return nil
	}
	if offset >= p.reach {
		p.reach = offset + 1 // the committer raises past what waits
		p.lane.reach.Store(p.reach)
	}
	p.cm.urgeFlush()
	return p.lane.moved
}

// heldAt returns the Gate's next change if it holds the record at offset,
// else nil.
func (p *partitionState) heldAt(offset int64) <-chan struct{} {
	if g := p.c.cfg.Gate; g != nil && g.Hold(p.partition, offset) {
		// Changed before Hold again: a change in between closes it.
		changed := g.Changed()
		if g.Hold(p.partition, offset) {
			return changed
		}
	}
	return nil
}

// pausedGate returns the consumer's Pause when it is closed (a pause), nil
// when records may start.
func (p *partitionState) pausedGate() <-chan struct{} {
	if p.c.cfg.Pause == nil {
		return nil
	}
	g := p.c.cfg.Pause()
	select {
	case <-g:
		return nil
	default:
		return g
	}
}

// gateOpen waits while the consumer's Pause says fetching is paused and
// reports false when ctx ended first.
func (p *partitionState) gateOpen(ctx context.Context) bool {
	if p.c.cfg.Pause == nil {
		return true
	}
	select {
	case <-p.c.cfg.Pause():
		return true
	case <-ctx.Done():
		return false
	}
}
