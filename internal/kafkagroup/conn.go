package kafkagroup

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// FetchMaxWait is how long the broker holds a fetch of a partition with
// nothing new (see readerMaxWait): callers of DialPartition pass it as
// kafka.ReadBatchConfig's MaxWait.
const FetchMaxWait = readerMaxWait

// DialPartition returns a connection to the leader of cfg.Partition (tried
// through each of cfg.Brokers in turn) positioned at offset, and that
// offset: kafka.FirstOffset and kafka.LastOffset are resolved, and an
// offset before the first retained record moves to it, as a kafka-go
// Reader does. Unlike a Reader, the connection fetches nothing by itself:
// the caller decides when to fetch (Conn.ReadBatchWith) and how long it
// holds what a fetch returned, which is how internal/consumer bounds its
// fetch memory. cfg.MaxBytes, QueueCapacity and Logger are not used. The
// caller closes the connection.
func DialPartition(ctx context.Context, cfg ReaderConfig, offset int64) (*kafka.Conn, int64, error) {
	d := cfg.Dialer
	if d == nil {
		d = kafka.DefaultDialer
	}
	var errs []error
	for _, broker := range cfg.Brokers {
		conn, err := d.DialLeader(ctx, "tcp", broker, cfg.Topic, cfg.Partition)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		start, err := seek(conn, offset)
		if err != nil {
			_ = conn.Close()
			errs = append(errs, err)
			continue
		}
		return conn, start, nil
	}
	return nil, 0, fmt.Errorf("read %s/%d from %d: %w", cfg.Topic, cfg.Partition, offset, errors.Join(errs...))
}

// seek positions conn at offset, resolved against the partition's first
// and last offsets.
func seek(conn *kafka.Conn, offset int64) (int64, error) {
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return 0, err
	}
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return 0, err
	}
	switch {
	case offset == kafka.LastOffset:
		offset = last
	case offset < first: // kafka.FirstOffset too
		offset = first
	}
	if _, err := conn.Seek(offset, kafka.SeekAbsolute|kafka.SeekDontCheck); err != nil {
		return 0, err
	}
	return offset, conn.SetDeadline(time.Time{})
}
