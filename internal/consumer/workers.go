package consumer

import (
	"errors"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/elastic"
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

// inbox is where workers report a partition's verdicts: any number, so a
// worker never waits for its partition, at no cost for a partition with
// nothing running (a channel buffered for the most verdicts a partition
// could have outstanding would cost every owned partition that much).
// ready holds a token while verdicts wait to be taken.
type inbox struct {
	mu    sync.Mutex
	items []completion
	ready chan struct{}
}

func newInbox() *inbox { return &inbox{ready: make(chan struct{}, 1)} }

// put reports c; safe for concurrent use.
func (in *inbox) put(c completion) {
	in.mu.Lock()
	in.items = append(in.items, c)
	in.mu.Unlock()
	select {
	case in.ready <- struct{}{}:
	default: // a token is already waiting; the taker takes everything
	}
}

// take appends every reported verdict to into and returns it.
func (in *inbox) take(into []completion) []completion {
	in.mu.Lock()
	defer in.mu.Unlock()
	into = append(into, in.items...)
	in.items = emptied(in.items)
	return into
}

// startWorkers prepares the workers that run every handler of the
// consumer, for all partitions and generations: an elastic pool of at
// most Concurrency (internal/elastic). A partition hands a message to an
// idle worker (pool.Jobs), and only when none is idle takes one of the
// slots (pool.Slots) and spawns one. stopWorkers ends them once no
// partition can hand out a message any more, and waits for them.
func (c *Consumer) startWorkers() (stopWorkers func()) {
	c.pool = elastic.New(c.cfg.Concurrency, c.runJob, func(j job) bool { return j.p == nil })
	return c.pool.Close
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
	if p.stop.Err() != nil || p.work.Err() != nil { // revoked, or abandoned (see Consumer.Abandon)
		p.done.put(completion{msg: j.msg, err: errRevoked})
		return
	}
	err := c.handle(p.work, j.msg)
	if err == nil || p.stop.Err() != nil || p.work.Err() != nil {
		p.done.put(completion{msg: j.msg, err: err})
		return
	}
	p.log.Error("handler failed, retrying the message in place", "offset", j.msg.Offset, "err", err)
	go c.retryLater(j, err)
}

// retryLater hands j, whose handler failed with err, back to the pool
// after retryPause (see runJob). It is a function of its own so that j
// escapes to the heap on this rare path only, not on every runJob.
func (c *Consumer) retryLater(j job, err error) {
	p := j.p
	// The partition's drain waits for this verdict, so the pool is still
	// open: stopWorkers runs only after every partition drained. The
	// message goes back to an idle worker, or to a new one. A stop
	// during the pause abandons the message at once, so the pause never
	// holds up a drain (it may be longer than DrainTimeout).
	pause := time.NewTimer(retryPause)
	defer pause.Stop()
	var jobs chan<- job // nil, so never ready, until the pause is over
	var slots chan<- struct{}
	for {
		select {
		case <-pause.C:
			jobs, slots = c.pool.Jobs, c.pool.Slots
		case jobs <- j:
			return
		case slots <- struct{}{}:
			c.pool.Spawn(j)
			return
		case <-p.stop.Done():
			p.done.put(completion{msg: j.msg, err: err})
			return
		}
	}
}
