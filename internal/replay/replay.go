package replay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Config configures a Replayer. Brokers, the topics, GroupID,
// MaxReplays and Logger are required.
type Config struct {
	Brokers []string
	// DLQTopic is read. SourceTopic is the only topic records are
	// republished to.
	DLQTopic, SourceTopic string
	// GroupID is the replayer's own consumer group on DLQTopic; its
	// committed offsets are the replay position. Never the billing
	// consumer's group: joining it would rebalance the running consumers.
	GroupID string
	// MaxReplays refuses a record whose dlq-replay-count is at least this.
	MaxReplays int

	Dialer    *kafka.Dialer    // reader and group; nil: kafka.DefaultDialer
	Transport *kafka.Transport // writer and admin requests; nil: a new one
	Logger    *slog.Logger

	// Group timings; zero: 10s, 10s, 1s. A replay does a little work per
	// record, so short timeouts let the next run join quickly after a
	// killed one.
	SessionTimeout, RebalanceTimeout, HeartbeatInterval time.Duration
}

// Options are the flags of one run.
type Options struct {
	// Max stops the run after this many republished records; 0: no limit.
	Max int
	// DryRun reads and judges records exactly as a run would, stopping
	// where it would stop, but republishes and commits nothing, and does not
	// join the group (a running replay is not disturbed).
	DryRun bool
	// Reason selects the records of this dlq-reason; empty: exhausted, the
	// only reason a replay can fix by itself (a provider that failed for
	// long). invalid, permanent and conflict records fail the same way
	// again, and a replayed conflict pages again: they are replayed only
	// when asked for by name.
	Reason dlq.Reason
	// Order, when positive, selects only the records of this order (the
	// value's order_id, else the key; see dlq.OrderID).
	Order int64
	// At, when set, selects only the record at this partition and offset
	// (still of the selected reason). It is replayed even if an earlier run
	// did: a replay is harmless, and its replay count still guards loops.
	At *RecordAt
}

// RecordAt names one record of the dead-letter topic.
type RecordAt struct {
	Partition int
	Offset    int64
}

func (o Options) reason() dlq.Reason { return cmp.Or(o.Reason, dlq.Exhausted) }

// Counts are the records of one reason, or of all. NotSelected are the
// records a run read but did not select (another reason or order): they
// stay as they were, not replayed, for a later run that selects them.
type Counts struct{ Replayed, NotSelected, Refused int }

// Summary is what a run did. In a dry run, Replayed counts the records
// that would have been republished.
type Summary struct {
	DryRun bool
	// ByReason is keyed by the dlq-reason header ("" when missing).
	ByReason map[dlq.Reason]Counts
	Total    Counts
	// MaxReached is true when the run stopped at Options.Max with
	// records possibly left before the end.
	MaxReached bool
}

func (s *Summary) count(r dlq.Reason, f func(*Counts)) {
	c := s.ByReason[r]
	f(&c)
	s.ByReason[r] = c
	f(&s.Total)
}

// RefusedError is the error of a run that stopped at a record it will not
// republish. The record is not committed: every later run stops at it
// again until it is dealt with.
type RefusedError struct {
	Topic     string
	Partition int
	Offset    int64
	Why       string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused record %s/%d@%d: %s; it is not committed, so replay stops here until it is handled",
		e.Topic, e.Partition, e.Offset, e.Why)
}

