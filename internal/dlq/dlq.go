// Package dlq writes records that cannot be processed to the dead-letter
// topic (SPEC §7), with the original key, value and headers and the dlq-*
// headers that say where the record came from and why it failed.
package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
)

// Reason is why a record was dead-lettered: the dlq-reason header and the
// reason label of billing_dlq_total.
type Reason string

// Reasons of SPEC §7.
const (
	Invalid   Reason = "invalid"   // the record does not decode or validate
	Permanent Reason = "permanent" // the provider rejected the charge
	Conflict  Reason = "conflict"  // same order or key, different parameters
	Exhausted Reason = "exhausted" // transient failures outlasted the retries
)

// ParseReason returns the Reason named s, or an error if s is not one of
// invalid, permanent, conflict, exhausted.
func ParseReason(s string) (Reason, error) {
	for _, r := range []Reason{Invalid, Permanent, Conflict, Exhausted} {
		if s == string(r) {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown reason %q (want invalid, permanent, conflict or exhausted)", s)
}

// Header names of SPEC §7.
const (
	HeaderOriginalTopic     = "dlq-original-topic"
	HeaderOriginalPartition = "dlq-original-partition"
	HeaderOriginalOffset    = "dlq-original-offset"
	HeaderConsumerGroup     = "dlq-consumer-group"
	HeaderReason            = "dlq-reason"
	HeaderError             = "dlq-error"
	HeaderAttempts          = "dlq-attempts"
	HeaderFailedAt          = "dlq-failed-at"
	// HeaderReplayCount is set by dlq replay on the republished record and
	// kept when that record fails again.
	HeaderReplayCount = "dlq-replay-count"
	// HeaderValueTruncated is set, to the original value's size in bytes,
	// on the rare dead-letter record whose value had to be cut to
	// MaxTruncatedValue because the dead-letter topic refused it whole.
	// The full value stays in the source topic at dlq-original-offset
	// until its retention ends.
	HeaderValueTruncated = "dlq-value-truncated"
)

// MaxTruncatedValue is how much of a value too large for the dead-letter
// topic is kept.
const MaxTruncatedValue = 64 << 10

// maxErrorLen bounds the dlq-error header.
const maxErrorLen = 1024

// Record builds the dead-letter record of msg. dlq-* headers that msg
// already carries (it may itself be a replayed record) are replaced,
// except dlq-replay-count, which replay needs to stop a loop.
func Record(msg kafka.Message, group string, reason Reason, cause error, attempts int, now time.Time) kafka.Message {
	headers := make([]kafka.Header, 0, len(msg.Headers)+8)
	for _, h := range msg.Headers {
		if strings.HasPrefix(h.Key, "dlq-") && h.Key != HeaderReplayCount {
			continue
		}
		headers = append(headers, h)
	}
	errText := "unknown"
	if cause != nil {
		errText = cause.Error()
	}
	headers = append(headers,
		kafka.Header{Key: HeaderOriginalTopic, Value: []byte(msg.Topic)},
		kafka.Header{Key: HeaderOriginalPartition, Value: []byte(strconv.Itoa(msg.Partition))},
		kafka.Header{Key: HeaderOriginalOffset, Value: []byte(strconv.FormatInt(msg.Offset, 10))},
		kafka.Header{Key: HeaderConsumerGroup, Value: []byte(group)},
		kafka.Header{Key: HeaderReason, Value: []byte(reason)},
		kafka.Header{Key: HeaderError, Value: []byte(truncate(errText, maxErrorLen))},
		kafka.Header{Key: HeaderAttempts, Value: []byte(strconv.Itoa(attempts))},
		kafka.Header{Key: HeaderFailedAt, Value: []byte(now.UTC().Format(time.RFC3339Nano))},
	)
	return kafka.Message{Key: msg.Key, Value: msg.Value, Headers: headers}
}

// ReplayCount is msg's dlq-replay-count: how often `dlq replay`
// republished the record; 0 when it carries none, or none that is a
// count (replay refuses such a record, so it was not republished by it).
// A count beyond math.MaxInt32 (a header any producer may write; replay
// stops far below) is math.MaxInt32: the count is stored in an int column
// (dead_letter.replay_count), and a value it cannot hold would keep the
// record from its dead letter.
func ReplayCount(msg kafka.Message) int {
	n := 0
	for _, h := range msg.Headers {
		if h.Key == HeaderReplayCount {
			v, err := strconv.ParseInt(string(h.Value), 10, 32) // math.MaxInt32 on a range error
			if v > 0 && (err == nil || errors.Is(err, strconv.ErrRange)) {
				n = int(v)
			}
		}
	}
	return n
}

// truncate cuts s to at most n bytes of valid UTF-8.
func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	Brokers   []string
	Topic     string // the dead-letter topic
	GroupID   string // written as dlq-consumer-group
	Transport *kafka.Transport
	Now       func() time.Time
}

// Writer sends records to the dead-letter topic. It is safe for concurrent
// use.
type Writer struct {
	w     *kafka.Writer
	group string
	now   func() time.Time
}

// NewWriter returns a Writer. Send returns only once every in-sync replica
// has the record (acks=all), which is what lets the caller commit the
// source offset.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" || cfg.GroupID == "" || cfg.Now == nil {
		return nil, errors.New("dlq writer: brokers, topic, group id and clock are required")
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafka.Hash{}, // records of one key stay in order
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 2 * time.Millisecond,
		WriteTimeout: 10 * time.Second,
		MaxAttempts:  3,
		// The broker's max.message.bytes of the topic decides what fits,
		// not kafka-go's 1 MiB default batch limit.
		BatchBytes: 16 << 20,
		Transport:  cfg.Transport,
	}
	return &Writer{w: w, group: cfg.GroupID, now: cfg.Now}, nil
}

// Send dead-letters msg. A nil error means the record is durably in the
// dead-letter topic; on error nothing may be assumed and the caller retries
// (the topic may then hold the record twice, which replay tolerates).
func (w *Writer) Send(ctx context.Context, msg kafka.Message, reason Reason, cause error, attempts int) error {
	rec := Record(msg, w.group, reason, cause, attempts, w.now())
	err := w.w.WriteMessages(ctx, rec)
	if tooLarge(err) && len(rec.Value) > MaxTruncatedValue {
		// Refusing forever would stop the partition behind this record;
		// keeping the head of the value and the coordinates of the whole
		// record loses nothing that the source topic does not still hold.
		rec.Headers = append(rec.Headers, kafka.Header{Key: HeaderValueTruncated, Value: []byte(strconv.Itoa(len(rec.Value)))})
		rec.Value = rec.Value[:MaxTruncatedValue]
		err = w.w.WriteMessages(ctx, rec)
	}
	if err != nil {
		return fmt.Errorf("dead-letter %s/%d@%d: %w", msg.Topic, msg.Partition, msg.Offset, err)
	}
	return nil
}

// tooLarge reports whether err says the record is too large for the
// broker or the writer.
func tooLarge(err error) bool {
	if err == nil {
		return false
	}
	var mtl kafka.MessageTooLargeError
	if errors.As(err, &mtl) || errors.Is(err, kafka.MessageSizeTooLarge) {
		return true
	}
	var we kafka.WriteErrors
	if errors.As(err, &we) {
		for _, e := range we {
			if tooLarge(e) {
				return true
			}
		}
	}
	return false
}

// Close flushes and closes the writer.
func (w *Writer) Close() error { return w.w.Close() }
