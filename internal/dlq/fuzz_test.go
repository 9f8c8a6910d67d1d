package dlq

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
)

// FuzzRecord: whatever the headers, key, value and error text of a record,
// its dead-letter record keeps key and value, keeps every non-dlq header,
// carries each SPEC §7 header exactly once, and a bounded, valid UTF-8
// dlq-error.
func FuzzRecord(f *testing.F) {
	f.Add([]byte("k"), []byte(`{"a":1}`), "traceparent", []byte("00-abc"), "dlq-reason", []byte("old"), "boom")
	f.Add([]byte{}, []byte{0xff, 0xfe}, "", []byte{}, "dlq-replay-count", []byte("2"), strings.Repeat("é", 2000))
	f.Fuzz(func(t *testing.T, key, value []byte, h1 string, v1 []byte, h2 string, v2 []byte, cause string) {
		msg := kafka.Message{Topic: "t", Partition: 1, Offset: 2, Key: key, Value: value,
			Headers: []kafka.Header{{Key: h1, Value: v1}, {Key: h2, Value: v2}}}
		rec := Record(msg, "g", Conflict, errors.New(cause), 3, time.Unix(0, 0))
		if string(rec.Key) != string(key) || string(rec.Value) != string(value) {
			t.Fatal("key or value changed")
		}
		seen := map[string]int{}
		for _, h := range rec.Headers {
			seen[h.Key]++
			if h.Key == HeaderError && (len(h.Value) > maxErrorLen || !utf8.Valid(h.Value)) {
				t.Fatalf("dlq-error of %d bytes, valid UTF-8 %v", len(h.Value), utf8.Valid(h.Value))
			}
		}
		for _, name := range []string{HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset,
			HeaderConsumerGroup, HeaderReason, HeaderError, HeaderAttempts, HeaderFailedAt} {
			if seen[name] != 1 {
				t.Fatalf("header %s appears %d times", name, seen[name])
			}
		}
		for _, h := range msg.Headers {
			if !strings.HasPrefix(h.Key, "dlq-") && seen[h.Key] == 0 {
				t.Fatalf("original header %q lost", h.Key)
			}
		}
	})
}