// Replayer republishes dead-lettered records to the source topic: it is
// `billing-consumer dlq replay` (SPEC §2, §7). Concurrent runs of one group
// (in other processes, or other Replayers) split the partitions.
//
// Position. The replayer reads the dead-letter topic as its own consumer
// group and commits by hand a dlq.Position per partition: the first record
// not yet replayed as the offset, the records replayed past it in the
// commit's metadata. Only republished records are marked replayed, so a
// run resumes where it can and the records it did not select stay in the
// backlog (billing_dlq_records) for a later run. Each run reads only up to
// the log-end offsets seen when it starts, so it ends even while new
// records keep arriving. The group's offsets live as long as the broker's
// offsets.retention.minutes after a run; a run after they expired starts
// over at the oldest retained record (harmless, see below, but it spends
// replay counts).
//
// Per record, in offset order, from the first not replayed (a record at
// Options.At: that one only):
//   - replayed by an earlier run: passed over.
//   - not selected (its dlq-reason is not Options.Reason, by default
//     exhausted; or not of Options.Order): left as it is, counted
//     NotSelected.
//   - no dlq-original-topic header, one naming another topic than the
//     configured source topic (a forged or misrouted record must not write
//     wherever a header says), an unreadable dlq-replay-count, or a
//     dlq-replay-count at the limit: refused. The run stops with a
//     *RefusedError naming the record, which stays not replayed, so every
//     later run selecting it stops there too until an operator deals with
//     it (dlq inspect shows it): a record that fails again after a replay
//     comes back with its count (Record keeps dlq-replay-count), so a
//     poison record cannot loop forever. The others can still be replayed
//     by Options.Order or Options.At.
//   - otherwise: republished to the source topic with its original key and
//     value, its original non-dlq headers and dlq-replay-count = previous+1
//     (every other dlq-* header dropped), partitioned by key hash like the
//     DLQ writer, acknowledged by all in-sync replicas, and only then
//     marked replayed and committed.
//
// Duplicates are harmless by construction: a crash or rebalance between a
// republish and its commit republishes the record again, and two replay
// groups may both republish it; the billing consumer deduplicates on
// event_id (processed_event) and on the ledger's order_id, and the provider
// on the Idempotency-Key, so a record delivered twice charges once.
type Replayer struct {
	cfg    Config
	client *kafka.Client
}

// New validates cfg and returns a Replayer.
func New(cfg Config) (*Replayer, error) {
	switch {
	case len(cfg.Brokers) == 0 || cfg.DLQTopic == "" || cfg.SourceTopic == "" || cfg.GroupID == "" || cfg.Logger == nil:
		return nil, errors.New("dlq replay: brokers, topics, group id and logger are required")
	case cfg.DLQTopic == cfg.SourceTopic:
		return nil, errors.New("dlq replay: the dead-letter topic must differ from the source topic")
	case cfg.MaxReplays < 1:
		return nil, fmt.Errorf("dlq replay: max replays must be at least 1, got %d", cfg.MaxReplays)
	}
	if cfg.Dialer == nil {
		cfg.Dialer = kafka.DefaultDialer
	}
	if cfg.Transport == nil {
		cfg.Transport = &kafka.Transport{}
	}
	cfg.SessionTimeout = cmp.Or(cfg.SessionTimeout, 10*time.Second)
	cfg.RebalanceTimeout = cmp.Or(cfg.RebalanceTimeout, 10*time.Second)
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, time.Second)
	client := &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: cfg.Transport, Timeout: 10 * time.Second}
	return &Replayer{cfg: cfg, client: client}, nil
}

// Run replays from the group's position up to the log-end offsets of the
// start. It returns the summary of what it did and, if it stopped early, an
// error: a *RefusedError, ctx's error, or a Kafka failure (after which a
// rerun resumes; a record republished but not yet committed is republished
// again, which is harmless).
func (r *Replayer) Run(ctx context.Context, opts Options) (Summary, error) {
	sum := Summary{DryRun: opts.DryRun, ByReason: map[dlq.Reason]Counts{}}
	if opts.Max < 0 {
		return sum, fmt.Errorf("max must not be negative, got %d", opts.Max)
	}
	if _, err := dlq.ParseReason(string(opts.reason())); err != nil {
		return sum, err
	}
	bounds, err := r.logBounds(ctx)
	if err != nil {
		return sum, err
	}
	if at := opts.At; at != nil {
		b, ok := bounds[at.Partition]
		if !ok || at.Offset < b.First || at.Offset >= b.End {
			return sum, fmt.Errorf("no record at %s/%d@%d (partition %s)", r.cfg.DLQTopic, at.Partition, at.Offset, describe(b, ok))
		}
	}
	run := &replayRun{r: r, opts: opts, sum: &sum, bounds: bounds,
		log: r.cfg.Logger.With("dlq_topic", r.cfg.DLQTopic, "group", r.cfg.GroupID, "dry_run", opts.DryRun)}
	attrs := []any{"source_topic", r.cfg.SourceTopic, "reason", string(opts.reason()), "max", opts.Max, "max_replays", r.cfg.MaxReplays}
	if opts.Order > 0 {
		attrs = append(attrs, "order_id", opts.Order)
	}
	if opts.At != nil {
		attrs = append(attrs, "partition", opts.At.Partition, "offset", opts.At.Offset)
	}
	run.log.Info("dlq replay started", attrs...)
	if opts.DryRun {
		err = run.dryRun(ctx)
	} else {
		run.writer = &kafka.Writer{
			Addr:         kafka.TCP(r.cfg.Brokers...),
			Balancer:     &kafka.Hash{}, // by the original key, as the DLQ writer and producers do
			RequiredAcks: kafka.RequireAll,
			BatchSize:    1, // one record at a time, each committed after its ack
			WriteTimeout: 10 * time.Second,
			MaxAttempts:  5,
			Transport:    r.cfg.Transport,
		}
		err = run.asGroup(ctx)
		if cerr := run.writer.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close writer: %w", cerr)
		}
	}
	t := sum.Total
	attrs = []any{"replayed", t.Replayed, "not_selected", t.NotSelected, "refused", t.Refused, "max_reached", sum.MaxReached}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	run.log.Info("dlq replay finished", attrs...)
	return sum, err
}

