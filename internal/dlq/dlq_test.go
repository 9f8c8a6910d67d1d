package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
)

// dlqHeaders are the headers Record adds, in SPEC §7 order.
var dlqHeaders = []string{
	HeaderOriginalTopic, HeaderOriginalPartition, HeaderOriginalOffset, HeaderConsumerGroup,
	HeaderReason, HeaderError, HeaderAttempts, HeaderFailedAt,
}

func TestHeaderNamesMatchSpec(t *testing.T) {
	want := []string{"dlq-original-topic", "dlq-original-partition", "dlq-original-offset",
		"dlq-consumer-group", "dlq-reason", "dlq-error", "dlq-attempts", "dlq-failed-at"}
	for i, h := range dlqHeaders {
		if h != want[i] {
			t.Errorf("header %d = %q, want %q", i, h, want[i])
		}
	}
	if HeaderReplayCount != "dlq-replay-count" {
		t.Errorf("HeaderReplayCount = %q", HeaderReplayCount)
	}
	for r, want := range map[Reason]string{Invalid: "invalid", Permanent: "permanent", Conflict: "conflict", Exhausted: "exhausted"} {
		if string(r) != want {
			t.Errorf("reason %q, want %q", r, want)
		}
	}
}

// source is a record as the consumer fetched it.
func source() kafka.Message {
	return kafka.Message{
		Topic: "order-service.order.confirmed", Partition: 7, Offset: 123456789012,
		Key:   []byte("1001"),
		Value: []byte(`{"event_id":"0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1d","order_id":1001}`),
		Headers: []kafka.Header{
			{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")},
			{Key: "content-type", Value: []byte("application/json")},
			{Key: "binary", Value: []byte{0, 0xff, 0x10}},
		},
	}
}

// headerValues returns every value of key in hs.
func headerValues(hs []kafka.Header, key string) []string {
	var vs []string
	for _, h := range hs {
		if h.Key == key {
			vs = append(vs, string(h.Value))
		}
	}
	return vs
}

// one returns the only value of key in hs, failing the test when there is
// not exactly one.
func one(t *testing.T, hs []kafka.Header, key string) string {
	t.Helper()
	vs := headerValues(hs, key)
	if len(vs) != 1 {
		t.Fatalf("header %s appears %d times (%q), want once", key, len(vs), vs)
	}
	return vs[0]
}

func TestRecord(t *testing.T) {
	msg := source()
	orig := kafkatest.CloneMessage(msg)
	// Not UTC: the header must still be UTC.
	now := time.Date(2026, 11, 29, 13, 4, 5, 123456789, time.FixedZone("CET", 3600))
	cause := fmt.Errorf("charge order 1001: %w", errors.New("provider answered 400"))

	rec := Record(msg, "billing-order-confirmed", Permanent, cause, 3, now)

	if !bytes.Equal(rec.Key, orig.Key) || !bytes.Equal(rec.Value, orig.Value) {
		t.Errorf("key/value = %q/%q, want the original %q/%q", rec.Key, rec.Value, orig.Key, orig.Value)
	}
	// The writer names the topic; a message that named one too would be
	// rejected by kafka-go.
	if rec.Topic != "" {
		t.Errorf("record names topic %q, want none", rec.Topic)
	}
	if len(rec.Headers) != len(orig.Headers)+len(dlqHeaders) {
		t.Fatalf("%d headers, want %d: %v", len(rec.Headers), len(orig.Headers)+len(dlqHeaders), rec.Headers)
	}
	for i, h := range orig.Headers {
		if rec.Headers[i].Key != h.Key || !bytes.Equal(rec.Headers[i].Value, h.Value) {
			t.Errorf("header %d = %s:%q, want the original %s:%q", i, rec.Headers[i].Key, rec.Headers[i].Value, h.Key, h.Value)
		}
	}
	want := map[string]string{
		HeaderOriginalTopic:     "order-service.order.confirmed",
		HeaderOriginalPartition: "7",
		HeaderOriginalOffset:    "123456789012",
		HeaderConsumerGroup:     "billing-order-confirmed",
		HeaderReason:            "permanent",
		HeaderError:             "charge order 1001: provider answered 400",
		HeaderAttempts:          "3",
	}
	for k, v := range want {
		if got := one(t, rec.Headers, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	failedAt := one(t, rec.Headers, HeaderFailedAt)
	at, err := time.Parse(time.RFC3339, failedAt)
	if err != nil {
		t.Fatalf("%s = %q is not RFC 3339: %v", HeaderFailedAt, failedAt, err)
	}
	if !at.Equal(now) {
		t.Errorf("%s = %s, want %s", HeaderFailedAt, at, now)
	}
	if !strings.HasSuffix(failedAt, "Z") {
		t.Errorf("%s = %q, want UTC", HeaderFailedAt, failedAt)
	}
	// The source message is untouched.
	if !kafkatest.EqualMessages(msg, orig) {
		t.Errorf("Record modified its input: %+v, was %+v", msg, orig)
	}
}

func TestRecordEveryReason(t *testing.T) {
	for _, r := range []Reason{Invalid, Permanent, Conflict, Exhausted} {
		rec := Record(source(), "g", r, errors.New("x"), 1, time.Now())
		if got := one(t, rec.Headers, HeaderReason); got != string(r) {
			t.Errorf("dlq-reason = %q, want %q", got, r)
		}
	}
}

func TestRecordWithoutCauseStillSaysSomething(t *testing.T) {
	rec := Record(source(), "g", Invalid, nil, 1, time.Now())
	if got := one(t, rec.Headers, HeaderError); got == "" {
		t.Error("dlq-error empty for a nil cause")
	}
}

// A replayed record that fails again carries the headers of its first
// dead-lettering: they are replaced by the new ones, except
// dlq-replay-count, which replay needs to stop a loop.
func TestRecordReplacesStaleDLQHeaders(t *testing.T) {
	msg := source()
	msg.Topic, msg.Partition, msg.Offset = "order-service.order.confirmed", 1, 99
	msg.Headers = append(msg.Headers,
		kafka.Header{Key: HeaderOriginalTopic, Value: []byte("old-topic")},
		kafka.Header{Key: HeaderOriginalPartition, Value: []byte("0")},
		kafka.Header{Key: HeaderOriginalOffset, Value: []byte("5")},
		kafka.Header{Key: HeaderConsumerGroup, Value: []byte("old-group")},
		kafka.Header{Key: HeaderReason, Value: []byte("invalid")},
		kafka.Header{Key: HeaderError, Value: []byte("old error")},
		kafka.Header{Key: HeaderAttempts, Value: []byte("9")},
		kafka.Header{Key: HeaderFailedAt, Value: []byte("2020-01-01T00:00:00Z")},
		kafka.Header{Key: HeaderReplayCount, Value: []byte("2")},
		kafka.Header{Key: "x-after", Value: []byte("kept")},
	)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := Record(msg, "billing-order-confirmed", Exhausted, errors.New("503"), 8, now)

	want := map[string]string{
		HeaderOriginalTopic:     "order-service.order.confirmed",
		HeaderOriginalPartition: "1",
		HeaderOriginalOffset:    "99",
		HeaderConsumerGroup:     "billing-order-confirmed",
		HeaderReason:            "exhausted",
		HeaderError:             "503",
		HeaderAttempts:          "8",
		HeaderFailedAt:          "2026-01-02T03:04:05Z",
		HeaderReplayCount:       "2",
		"traceparent":           "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"x-after":               "kept",
	}
	for k, v := range want {
		if got := one(t, rec.Headers, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	// Nothing else: 3 original + x-after + replay count + the 8 new ones.
	if len(rec.Headers) != 3+1+1+len(dlqHeaders) {
		t.Errorf("%d headers, want %d: %v", len(rec.Headers), 3+1+1+len(dlqHeaders), rec.Headers)
	}
}

func TestRecordTruncatesError(t *testing.T) {
	tests := []struct {
		name  string
		cause string
	}{
		{"ascii", strings.Repeat("a", 10_000)},
		{"two-byte runes", strings.Repeat("é", 1000)},
		{"three-byte runes across the limit", strings.Repeat("€", 500)},
		{"four-byte runes", "x" + strings.Repeat("🙂", 400)},
		{"invalid UTF-8", strings.Repeat("ok\xff\xfe", 600)},
		{"invalid UTF-8, short", "bad \xc3\x28 byte"},
		{"exactly the limit", strings.Repeat("b", 1024)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := Record(source(), "g", Exhausted, errors.New(tt.cause), 1, time.Now())
			got := one(t, rec.Headers, HeaderError)
			if len(got) > 1024 {
				t.Errorf("dlq-error is %d bytes, want at most 1024", len(got))
			}
			if !utf8.ValidString(got) {
				t.Errorf("dlq-error is not valid UTF-8: %q", got)
			}
			valid := strings.ToValidUTF8(tt.cause, "\uFFFD")
			if !strings.HasPrefix(valid, got) {
				t.Errorf("dlq-error %q is not a prefix of the (valid UTF-8 of the) error", got)
			}
			// Truncation keeps as much as fits: at most one rune is cut.
			if len(valid) > 1024 && len(got) < 1024-utf8.UTFMax+1 {
				t.Errorf("dlq-error is %d bytes, cut more than needed", len(got))
			}
			if len(valid) <= 1024 && got != valid {
				t.Errorf("dlq-error = %q, want %q whole", got, valid)
			}
		})
	}
}

func TestNewWriterRejectsIncompleteConfig(t *testing.T) {
	valid := WriterConfig{Brokers: []string{"127.0.0.1:9092"}, Topic: "t.dlq", GroupID: "g", Now: time.Now}
	tests := []struct {
		name string
		edit func(*WriterConfig)
	}{
		{"no brokers", func(c *WriterConfig) { c.Brokers = nil }},
		{"no topic", func(c *WriterConfig) { c.Topic = "" }},
		{"no group", func(c *WriterConfig) { c.GroupID = "" }},
		{"no clock", func(c *WriterConfig) { c.Now = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid
			tt.edit(&cfg)
			if _, err := NewWriter(cfg); err == nil {
				t.Error("NewWriter accepted an incomplete config")
			}
		})
	}
	w, err := NewWriter(valid)
	if err != nil {
		t.Fatalf("NewWriter(valid) = %v", err)
	}
	_ = w.Close()
}

// Send writes to a real Kafka protocol broker and the record reads back
// with the original key, value and headers plus the dlq-* headers.
func TestWriterSend(t *testing.T) {
	brokers := kafkatest.Brokers(t)
	topic := kafkatest.UniqueName("dlq-test")
	kafkatest.CreateTopic(t, brokers, topic, 1)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	w, err := NewWriter(WriterConfig{
		Brokers: brokers, Topic: topic, GroupID: "billing-order-confirmed",
		Transport: &kafka.Transport{}, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	first := source()
	replayed := source()
	replayed.Offset = 42
	replayed.Key = []byte("1002")
	replayed.Headers = append(replayed.Headers,
		kafka.Header{Key: HeaderReason, Value: []byte("invalid")},
		kafka.Header{Key: HeaderReplayCount, Value: []byte("1")})
	if err := w.Send(ctx, first, Permanent, errors.New("provider answered 404"), 1); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if err := w.Send(ctx, replayed, Exhausted, errors.New("provider answered 503"), 8); err != nil {
		t.Fatalf("Send: %v", err)
	}

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: brokers, Topic: topic, Partition: 0,
		Dialer:  &kafka.Dialer{Timeout: 10 * time.Second},
		MaxWait: 100 * time.Millisecond,
	})
	t.Cleanup(func() { _ = r.Close() })
	var got []kafka.Message
	for range 2 {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read back: %v", err)
		}
		got = append(got, m)
	}

	for i, tc := range []struct {
		src     kafka.Message
		reason  string
		err     string
		tries   string
		replays []string
	}{
		{first, "permanent", "provider answered 404", "1", nil},
		{replayed, "exhausted", "provider answered 503", "8", []string{"1"}},
	} {
		m := got[i]
		if !bytes.Equal(m.Key, tc.src.Key) || !bytes.Equal(m.Value, tc.src.Value) {
			t.Errorf("record %d: key/value %q/%q, want %q/%q", i, m.Key, m.Value, tc.src.Key, tc.src.Value)
		}
		for _, h := range source().Headers {
			if got := one(t, m.Headers, h.Key); got != string(h.Value) {
				t.Errorf("record %d: original header %s = %q, want %q", i, h.Key, got, h.Value)
			}
		}
		want := map[string]string{
			HeaderOriginalTopic:     tc.src.Topic,
			HeaderOriginalPartition: strconv.Itoa(tc.src.Partition),
			HeaderOriginalOffset:    strconv.FormatInt(tc.src.Offset, 10),
			HeaderConsumerGroup:     "billing-order-confirmed",
			HeaderReason:            tc.reason,
			HeaderError:             tc.err,
			HeaderAttempts:          tc.tries,
			HeaderFailedAt:          "2026-11-29T12:00:00Z",
		}
		for k, v := range want {
			if got := one(t, m.Headers, k); got != v {
				t.Errorf("record %d: %s = %q, want %q", i, k, got, v)
			}
		}
		if got := headerValues(m.Headers, HeaderReplayCount); strings.Join(got, ",") != strings.Join(tc.replays, ",") {
			t.Errorf("record %d: %s = %q, want %q", i, HeaderReplayCount, got, tc.replays)
		}
	}
}

// When the broker cannot be reached, Send fails (the caller retries and
// does not commit) and says which source record it was.
func TestWriterSendFails(t *testing.T) {
	w, err := NewWriter(WriterConfig{
		Brokers: []string{kafkatest.FreePort(t)}, Topic: "nowhere.dlq", GroupID: "g",
		Transport: &kafka.Transport{DialTimeout: 200 * time.Millisecond}, Now: time.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err = w.Send(ctx, source(), Invalid, errors.New("bad"), 1)
	if err == nil {
		t.Fatal("Send succeeded without a broker")
	}
	if !strings.Contains(err.Error(), "order-service.order.confirmed/7@123456789012") {
		t.Errorf("error %q does not name the source record", err)
	}
}

func TestParseReason(t *testing.T) {
	for _, s := range []string{"invalid", "permanent", "conflict", "exhausted"} {
		if r, err := ParseReason(s); err != nil || string(r) != s {
			t.Errorf("ParseReason(%q) = %q, %v", s, r, err)
		}
	}
	for _, s := range []string{"", "dlq.Exhausted", "other"} {
		if _, err := ParseReason(s); err == nil {
			t.Errorf("ParseReason(%q) accepted", s)
		}
	}
}

// ReplayCount reads dlq-replay-count as a count that Postgres' int holds:
// none or garbage is 0, a count beyond math.MaxInt32 is math.MaxInt32.
func TestReplayCount(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   int
	}{{"", 0}, {"x", 0}, {"-3", 0}, {"0", 0}, {"7", 7}, {"2147483647", 2147483647},
		{"2147483648", 2147483647}, {"99999999999999999999999", 2147483647}} {
		msg := kafka.Message{}
		if tc.header != "" {
			msg.Headers = []kafka.Header{{Key: HeaderReplayCount, Value: []byte(tc.header)}}
		}
		if got := ReplayCount(msg); got != tc.want {
			t.Errorf("ReplayCount(%q) = %d; want %d", tc.header, got, tc.want)
		}
	}
}
