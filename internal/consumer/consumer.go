// Package consumer reads a Kafka topic as a member of a consumer group with
// github.com/segmentio/kafka-go and commits offsets by hand, only for
// messages the handler has finished, only as a contiguous prefix per
// partition.
//
// Each group generation runs one goroutine per assigned partition, which
// fetches and dispatches messages by key (see Handler) to a pool of at
// most Concurrency workers shared by all partitions (started as the work
// needs them, ended when idle), and one commit
// loop that commits the finished prefix of every partition in one request
// per CommitInterval. When the generation ends (a rebalance) or Run's
// context is cancelled, each partition stops fetching and gives its
// in-flight messages up to DrainTimeout to finish; then one last request
// commits what finished, and only then is the generation released: kafka-go
// rejoins the group only after that, so no other member can be handed a
// partition while this one may still commit it.
//
// Every commit carries a kafkagroup.Mark (issue 30): a generation first
// commits each assigned partition at its start offset, and a partition
// dispatches only records below the Frontier of its last successful
// commit (frontier.go). The failover heal holds and rewinds the stream
// through Config.Gate and Abandon.
//
// Memory: what the partitions of a generation hold in flight (records
// fetched and not done, and the entries of those done but not yet
// committable) is bounded by one budget, MaxInFlightBytes, shared fairly
// among them (see budget), not by a window per partition: it does not grow
// with the partition count, and so is what fetching holds (see fetcher:
// a few partitions at a time decode a response). What each owned
// partition costs besides is small and fixed (its connection and
// goroutines); docs/operations.md has the whole model.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/elastic"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Handler processes one message. It returns nil only when the message may
// be committed: its effects are durable (the billing transaction committed,
// or the record was acknowledged by the DLQ). Any error means the message
// was abandoned, typically because ctx ended; it is not committed and will
// be delivered again. Handlers run concurrently, up to Config.Concurrency,
// but never two for messages with the same key in one partition: those run
// one after the other, in offset order.
type Handler func(ctx context.Context, msg kafka.Message) error

// Consumer is a consumer group member. Run it once.
type Consumer struct {
	cfg    Config
	handle Handler
	gen    atomic.Pointer[Generation] // nil between generations
	// ctl ends the current generation (see Rejoin and Abandon); nil
	// between generations.
	ctl  atomic.Pointer[genControl]
	pool *elastic.Pool[job] // the workers that run the handlers; see startWorkers
	// client sends the marked offset commits and reads the offsets and
	// marks at each generation's start; ownTransport is its transport
	// when Config.Transport is nil (closed when Run returns).
	client       *kafka.Client
	ownTransport *kafka.Transport
}

// genControl ends a generation: end stops its partitions (they drain and
// commit), abandon cancels its handlers' contexts first.
// drop, for Drop, also invalidates the generation's progress: its commits
// fail from then on (the final flush too), a position write under way
// included.
type genControl struct{ end, abandon, drop context.CancelFunc }

// New fills in the defaults of cfg's zero fields, validates it (see
// Validate) and returns a Consumer that calls handle for each message.
func New(cfg Config, handle Handler) (*Consumer, error) {
	if cfg.Logger == nil {
		return nil, errors.New("consumer: no logger")
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c := &Consumer{cfg: cfg, handle: handle}
	tr := cfg.Transport
	if tr == nil {
		c.ownTransport = &kafka.Transport{TLS: cfg.Dialer.TLS, SASL: cfg.Dialer.SASLMechanism, ClientID: cfg.Dialer.ClientID}
		tr = c.ownTransport
	}
	c.client = &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: tr}
	return c, nil
}

// Joined reports whether the consumer is currently a member of a group
// generation (for /readyz).
func (c *Consumer) Joined() bool { return c.gen.Load() != nil }

// Rejoin ends the current generation as a rebalance would (each partition
// drains and commits), and kafka-go joins the group again under the same
// member id. When this member leads the group, its JoinGroup makes the
// coordinator rebalance, and the leader assigns every partition the topic
// has now; a follower's JoinGroup in a stable group only gets its
// assignment back. It is the way out of a stable group that leaves
// partitions to nobody (see kafkagroup.GroupConfig.WatchPartitions); a
// no-op between generations. Safe for concurrent use.
func (c *Consumer) Rejoin() {
	if g := c.ctl.Load(); g != nil {
		g.end()
	}
}

