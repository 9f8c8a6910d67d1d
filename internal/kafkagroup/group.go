// Package kafkagroup is the kafka-go plumbing shared by the billing
// consumer (internal/consumer), the dead-letter replayer (internal/replay)
// and the dead-letter tools (internal/dlq): joining a consumer group,
// committing and leaving it with a bound, reading one partition from an
// offset, and asking the brokers for a topic's offsets and a group's
// position.
//
// What each caller does with a group generation (drain, commit policy,
// rejoin) stays in the caller; this package only removes the copies of the
// calls whose settings must not drift apart.
package kafkagroup

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
)

// GroupConfig configures Join. ID, Brokers, Topic and Logger are required.
type GroupConfig struct {
	ID      string
	Brokers []string
	Topic   string
	Dialer  *kafka.Dialer // nil: kafka.DefaultDialer
	// Zero timings are kafka-go's defaults (30s, 30s, 3s). kafka-go sends
	// no heartbeat while a generation drains or while it waits in
	// JoinGroup, gives a JoinGroup 5s plus RebalanceTimeout before it
	// gives up, and then rejoins under a new member id (another
	// rebalance); docs/operations.md compares this with Apache Kafka and
	// kfake.
	SessionTimeout, RebalanceTimeout, HeartbeatInterval time.Duration
	// WatchPartitions, when positive, is how often every member re-reads
	// the topic's partition count (kafka-go's partition watcher, off by
	// default): a change ends the member's generation, and the rejoin of
	// the group's leader makes the coordinator rebalance, so that
	// partitions added to the topic are assigned without a restart. A
	// partition that the group never committed starts at its earliest
	// record (see Join), so nothing produced to a new partition before
	// its assignment is skipped. Zero: off (kafka-go re-reads the count
	// only at the next rebalance). The watcher takes its baseline when a
	// generation starts, after the leader read the metadata: partitions
	// added in between go unnoticed until the next rebalance (the
	// service's group watcher rejoins then; see consumer.Rejoin).
	WatchPartitions time.Duration
	// Logger receives kafka-go's group errors, as warnings.
	Logger *slog.Logger
}

// Join returns a member of the consumer group cfg.ID on cfg.Topic. A
// partition the group never committed starts at its earliest retained
// record. The caller owns the group and must Leave it.
func Join(cfg GroupConfig) (*kafka.ConsumerGroup, error) {
	return kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                cfg.ID,
		Brokers:           cfg.Brokers,
		Dialer:            cfg.Dialer,
		Topics:            []string{cfg.Topic},
		StartOffset:       kafka.FirstOffset,
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		JoinGroupBackoff:  500 * time.Millisecond,

		WatchPartitionChanges:  cfg.WatchPartitions > 0,
		PartitionWatchInterval: max(cfg.WatchPartitions, 0), // kafka-go rejects a negative one
		ErrorLogger: kafka.LoggerFunc(func(msg string, args ...any) {
			cfg.Logger.Warn("kafka group: " + fmt.Sprintf(msg, args...))
		}),
	})
}

// Leave closes group: kafka-go ends the current generation and sends
// LeaveGroup, so the partitions move to another member at once instead of
// after the session timeout. It waits at most timeout (a hung broker must
// not hold the process) and reports whether the close finished; after a
// timeout the close goes on in the background.
func Leave(group *kafka.ConsumerGroup, timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { _ = group.Close(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// Commit commits offsets (partition: the offset of the next record to
// consume) of topic in gen, in one request for every partition, waiting at
// most timeout. After a timeout the commit may still land; committing the
// same or a later offset again is harmless. Callers that commit from
// several goroutines must serialize their calls, or an older offset may
// land after a newer one.
func Commit(gen *kafka.Generation, topic string, offsets map[int]int64, timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- gen.CommitOffsets(map[string]map[int]int64{topic: offsets}) }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		return errors.New("offset commit timed out")
	}
}

// Rebalanced reports whether a Commit error means that gen has ended (a
// rebalance took the partition away), rather than that the broker failed.
func Rebalanced(err error) bool {
	return errors.Is(err, kafka.RebalanceInProgress) || errors.Is(err, kafka.IllegalGeneration) ||
		errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.ErrGenerationEnded)
}

// readerMaxWait is how long the broker holds a fetch of a partition with
// nothing new: the rate of empty fetches a quiet partition costs (2 a
// second), and the longest a reader's Close waits.
const readerMaxWait = 500 * time.Millisecond

// ReaderConfig configures OpenPartition. Brokers and Topic are required.
type ReaderConfig struct {
	Brokers   []string
	Topic     string
	Partition int
	Dialer    *kafka.Dialer // nil: kafka.DefaultDialer
	MaxBytes  int           // largest fetch; zero: 10 MiB
	// QueueCapacity is how many decoded records the reader may hold ahead
	// of FetchMessage; zero: kafka-go's 100.
	QueueCapacity int
	// Logger, when set, receives the reader's errors as warnings.
	Logger *slog.Logger
}

// OpenPartition returns a reader of one partition positioned at offset
// (kafka.FirstOffset or kafka.LastOffset also work). Its lag poller is
// off: lag comes from the brokers' offsets (see LogBounds). A quiet
// partition costs one fetch that the broker holds up to readerMaxWait, a
// connection and the reader's goroutines; closing the reader waits for
// the fetch under way, so readerMaxWait also bounds how long a revoke or
// shutdown waits for a quiet partition's reader. The caller closes the
// reader.
func OpenPartition(cfg ReaderConfig, offset int64) (*kafka.Reader, error) {
	rc := kafka.ReaderConfig{
		Brokers:   cfg.Brokers,
		Topic:     cfg.Topic,
		Partition: cfg.Partition,
		Dialer:    cfg.Dialer,
		// MinBytes 1: a record is delivered as soon as it is written (the
		// broker answers at once); an empty fetch returns after MaxWait.
		MinBytes:      1,
		MaxBytes:      cfg.MaxBytes,
		MaxWait:       readerMaxWait,
		QueueCapacity: cfg.QueueCapacity,
		// The reader's own per-partition lag poller would only add load
		// and noise.
		ReadLagInterval: -1,
	}
	if rc.MaxBytes <= 0 {
		rc.MaxBytes = 10 << 20
	}
	if log := cfg.Logger; log != nil {
		rc.ErrorLogger = kafka.LoggerFunc(func(msg string, args ...any) {
			log.Warn("kafka reader", "detail", fmt.Sprintf(msg, args...))
		})
	}
	r := kafka.NewReader(rc)
	if err := r.SetOffset(offset); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("read %s/%d from %d: %w", cfg.Topic, cfg.Partition, offset, err)
	}
	return r, nil
}
