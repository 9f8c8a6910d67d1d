package dlq

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

// Entry is one dead-letter record as an operator sees it: where it is, why
// it is there (the dlq-* headers), whether dlq replay has passed it, and
// the record itself.
type Entry struct {
	Partition int
	Offset    int64
	Reason    Reason
	Error     string
	Attempts  int
	// FailedAt is the dlq-failed-at header, or the record's timestamp when
	// it has none.
	FailedAt          time.Time
	OriginalTopic     string
	OriginalPartition int
	OriginalOffset    int64
	ConsumerGroup     string
	ReplayCount       int
	// OrderID is the order_id of the value, else the key read as a
	// decimal; 0 when neither is one (an invalid record).
	OrderID int64
	// Replayed is true for records dlq replay has republished (its
	// group's Position); a record no run selected is not.
	Replayed bool
	Key      []byte
	Value    []byte
	Headers  []kafka.Header
}

// Filter selects entries; its zero value selects all.
type Filter struct {
	Reason  Reason    // only this dlq-reason
	Since   time.Time // only records dead-lettered at or after
	OrderID int64     // only this order
}

func (f Filter) match(e Entry) bool {
	return (f.Reason == "" || e.Reason == f.Reason) &&
		(f.Since.IsZero() || !e.FailedAt.Before(f.Since)) &&
		(f.OrderID == 0 || e.OrderID == f.OrderID)
}

// BrowseConfig says what Browse reads. Brokers, Topic and Client are
// required.
type BrowseConfig struct {
	Brokers []string
	Topic   string
	// ReplayGroup is dlq replay's group, for Entry.Replayed; empty: none.
	ReplayGroup string
	Dialer      *kafka.Dialer // partition readers; nil: kafka.DefaultDialer
	Client      *kafka.Client // offsets
}

// Browse reads every partition of the dead-letter topic from its earliest
// retained record up to its end when Browse started, partition by
// partition in offset order, and calls fn for each entry that filter
// selects; an error from fn stops it and is returned. It joins no group
// and commits nothing: a running consumer or replay is not disturbed.
func Browse(ctx context.Context, cfg BrowseConfig, filter Filter, fn func(Entry) error) error {
	bounds, err := kafkagroup.LogBounds(ctx, cfg.Client, cfg.Topic)
	if err != nil {
		return err
	}
	ids := slices.Sorted(maps.Keys(bounds))
	replayed := map[int]Position{}
	if cfg.ReplayGroup != "" {
		if replayed, err = ReadPositions(ctx, cfg.Client, cfg.ReplayGroup, cfg.Topic, ids); err != nil {
			return err
		}
	}
	for _, id := range ids {
		b := bounds[id]
		if b.First >= b.End {
			continue
		}
		if err := browsePartition(ctx, cfg, id, b, replayed[id], filter, fn); err != nil {
			return err
		}
	}
	return nil
}

func browsePartition(ctx context.Context, cfg BrowseConfig, partition int, b kafkagroup.Bounds, pos Position,
	filter Filter, fn func(Entry) error) error {
	rd, err := kafkagroup.OpenPartition(kafkagroup.ReaderConfig{Brokers: cfg.Brokers, Topic: cfg.Topic,
		Partition: partition, Dialer: cfg.Dialer}, b.First)
	if err != nil {
		return err
	}
	defer rd.Close()
	for next := b.First; next < b.End; {
		msg, err := rd.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("read %s/%d at %d: %w", cfg.Topic, partition, next, err)
		}
		if msg.Offset >= b.End {
			return nil
		}
		next = msg.Offset + 1
		e := entryOf(msg)
		e.Replayed = pos.Replayed(msg.Offset)
		if filter.match(e) {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// entryOf reads the dlq-* headers of msg. A missing or malformed header
// leaves its field at zero: the tool shows what is there.
func entryOf(msg kafka.Message) Entry {
	e := Entry{Partition: msg.Partition, Offset: msg.Offset, FailedAt: msg.Time,
		Key: msg.Key, Value: msg.Value, Headers: msg.Headers}
	for _, h := range msg.Headers {
		v := string(h.Value)
		switch h.Key {
		case HeaderReason:
			e.Reason = Reason(v)
		case HeaderError:
			e.Error = v
		case HeaderAttempts:
			e.Attempts, _ = strconv.Atoi(v)
		case HeaderFailedAt:
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				e.FailedAt = t
			}
		case HeaderOriginalTopic:
			e.OriginalTopic = v
		case HeaderOriginalPartition:
			e.OriginalPartition, _ = strconv.Atoi(v)
		case HeaderOriginalOffset:
			e.OriginalOffset, _ = strconv.ParseInt(v, 10, 64)
		case HeaderConsumerGroup:
			e.ConsumerGroup = v
		case HeaderReplayCount:
			e.ReplayCount, _ = strconv.Atoi(v)
		}
	}
	e.OrderID = OrderID(msg.Key, msg.Value)
	return e
}

// OrderID is the order of a dead-letter record: the order_id of its value,
// else its key read as a decimal; 0 when neither is one (an invalid
// record). dlq list --order and dlq replay --order select by it.
func OrderID(key, value []byte) int64 {
	var ev struct {
		OrderID json.Number `json:"order_id"`
	}
	var id int64
	if json.Unmarshal(value, &ev) == nil {
		id, _ = strconv.ParseInt(ev.OrderID.String(), 10, 64)
	}
	if id <= 0 {
		id, _ = strconv.ParseInt(string(key), 10, 64)
	}
	return max(id, 0)
}
