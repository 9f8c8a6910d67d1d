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
)

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
		Transport:    cfg.Transport,
	}
	return &Writer{w: w, group: cfg.GroupID, now: cfg.Now}, nil
}

// Send dead-letters msg. A nil error means the record is durably in the
// dead-letter topic; on error nothing may be assumed and the caller retries
// (the topic may then hold the record twice, which replay tolerates).
func (w *Writer) Send(ctx context.Context, msg kafka.Message, reason Reason, cause error, attempts int) error {
	rec := Record(msg, w.group, reason, cause, attempts, w.now())
	if err := w.w.WriteMessages(ctx, rec); err != nil {
		return fmt.Errorf("dead-letter %s/%d@%d: %w", msg.Topic, msg.Partition, msg.Offset, err)
	}
	return nil
}

// Close flushes and closes the writer.
func (w *Writer) Close() error { return w.w.Close() }
