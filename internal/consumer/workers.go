package consumer

import (
	"errors"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// job is one message handed by its partition to a worker.
type job struct {
	p   *partitionState
	msg kafka.Message
}

// completion is a handler's verdict on one message.
type completion struct {
	msg kafka.Message
	err error
}

// errRevoked is the verdict on a message whose partition was revoked (or
// the consumer stopped) before a worker could start it.
var errRevoked = errors.New("partition revoked before the message started")

// retryPause is how long a message whose handler failed before its
// partition stopped waits, without a worker, before it is tried again.
const retryPause = time.Second

// startWorkers starts the Concurrency workers that run every handler of
// the consumer, for all partitions and generations: a partition hands a
// message over only to an idle worker (c.jobs is unbuffered), so the
// workers are the Concurrency bound. They are long-lived so that a
// handler's stack, grown once into the billing, HTTP and JSON call
// chains, is reused instead of grown again for every message (the
// runtime may still shrink an idle worker's stack at a GC). stopWorkers
// ends them once no partition can hand out a message any more.
func (c *Consumer) startWorkers() (stopWorkers func()) {
	c.jobs = make(chan job)
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Go(func() {
			for j := range c.jobs {
				c.runJob(j)
			}
		})
	}
	return func() { close(c.jobs); wg.Wait() }
}

// runJob runs j's handler and reports its verdict to j's partition. A
// message is never started after its partition stopped. The handler fails
// only when its context ends; should it fail earlier, the same message is
// tried again after retryPause, on whichever worker is idle then, rather
// than by ending the generation, which would rebalance the whole group
// for one message. During the pause the message holds no worker (it
// counts as running for its partition, which keeps the same key waiting);
// a stop during the pause abandons it at once.
func (c *Consumer) runJob(j job) {
	p := j.p
	if p.stop.Err() != nil {
		p.done <- completion{msg: j.msg, err: errRevoked}
		return
	}
	err := c.handle(p.work, j.msg)
	if err == nil || p.stop.Err() != nil || p.work.Err() != nil {
		p.done <- completion{msg: j.msg, err: err}
		return
	}
	p.log.Error("handler failed, retrying the message in place", "offset", j.msg.Offset, "err", err)
	go func() {
		// The partition's drain waits for this verdict, so c.jobs is still
		// open: stopWorkers runs only after every partition drained. A stop
		// during the pause abandons the message at once, so the pause never
		// holds up a drain (it may be longer than DrainTimeout).
		pause := time.NewTimer(retryPause)
		defer pause.Stop()
		var jobs chan<- job // nil, so never ready, until the pause is over
		for {
			select {
			case <-pause.C:
				jobs = c.jobs
			case jobs <- j:
				return
			case <-p.stop.Done():
				p.done <- completion{msg: j.msg, err: err}
				return
			}
		}
	}()
}