// Abandon ends the current generation without letting its records
// finish: on return every in-flight handler's context of the generation
// is cancelled, no partition starts another record in it, and the
// generation ends as with Rejoin (kafka-go rejoins, the partitions are
// assigned again, and Gate.Start applies). The records that did not
// complete are not committed, so they are delivered again; what did
// complete is still committed by the generation's final flush. The
// failover heal calls it to rewind the stream. A no-op between
// generations. Safe for concurrent use.
func (c *Consumer) Abandon() {
	if g := c.ctl.Load(); g != nil {
		g.abandon()
		g.end()
	}
}

// Drop is Abandon that also forgets what completed and is not committed
// yet: no commit of the generation is made from then on (its final flush
// included), and a position write under way fails, so every record after
// the last commit is delivered again. Run calls it when the database is a
// new server (a failover, a restore, a restart): the decisions of those
// records were taken on the old one, which may have lost them, and
// committing them would tell the new one it holds decisions it does not
// (a position is believed). Redelivered records whose decisions survived
// are decided as duplicates. On return the generation's contexts are
// cancelled; a no-op between generations. Safe for concurrent use.
func (c *Consumer) Drop() {
	if g := c.ctl.Load(); g != nil {
		g.drop()
		g.abandon()
		g.end()
	}
}

// Generation is the group generation a consumer is a member of.
type Generation struct {
	ID int32
	// Partitions is how many partitions of the topic it assigned to this
	// consumer. Zero is normal when the group has more members than the
	// topic has partitions; AssignmentOf tells that apart from a group
	// that left partitions to nobody.
	Partitions int
}

// Generation returns the generation the consumer is a member of, and
// false between generations. Safe for concurrent use.
func (c *Consumer) Generation() (Generation, bool) {
	g := c.gen.Load()
	if g == nil {
		return Generation{}, false
	}
	return *g, true
}

// Run consumes until ctx is cancelled, then drains, commits and leaves the
// group. It returns nil after a clean shutdown, or the error that made the
// group unusable.
func (c *Consumer) Run(ctx context.Context) error {
	group, err := kafkagroup.Join(kafkagroup.GroupConfig{
		ID: c.cfg.GroupID, Brokers: c.cfg.Brokers, Topic: c.cfg.Topic, Dialer: c.cfg.Dialer,
		SessionTimeout: c.cfg.SessionTimeout, RebalanceTimeout: c.cfg.RebalanceTimeout,
		HeartbeatInterval: c.cfg.HeartbeatInterval, WatchPartitions: c.cfg.PartitionWatchInterval,
		Logger: c.cfg.Logger,
	})
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	if c.ownTransport != nil {
		defer c.ownTransport.CloseIdleConnections()
	}
	stopWorkers := c.startWorkers()
	defer stopWorkers() // after leave: every partition has drained
	defer c.leave(group)

	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, kafka.ErrGroupClosed) {
				return err
			}
			c.cfg.Logger.Warn("joining consumer group failed, retrying", "group", c.cfg.GroupID, "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		c.runGeneration(ctx, gen)
		if ctx.Err() != nil {
			// Every partition has drained and committed while the
			// generation, and with it the heartbeat, is still alive.
			return nil
		}
	}
}

// leave leaves the group (see kafkagroup.Leave): kafka-go ends the current
// generation, releasing the partition goroutines parked in runGeneration.
func (c *Consumer) leave(group *kafka.ConsumerGroup) {
	if kafkagroup.Leave(group, c.cfg.CommitTimeout) {
		c.cfg.Logger.Info("left consumer group", "group", c.cfg.GroupID)
	} else {
		c.cfg.Logger.Warn("leaving consumer group timed out", "group", c.cfg.GroupID)
	}
}

