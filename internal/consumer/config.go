package consumer

import (
	"errors"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/field"
)

// Config configures a Consumer. Brokers, Topic, GroupID and Logger are
// required; New fills in the defaults the other fields' docs name, and
// Validate states the rules between them.
type Config struct {
	Brokers []string
	Topic   string
	GroupID string
	Dialer  *kafka.Dialer // nil: kafka.DefaultDialer

	// Concurrency is the number of workers that run the handlers, and so
	// caps the handlers running at once across all partitions of this
	// consumer. Messages with the same key always run one at a time, in
	// offset order. 1 is the sequential baseline.
	Concurrency int
	// MaxInFlightBytes bounds what all partitions together hold between
	// fetch and commit: each record costs its key, value and headers plus
	// RecordOverhead while it is not done, and 64 bytes from then until it
	// is committable. A partition whose next record does not fit stops
	// fetching until records complete; each partition has a reserved
	// share and waits its turn for the rest, so none starves. Zero: 8
	// MiB. It must hold one maximal record (MaxRecordBytes plus
	// RecordOverhead).
	MaxInFlightBytes int64
	// CommitInterval batches offset commits: one request for every
	// partition with progress or whose dispatch frontier needs raising
	// (see frontier.go), per interval, and one at once when a partition
	// waits at its frontier. Zero commits after every completed message:
	// with Concurrency 1, the sequential baseline.
	CommitInterval time.Duration
	// DrainTimeout is how long an in-flight message may still run after a
	// rebalance or shutdown began; then its context is cancelled and it is
	// abandoned. During a rebalance kafka-go stops heartbeating, so the
	// drain and the final commit must fit in SessionTimeout (and in
	// RebalanceTimeout); Validate rejects a DrainTimeout that does not.
	DrainTimeout time.Duration
	// CommitTimeout bounds one offset commit (the positions write and the
	// Kafka commit together), so a hung broker or database cannot hold up
	// a shutdown or cost the membership. Zero: 10s, or what the session
	// leaves after the drain and a heartbeat interval, if less (see
	// defaultCommitTimeout).
	CommitTimeout time.Duration

	// SessionTimeout is how long the coordinator waits for a heartbeat
	// before it evicts a member: a crashed member's partitions stand still
	// that long. RebalanceTimeout is how long it waits for the live members
	// to rejoin in a rebalance (kafka-go abandons a JoinGroup after it plus
	// 5s). HeartbeatInterval must be below a third of SessionTimeout.
	SessionTimeout    time.Duration // zero: kafka-go's default (30s)
	RebalanceTimeout  time.Duration // zero: kafka-go's default (30s)
	HeartbeatInterval time.Duration // zero: kafka-go's default (3s)
	// MaxRecordBytes is the largest record expected, and the most one
	// fetch of a partition asks for (less with many partitions: the
	// budget's share of each; Kafka still returns a larger record batch,
	// alone; the budget counts a larger record as a maximal one). Zero: 1
	// MiB, Kafka's default largest record.
	MaxRecordBytes int
	// PartitionWatchInterval is how often the topic's partition count is
	// re-read: partitions added while the consumer runs are rebalanced
	// onto the group within about this interval plus one rebalance (see
	// kafkagroup.GroupConfig.WatchPartitions). Zero: 5s; negative: off.
	PartitionWatchInterval time.Duration

	// Transport carries the consumer's own requests to the brokers (the
	// marked offset commits, the offsets and marks read at each
	// generation's start). Nil: a Transport of its own with Dialer's TLS,
	// SASL mechanism and client id.
	Transport kafka.RoundTripper

	Logger *slog.Logger
	// Pause, when set, pauses fetching: it returns a channel that is closed
	// while the consumer may fetch (see internal/postgres/pause). While it is open
	// the partitions fetch nothing and start no record, but stay assigned,
	// and finish and commit the records already running. (A fetch under
	// way when the pause begins is dropped, not held: see fetcher.)
	Pause func() <-chan struct{}
	// Gate, when set, is the failover heal's hold on the stream (see Gate):
	// where each partition starts in a generation, and which records wait.
	// Nil: none.
	Gate Gate
	// OnAssign, when set, is told the partitions this consumer owns: those
	// of each generation when it starts, nil when it has ended (after the
	// final commit).
	OnAssign func(partitions []int)
	// OnCommit, when set, is called after each successful commit request,
	// once for each partition it carried, with the committed offset and
	// the timings of the messages it newly covers. Calls for different
	// partitions may come from different goroutines, never at once.
	OnCommit func(partition int, offset int64, covered []Timing)
	// Positions, when set, is written before each offset commit with the
	// offsets that commit will carry; a failed write stops that commit
	// (see commitGeneration). Nil writes no positions (the tests, a
	// consumer without the database that holds its decisions).
	Positions Positions
	// OnPositionsFailed, when set, is called once for each failed
	// Positions write (the commit it stopped is retried at the next one).
	OnPositionsFailed func()
}