// describe says what partition b holds, for an error about a record it
// does not.
func describe(b kafkagroup.Bounds, exists bool) string {
	switch {
	case !exists:
		return "does not exist"
	case b.First >= b.End:
		return "is empty"
	}
	return fmt.Sprintf("holds offsets %d to %d", b.First, b.End-1)
}

// logBounds snapshots the dead-letter topic's partitions.
func (r *Replayer) logBounds(ctx context.Context) (map[int]kafkagroup.Bounds, error) {
	return kafkagroup.LogBounds(ctx, r.client, r.cfg.DLQTopic)
}

// verdict is what replay does with one record: leave it (not selected),
// refuse it (why), or republish out.
type verdict struct {
	reason      dlq.Reason
	notSelected bool
	why         string
	out         kafka.Message
	count       int // dlq-replay-count of out
}

// judge decides what to do with msg, by its headers and, with
// opts.Order, its order.
func (r *Replayer) judge(msg kafka.Message, opts Options) verdict {
	var v verdict
	var origin, badCount string
	hasOrigin, prev := false, 0
	headers := make([]kafka.Header, 0, len(msg.Headers)+1)
	for _, h := range msg.Headers {
		switch h.Key {
		case dlq.HeaderReason:
			v.reason = dlq.Reason(h.Value)
		case dlq.HeaderOriginalTopic:
			origin, hasOrigin = string(h.Value), true
		case dlq.HeaderReplayCount:
			// Several counts (never written by Record) are read as the
			// highest: the guard must not be bypassed.
			n, err := strconv.Atoi(string(h.Value))
			if err != nil || n < 0 {
				badCount = string(h.Value)
			}
			prev = max(prev, n)
		}
		if !strings.HasPrefix(h.Key, "dlq-") {
			headers = append(headers, h)
		}
	}
	switch {
	case v.reason != opts.reason() || (opts.Order > 0 && dlq.OrderID(msg.Key, msg.Value) != opts.Order):
		v.notSelected = true
	case !hasOrigin || origin == "":
		v.why = "no " + dlq.HeaderOriginalTopic + " header"
	case origin != r.cfg.SourceTopic:
		v.why = fmt.Sprintf("%s %q is not the source topic %q", dlq.HeaderOriginalTopic, origin, r.cfg.SourceTopic)
	case badCount != "":
		v.why = fmt.Sprintf("%s %q is not a count", dlq.HeaderReplayCount, badCount)
	case prev >= r.cfg.MaxReplays:
		v.why = fmt.Sprintf("%s %d has reached the limit of %d replays", dlq.HeaderReplayCount, prev, r.cfg.MaxReplays)
	default:
		v.count = prev + 1
		headers = append(headers, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte(strconv.Itoa(v.count))})
		v.out = kafka.Message{Topic: r.cfg.SourceTopic, Key: msg.Key, Value: msg.Value, Headers: headers}
	}
	return v
}