// runGeneration runs one generation in a single function started on gen:
// one goroutine per assigned partition, the commit loop, and after every
// partition has drained the final commit. It returns once that commit is
// done: the generation ended (a rebalance), or ctx was cancelled
// (shutdown).
//
// On shutdown the function does not return to kafka-go after the final
// commit: a returning function ends the generation, which stops the
// heartbeat and makes kafka-go rejoin the group before Run can leave it (a
// rebalance for nothing, and partitions parked on a member that is going
// away). It waits instead until leave closes the group.
func (c *Consumer) runGeneration(ctx context.Context, gen *kafka.Generation) {
	assigned := gen.Assignments[c.cfg.Topic]
	parts := make([]string, 0, len(assigned))
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		parts = append(parts, strconv.Itoa(a.ID))
		ids = append(ids, a.ID)
	}
	if c.cfg.OnAssign != nil {
		c.cfg.OnAssign(ids)
		defer c.cfg.OnAssign(nil)
	}
	c.cfg.Logger.Info("partitions assigned", "group", c.cfg.GroupID, "generation", gen.ID,
		"topic", c.cfg.Topic, "partitions", parts)
	c.gen.Store(&Generation{ID: gen.ID, Partitions: len(assigned)})

	finished := make(chan struct{})
	gen.Start(func(genCtx context.Context) {
		c.generation(ctx, genCtx, gen, assigned)
		close(finished)
		if ctx.Err() != nil {
			<-genCtx.Done() // released by leave
		}
	})
	<-finished
	c.gen.Store(nil)
	c.cfg.Logger.Info("partitions revoked", "group", c.cfg.GroupID, "generation", gen.ID,
		"topic", c.cfg.Topic, "partitions", parts, "shutdown", ctx.Err() != nil)
}

// generation runs the generation gen until it ends (genCtx), Run's ctx is
// cancelled or Rejoin or Abandon ends it: its first commit, then its
// partitions and the commit loop, then the final flush.
func (c *Consumer) generation(ctx, genCtx context.Context, gen *kafka.Generation, assigned []kafka.PartitionAssignment) {
	stop, cancel := context.WithCancel(ctx)
	defer cancel()
	context.AfterFunc(genCtx, cancel)
	// work is the root of the handlers' contexts: it outlives stop (the
	// drain), and only Abandon cancels all of it at once.
	work, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	// valid is the generation's progress: Drop cancels it, and no commit
	// of the generation is made after (see commitGeneration).
	valid, drop := context.WithCancel(context.Background())
	defer drop()
	c.ctl.Store(&genControl{end: cancel, abandon: abandon, drop: drop})
	defer c.ctl.Store(nil)
	cm := newCommitter(c.commitGeneration(gen, valid), c.cfg.OnCommit, c.cfg.Logger.With("group", c.cfg.GroupID))
	starts, err := c.begin(stop, cm, assigned)
	if err != nil {
		if stop.Err() == nil {
			c.cfg.Logger.Warn("the generation ended before its first commit", "group", c.cfg.GroupID,
				"generation", gen.ID, "err", err)
		}
		cancel() // a fenced generation: kafka-go rejoins once this returns
	}
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		if err == nil {
			c.consumePartitions(stop, cancel, work, cm, starts)
		}
	}()
	c.commitLoop(cm, drained)
	cm.finish() // everything that finished, before the generation is released
}

// consumePartitions consumes each assigned partition in its own goroutine
// until stop ends and returns when all have drained. A partition that
// cannot be read ends the generation for all (cancel), so that kafka-go
// rejoins the group. With no partition (more members than partitions) it
// stays an idle member until stop ends.
func (c *Consumer) consumePartitions(stop context.Context, cancel context.CancelFunc, work context.Context, cm *committer, starts map[int]int64) {
	ids := make([]int, 0, len(starts))
	for id := range starts {
		ids = append(ids, id)
	}
	b := newBudget(c.cfg.MaxInFlightBytes, c.cfg.maxCost(), ids)
	var wg sync.WaitGroup
	for id, offset := range starts {
		wg.Go(func() {
			if !c.consumePartition(stop, work, cm, b, id, offset) {
				cancel()
			}
		})
	}
	<-stop.Done()
	wg.Wait()
}

// sequentialRetry is how often the sequential mode retries a failed
// commit (and sizes the frontier windows, see tickWindow).
const sequentialRetry = time.Second

// commitLoop flushes cm every CommitInterval (cm.tick), and at once when a
// partition waits at its frontier (cm.urge), until drained is closed. With
// CommitInterval 0 the partitions flush after each message themselves, and
// commitLoop ticks every sequentialRetry only to retry a failed commit
// (a flush with nothing new to commit sends nothing) and to size the
// windows: an idle partition would otherwise keep a failed commit's
// offsets uncommitted until its next record or rebalance.
func (c *Consumer) commitLoop(cm *committer, drained <-chan struct{}) {
	interval := c.cfg.CommitInterval
	if interval <= 0 {
		interval = sequentialRetry
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			cm.tick()
		case <-cm.urge:
			cm.flush()
		case <-drained:
			return
		}
	}
}