// withDefaults returns cfg with the default of each zero field filled in
// (a non-positive DrainTimeout, CommitTimeout, MaxRecordBytes, Concurrency
// or MaxInFlightBytes too), as the fields' docs say; the group timings get
// kafka-go's own defaults, which it would apply to zero anyway.
func (cfg Config) withDefaults() Config {
	if cfg.Dialer == nil {
		cfg.Dialer = kafka.DefaultDialer
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.MaxRecordBytes <= 0 {
		cfg.MaxRecordBytes = 1 << 20
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.MaxInFlightBytes <= 0 {
		cfg.MaxInFlightBytes = 8 << 20
	}
	if cfg.PartitionWatchInterval == 0 {
		cfg.PartitionWatchInterval = 5 * time.Second
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 30 * time.Second
	}
	if cfg.RebalanceTimeout == 0 {
		cfg.RebalanceTimeout = 30 * time.Second
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = 3 * time.Second
	}
	if cfg.CommitTimeout <= 0 {
		cfg.CommitTimeout = defaultCommitTimeout(cfg.SessionTimeout, cfg.DrainTimeout, cfg.HeartbeatInterval)
	}
	return cfg
}

// defaultCommitTimeout is CommitTimeout's default: 10s, or less when the
// session leaves less after the drain. A generation's final flush (the
// positions write and the Kafka commit) runs after its drain, while
// kafka-go sends no heartbeat, so the drain and that flush together must
// fit in the session, less one heartbeat interval of slack; with the
// service's defaults (session 6s, drain 3s, heartbeat 500ms) that is
// 2.5s. It is never below minCommitTimeout: a DrainTimeout that close to
// the session already risks the membership.
func defaultCommitTimeout(session, drain, heartbeat time.Duration) time.Duration {
	return max(minCommitTimeout, min(10*time.Second, session-drain-heartbeat))
}

// minCommitTimeout is the least time a commit is given.
const minCommitTimeout = 500 * time.Millisecond

// Validate returns nil when cfg's settings are usable as they are, or the
// errors.Join of a *field.Error for each field that is not: Brokers,
// Topic and GroupID are required; MaxRecordBytes is positive and at most
// 1 GiB, and MaxInFlightBytes holds one maximal record; HeartbeatInterval
// is positive and below a third of SessionTimeout; DrainTimeout is
// positive and below SessionTimeout and RebalanceTimeout (kafka-go does
// not heartbeat while a generation drains). It checks the fields as given,
// zero ones included: New fills in their defaults first, and a caller
// that sets every field (cmd/billing-consumer) sees a zero refused. The
// dependencies (Logger) New checks itself.
func (cfg Config) Validate() error {
	var errs []error
	add := func(f, format string, args ...any) { errs = append(errs, field.Errorf(f, format, args...)) }
	if len(cfg.Brokers) == 0 {
		add("Brokers", "required")
	}
	if cfg.Topic == "" {
		add("Topic", "required")
	}
	if cfg.GroupID == "" {
		add("GroupID", "required")
	}
	if cfg.MaxRecordBytes <= 0 || cfg.MaxRecordBytes > maxRecordLimit {
		add("MaxRecordBytes", "must be between 1 and %d, got %d", maxRecordLimit, cfg.MaxRecordBytes)
	} else if cfg.MaxInFlightBytes < cfg.maxCost() {
		add("MaxInFlightBytes", "%d cannot hold one maximal record: %s (%d) plus %d bytes of overhead",
			cfg.MaxInFlightBytes, field.Ref("MaxRecordBytes"), cfg.MaxRecordBytes, RecordOverhead)
	}
	// Three heartbeats per session at least, as Kafka's clients advise:
	// one late heartbeat must not cost a rebalance.
	if hb, session := cfg.HeartbeatInterval, cfg.SessionTimeout; hb <= 0 || 3*hb >= session {
		add("HeartbeatInterval", "must be positive and below a third of %s (%s), got %s", field.Ref("SessionTimeout"), session, hb)
	}
	if d := cfg.DrainTimeout; d <= 0 || d >= cfg.SessionTimeout || d >= cfg.RebalanceTimeout {
		add("DrainTimeout", "must be positive and below %s (%s) and %s (%s), got %s",
			field.Ref("SessionTimeout"), cfg.SessionTimeout, field.Ref("RebalanceTimeout"), cfg.RebalanceTimeout, d)
	}
	return errors.Join(errs...)
}

// maxRecordLimit is the largest MaxRecordBytes: Kafka's own limits are far
// below it, and a record's cost must fit the offsets entry's int32.
const maxRecordLimit = 1 << 30

// maxCost is what a maximal record costs in the budget.
func (cfg Config) maxCost() int64 { return int64(cfg.MaxRecordBytes) + RecordOverhead }
