package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/logtest"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// replayEnv is a source topic, a dead-letter topic and a replay group on
// the broker under test.
type replayEnv struct {
	brokers    []string
	src, dlq   string
	group      string
	client     *kafka.Client
	log        *logtest.Buffer
	maxReplays int
	produced   int
}

func newReplayEnv(t *testing.T, dlqPartitions int) *replayEnv {
	t.Helper()
	brokers := kafkatest.Brokers(t)
	env := &replayEnv{
		brokers:    brokers,
		src:        kafkatest.UniqueName("replay-src"),
		dlq:        kafkatest.UniqueName("replay-dlq"),
		group:      kafkatest.UniqueName("replay-group"),
		client:     &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}},
		log:        &logtest.Buffer{},
		maxReplays: 3,
	}
	kafkatest.CreateTopic(t, brokers, env.src, 3)
	kafkatest.CreateTopic(t, brokers, env.dlq, dlqPartitions)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replayer log:\n%s", env.log.String())
		}
	})
	return env
}

func (env *replayEnv) replayer(t *testing.T) *Replayer {
	t.Helper()
	r, err := New(Config{
		Brokers: env.brokers, DLQTopic: env.dlq, SourceTopic: env.src, GroupID: env.group,
		MaxReplays: env.maxReplays, Transport: &kafka.Transport{},
		Logger:         slog.New(slog.NewJSONHandler(env.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		SessionTimeout: 6 * time.Second, RebalanceTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// run is one Run, bounded so that a hang fails the test.
func (env *replayEnv) run(t *testing.T, opts Options) (Summary, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sum, err := env.replayer(t).Run(ctx, opts)
	if ctx.Err() != nil {
		t.Fatalf("Run did not end: %v", err)
	}
	return sum, err
}

func (env *replayEnv) mustRun(t *testing.T, opts Options) Summary {
	t.Helper()
	sum, err := env.run(t, opts)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return sum
}

// source is a record of the source topic as the consumer saw it.
func (env *replayEnv) source(value string, headers ...kafka.Header) kafka.Message {
	env.produced++
	return kafka.Message{Topic: env.src, Partition: env.produced % 3, Offset: int64(100 + env.produced),
		Key: []byte("order-" + value), Value: []byte(value), Headers: headers}
}

// deadLetter is the DLQ record of src for reason.
func deadLetter(src kafka.Message, reason dlq.Reason) kafka.Message {
	return dlq.Record(src, "billing", reason, errors.New("boom"), 3, time.Now())
}

// produce writes records to the DLQ in order, to partition p.
func (env *replayEnv) produce(t *testing.T, p int, records ...kafka.Message) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(env.brokers...), Topic: env.dlq, Balancer: kafka.BalancerFunc(
		func(kafka.Message, ...int) int { return p }), RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, Transport: &kafka.Transport{}}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, records...); err != nil {
		t.Fatalf("produce to %s: %v", env.dlq, err)
	}
}

// committed returns the replay group's committed offset of each DLQ
// partition (-1: none) and the partitions' ends.
func (env *replayEnv) committed(t *testing.T) (committed, end map[int]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	lags, err := consumer.GroupLag(ctx, env.client, env.dlq, env.group)
	if err != nil {
		t.Fatal(err)
	}
	committed, end = map[int]int64{}, map[int]int64{}
	for _, l := range lags {
		committed[l.Partition], end[l.Partition] = l.Committed, l.End
	}
	return committed, end
}

func (env *replayEnv) wantCommitted(t *testing.T, want map[int]int64) {
	t.Helper()
	got, _ := env.committed(t)
	for p, w := range want {
		if got[p] != w {
			t.Errorf("replay group committed %d on partition %d, want %d (all: %v)", got[p], p, w, got)
		}
	}
}

// replayCounts returns every dlq-replay-count of m.
func replayCounts(m kafka.Message) []string {
	var out []string
	for _, h := range m.Headers {
		if h.Key == dlq.HeaderReplayCount {
			out = append(out, string(h.Value))
		}
	}
	return out
}

func sortedValues(msgs []kafka.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.Value))
	}
	slices.Sort(out)
	return out
}

func wantTotals(t *testing.T, sum Summary, want Counts) {
	t.Helper()
	if sum.Total != want {
		t.Errorf("summary total %+v, want %+v (by reason %v)", sum.Total, want, sum.ByReason)
	}
}

// TestReplayRepublishesAndResumes replays records of every reason from two
// partitions: the source topic gets each original key, value and non-dlq
// headers plus dlq-replay-count; the group commits the end; a second run
// replays nothing, and a third only what arrived since.
func TestReplayRepublishesAndResumes(t *testing.T) {
	env := newReplayEnv(t, 2)
	trace := kafka.Header{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}
	custom := kafka.Header{Key: "x-origin", Value: []byte("checkout")}
	replayedOnce := env.source("c-permanent", custom, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte("1")})
	srcs := map[string]kafka.Message{}
	add := func(m kafka.Message) kafka.Message { srcs[string(m.Value)] = m; return m }
	env.produce(t, 0,
		deadLetter(add(env.source("a-invalid", trace, custom)), dlq.Invalid),
		deadLetter(add(env.source("b-exhausted")), dlq.Exhausted),
		deadLetter(add(replayedOnce), dlq.Permanent))
	env.produce(t, 1,
		deadLetter(add(env.source("d-conflict", trace)), dlq.Conflict),
		deadLetter(add(env.source("e-exhausted")), dlq.Exhausted))

	// By default only the exhausted records; each other reason by name.
	sum := env.mustRun(t, Options{})
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 3})
	if got := sum.ByReason[dlq.Exhausted].Replayed; got != 2 {
		t.Errorf("replayed %d exhausted records, want 2", got)
	}
	env.wantCommitted(t, map[int]int64{0: 0, 1: 0}) // a-invalid and d-conflict are not replayed
	for _, r := range []dlq.Reason{dlq.Invalid, dlq.Permanent, dlq.Conflict} {
		sum = env.mustRun(t, Options{Reason: r})
		if sum.Total.Replayed != 1 || sum.ByReason[r].Replayed != 1 {
			t.Errorf("--reason %s: %+v, want its one record replayed", r, sum.ByReason)
		}
	}
	out := kafkatest.MustReadTopic(t, env.brokers, env.src)
	if got, want := sortedValues(out), []string{"a-invalid", "b-exhausted", "c-permanent", "d-conflict", "e-exhausted"}; !slices.Equal(got, want) {
		t.Fatalf("source topic holds %v, want %v", got, want)
	}
	for _, m := range out {
		src := srcs[string(m.Value)]
		if !bytes.Equal(m.Key, src.Key) {
			t.Errorf("%s: key %q, want the original %q", m.Value, m.Key, src.Key)
		}
		wantCount := "1"
		if string(m.Value) == "c-permanent" {
			wantCount = "2"
		}
		var wantHeaders []kafka.Header
		for _, h := range src.Headers {
			if h.Key != dlq.HeaderReplayCount {
				wantHeaders = append(wantHeaders, h)
			}
		}
		wantHeaders = append(wantHeaders, kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte(wantCount)})
		if fmt.Sprint(m.Headers) != fmt.Sprint(wantHeaders) {
			t.Errorf("%s: headers %v, want %v", m.Value, m.Headers, wantHeaders)
		}
	}
	env.wantCommitted(t, map[int]int64{0: 3, 1: 2})

	sum = env.mustRun(t, Options{})
	wantTotals(t, sum, Counts{})
	if n := len(kafkatest.MustReadTopic(t, env.brokers, env.src)); n != 5 {
		t.Fatalf("second run: source topic has %d records, want still 5", n)
	}

	env.produce(t, 1, deadLetter(env.source("f-exhausted"), dlq.Exhausted))
	sum = env.mustRun(t, Options{})
	wantTotals(t, sum, Counts{Replayed: 1})
	if got := sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)); !slices.Contains(got, "f-exhausted") || len(got) != 6 {
		t.Fatalf("third run: source topic holds %v, want the 5 and f-exhausted", got)
	}
	env.wantCommitted(t, map[int]int64{0: 3, 1: 3})
}

// TestReplayReasonFilter replays only the chosen reason and leaves the
// others as they were: not replayed, replayed by a later run that selects
// them (they were once marked replayed for good, and the backlog gauge went
// blind).
func TestReplayReasonFilter(t *testing.T) {
	env := newReplayEnv(t, 1)
	env.produce(t, 0,
		deadLetter(env.source("invalid-1"), dlq.Invalid),
		deadLetter(env.source("exhausted-1"), dlq.Exhausted),
		deadLetter(env.source("permanent-1"), dlq.Permanent),
		deadLetter(env.source("exhausted-2"), dlq.Exhausted))
	sum := env.mustRun(t, Options{Reason: dlq.Exhausted})
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 2})
	if sum.ByReason[dlq.Invalid].NotSelected != 1 || sum.ByReason[dlq.Permanent].NotSelected != 1 {
		t.Errorf("by reason %v, want one invalid and one permanent not selected", sum.ByReason)
	}
	if got, want := sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)), []string{"exhausted-1", "exhausted-2"}; !slices.Equal(got, want) {
		t.Fatalf("source topic holds %v, want %v", got, want)
	}
	env.wantCommitted(t, map[int]int64{0: 0})
	env.wantReplayed(t, map[int][]bool{0: {false, true, false, true}})

	// The records not selected are still there for a run that selects them.
	sum = env.mustRun(t, Options{Reason: dlq.Invalid})
	wantTotals(t, sum, Counts{Replayed: 1, NotSelected: 1})
	env.wantCommitted(t, map[int]int64{0: 2})
	env.wantReplayed(t, map[int][]bool{0: {true, true, false, true}})
}

// wantReplayed checks which records of each DLQ partition the replay group
// holds replayed, by the positions dlq list and the backlog read.
func (env *replayEnv) wantReplayed(t *testing.T, want map[int][]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ids := slices.Collect(maps.Keys(want))
	pos, err := dlq.ReadPositions(ctx, env.client, env.group, env.dlq, ids)
	if err != nil {
		t.Fatal(err)
	}
	for p, w := range want {
		for o, replayed := range w {
			if pos[p].Replayed(int64(o)) != replayed {
				t.Errorf("record %d@%d: replayed %t, want %t", p, o, !replayed, replayed)
			}
		}
	}
}

// TestReplayTargeted replays one order's records, or the one record at a
// partition and offset, and nothing else; the reason still has to match
// (a conflict is replayed only by --reason conflict).
func TestReplayTargeted(t *testing.T) {
	env := newReplayEnv(t, 2)
	order := func(id int, reason dlq.Reason) kafka.Message {
		src := env.source(fmt.Sprintf(`{"order_id":%d,"n":%d}`, id, env.produced))
		src.Key = []byte(strconv.Itoa(id))
		return deadLetter(src, reason)
	}
	env.produce(t, 0, order(7, dlq.Exhausted), order(8, dlq.Exhausted), order(7, dlq.Conflict), order(9, dlq.Exhausted))
	env.produce(t, 1, order(7, dlq.Exhausted), order(9, dlq.Invalid))

	sum := env.mustRun(t, Options{Order: 7})
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 4})
	env.wantReplayed(t, map[int][]bool{0: {true, false, false, false}, 1: {true, false}})

	sum = env.mustRun(t, Options{At: &RecordAt{Partition: 0, Offset: 3}})
	wantTotals(t, sum, Counts{Replayed: 1})
	env.wantReplayed(t, map[int][]bool{0: {true, false, false, true}, 1: {true, false}})

	// The conflict record, by its offset, is not selected without its reason.
	sum = env.mustRun(t, Options{At: &RecordAt{Partition: 0, Offset: 2}})
	wantTotals(t, sum, Counts{NotSelected: 1})
	sum = env.mustRun(t, Options{At: &RecordAt{Partition: 0, Offset: 2}, Reason: dlq.Conflict, DryRun: true})
	wantTotals(t, sum, Counts{Replayed: 1})
	env.wantReplayed(t, map[int][]bool{0: {true, false, false, true}, 1: {true, false}})

	if got := len(kafkatest.MustReadTopic(t, env.brokers, env.src)); got != 3 {
		t.Errorf("source topic holds %d records, want 3 (order 7 twice, the one at 0@3)", got)
	}
	for _, at := range []RecordAt{{0, 4}, {1, -1}, {5, 0}} {
		if _, err := env.run(t, Options{At: &at}); err == nil || !strings.Contains(err.Error(), "no record at") {
			t.Errorf("record %d@%d: %v, want no record", at.Partition, at.Offset, err)
		}
	}
}

// TestReplayDryRun reports what would be replayed, and neither produces nor
// commits.
func TestReplayDryRun(t *testing.T) {
	env := newReplayEnv(t, 2)
	env.produce(t, 0, deadLetter(env.source("one"), dlq.Exhausted), deadLetter(env.source("two"), dlq.Invalid))
	env.produce(t, 1, deadLetter(env.source("three"), dlq.Exhausted))
	sum := env.mustRun(t, Options{DryRun: true, Reason: dlq.Exhausted})
	if !sum.DryRun {
		t.Error("summary does not say dry run")
	}
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 1})
	if n := len(kafkatest.MustReadTopic(t, env.brokers, env.src)); n != 0 {
		t.Fatalf("dry run produced %d records", n)
	}
	env.wantCommitted(t, map[int]int64{0: -1, 1: -1})

	sum = env.mustRun(t, Options{})
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 1})
	// A dry run starts from the group's position too.
	sum = env.mustRun(t, Options{DryRun: true})
	wantTotals(t, sum, Counts{NotSelected: 1})
}

// TestReplayMax stops after --max republished records and resumes there.
func TestReplayMax(t *testing.T) {
	env := newReplayEnv(t, 1)
	env.produce(t, 0,
		deadLetter(env.source("e0"), dlq.Exhausted),
		deadLetter(env.source("i1"), dlq.Invalid),
		deadLetter(env.source("e2"), dlq.Exhausted),
		deadLetter(env.source("e3"), dlq.Exhausted),
		deadLetter(env.source("e4"), dlq.Exhausted))
	opts := Options{Max: 2, Reason: dlq.Exhausted}
	sum := env.mustRun(t, opts)
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 1})
	if !sum.MaxReached {
		t.Error("MaxReached not set")
	}
	env.wantCommitted(t, map[int]int64{0: 1})
	if got, want := sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)), []string{"e0", "e2"}; !slices.Equal(got, want) {
		t.Fatalf("source topic holds %v, want %v", got, want)
	}

	sum = env.mustRun(t, opts)
	wantTotals(t, sum, Counts{Replayed: 2, NotSelected: 1})
	env.wantReplayed(t, map[int][]bool{0: {true, false, true, true, true}})
	sum = env.mustRun(t, opts)
	wantTotals(t, sum, Counts{NotSelected: 1})
	if sum.MaxReached {
		t.Error("MaxReached set on a run that replayed nothing")
	}
}

// TestReplayRefusesAtLimit stops at a record replayed too often, without
// marking it, run after run; the records after it are still reachable by
// their offset.
func TestReplayRefusesAtLimit(t *testing.T) {
	env := newReplayEnv(t, 1)
	env.maxReplays = 2
	count := func(n int) kafka.Header {
		return kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte(strconv.Itoa(n))}
	}
	env.produce(t, 0,
		deadLetter(env.source("fresh"), dlq.Exhausted),
		deadLetter(env.source("once", count(1)), dlq.Exhausted),
		deadLetter(env.source("twice", count(2)), dlq.Exhausted),
		deadLetter(env.source("after"), dlq.Exhausted))

	wantRefusal := func(sum Summary, err error, replayed int) {
		t.Helper()
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("Run: %v, want a *RefusedError", err)
		}
		if re.Topic != env.dlq || re.Partition != 0 || re.Offset != 2 || !strings.Contains(re.Why, "dlq-replay-count 2 has reached the limit of 2 replays") {
			t.Errorf("refusal %+v, want %s/0@2 at the limit", re, env.dlq)
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%s/0@2", env.dlq)) {
			t.Errorf("error %q does not name the record", err)
		}
		wantTotals(t, sum, Counts{Replayed: replayed, Refused: 1})
	}
	sum, err := env.run(t, Options{})
	wantRefusal(sum, err, 2)
	env.wantCommitted(t, map[int]int64{0: 2})
	if got, want := sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)), []string{"fresh", "once"}; !slices.Equal(got, want) {
		t.Fatalf("source topic holds %v, want %v", got, want)
	}
	for _, m := range kafkatest.MustReadTopic(t, env.brokers, env.src) {
		if string(m.Value) == "once" && !slices.Equal(replayCounts(m), []string{"2"}) {
			t.Errorf("once: %s %v, want [2]", dlq.HeaderReplayCount, replayCounts(m))
		}
	}

	// It stays in the way, for real and dry runs alike.
	sum, err = env.run(t, Options{})
	wantRefusal(sum, err, 0)
	sum, err = env.run(t, Options{DryRun: true})
	wantRefusal(sum, err, 0)
	env.wantCommitted(t, map[int]int64{0: 2})

	// The filter comes first: a run for another reason does not see it;
	// the record after it is replayed by its offset.
	sum = env.mustRun(t, Options{Reason: dlq.Permanent})
	wantTotals(t, sum, Counts{NotSelected: 2})
	sum = env.mustRun(t, Options{At: &RecordAt{Partition: 0, Offset: 3}})
	wantTotals(t, sum, Counts{Replayed: 1})
	env.wantCommitted(t, map[int]int64{0: 2})
	env.wantReplayed(t, map[int][]bool{0: {true, true, false, true}})
}

// TestReplayRefusesUnsafeRecords refuses records that do not say where they
// came from, come from another topic, or carry an unreadable count.
func TestReplayRefusesUnsafeRecords(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(env *replayEnv, m *kafka.Message)
		why    string
	}{
		{"no original topic", func(_ *replayEnv, m *kafka.Message) { m.Headers = dropHeader(m.Headers, dlq.HeaderOriginalTopic) },
			"no dlq-original-topic header"},
		{"empty original topic", func(_ *replayEnv, m *kafka.Message) { putHeader(m, dlq.HeaderOriginalTopic, "") },
			"no dlq-original-topic header"},
		{"another topic", func(_ *replayEnv, m *kafka.Message) { putHeader(m, dlq.HeaderOriginalTopic, "payments.internal") },
			`"payments.internal" is not the source topic`},
		{"unreadable count", func(_ *replayEnv, m *kafka.Message) { putHeader(m, dlq.HeaderReplayCount, "-1") },
			`dlq-replay-count "-1" is not a count`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newReplayEnv(t, 1)
			bad := deadLetter(env.source("bad"), dlq.Exhausted)
			tc.mutate(env, &bad)
			env.produce(t, 0, deadLetter(env.source("good"), dlq.Exhausted), bad)
			sum, err := env.run(t, Options{})
			var re *RefusedError
			if !errors.As(err, &re) || re.Offset != 1 || !strings.Contains(re.Why, tc.why) {
				t.Fatalf("Run: %v, want a refusal of offset 1 with %q", err, tc.why)
			}
			wantTotals(t, sum, Counts{Replayed: 1, Refused: 1})
			if got := sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)); !slices.Equal(got, []string{"good"}) {
				t.Fatalf("source topic holds %v, want [good]", got)
			}
			env.wantCommitted(t, map[int]int64{0: 1})
		})
	}
}

func dropHeader(hs []kafka.Header, key string) []kafka.Header {
	return slices.DeleteFunc(slices.Clone(hs), func(h kafka.Header) bool { return h.Key == key })
}

func putHeader(m *kafka.Message, key, value string) {
	m.Headers = append(dropHeader(m.Headers, key), kafka.Header{Key: key, Value: []byte(value)})
}

// TestReplayEndsWhileRecordsArrive: a run stops at the log end of its
// start, however fast records keep coming.
func TestReplayEndsWhileRecordsArrive(t *testing.T) {
	env := newReplayEnv(t, 1)
	for i := range 10 {
		env.produce(t, 0, deadLetter(env.source("before-"+strconv.Itoa(i)), dlq.Exhausted))
	}
	ctx, stop := context.WithCancel(context.Background())
	var written atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		w := &kafka.Writer{Addr: kafka.TCP(env.brokers...), Topic: env.dlq, RequiredAcks: kafka.RequireAll,
			BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
		defer w.Close()
		for i := 0; ctx.Err() == nil; i++ {
			src := kafka.Message{Topic: env.src, Value: []byte("during-" + strconv.Itoa(i))}
			if w.WriteMessages(ctx, deadLetter(src, dlq.Exhausted)) == nil {
				written.Add(1)
			}
		}
	})
	defer func() { stop(); wg.Wait() }()
	poll.Until(t, 30*time.Second, "5 records written while the run starts", func() bool { return written.Load() >= 5 })
	before := int(written.Load())
	sum := env.mustRun(t, Options{})
	after := int(written.Load())
	if sum.Total.Replayed < 10+before || sum.Total.Replayed > 10+after {
		t.Fatalf("replayed %d records, want between the %d written before the run and the %d written by its end",
			sum.Total.Replayed, 10+before, 10+after)
	}
	t.Logf("replayed %d; %d records were written before the run, %d by its end", sum.Total.Replayed, 10+before, 10+after)
}

// TestReplayConcurrentRuns: two runs of one group split the partitions (or
// one finds nothing left); together they replay everything, and the group
// ends committed at the end.
func TestReplayConcurrentRuns(t *testing.T) {
	env := newReplayEnv(t, 4)
	var want []string
	for p := range 4 {
		var recs []kafka.Message
		for i := range 5 {
			v := fmt.Sprintf("p%d-%d", p, i)
			want = append(want, v)
			recs = append(recs, deadLetter(env.source(v), dlq.Exhausted))
		}
		env.produce(t, p, recs...)
	}
	slices.Sort(want)
	var wg sync.WaitGroup
	sums := make([]Summary, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { sums[i], errs[i] = env.run(t, Options{}) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	if n := sums[0].Total.Replayed + sums[1].Total.Replayed; n < 20 {
		t.Errorf("runs replayed %d records in all, want at least 20", n)
	}
	// A record republished just before a rebalance may be there twice:
	// harmless, the consumer deduplicates.
	got := slices.Compact(sortedValues(kafkatest.MustReadTopic(t, env.brokers, env.src)))
	if !slices.Equal(got, want) {
		t.Fatalf("source topic holds %v, want %v", got, want)
	}
	env.wantCommitted(t, map[int]int64{0: 5, 1: 5, 2: 5, 3: 5})
}

// TestJudge checks the per-record decision without a broker.
func TestJudge(t *testing.T) {
	r := &Replayer{cfg: Config{SourceTopic: "orders", MaxReplays: 3}}
	h := func(k, v string) kafka.Header { return kafka.Header{Key: k, Value: []byte(v)} }
	base := []kafka.Header{h("traceparent", "t"), h(dlq.HeaderOriginalTopic, "orders"), h(dlq.HeaderOriginalPartition, "2"),
		h(dlq.HeaderOriginalOffset, "9"), h(dlq.HeaderConsumerGroup, "g"), h(dlq.HeaderReason, "exhausted"), h(dlq.HeaderError, "e"),
		h(dlq.HeaderAttempts, "8"), h(dlq.HeaderFailedAt, "2026-01-01T00:00:00Z"), h("x-b", "b")}
	for _, tc := range []struct {
		name      string
		headers   []kafka.Header
		filter    dlq.Reason
		skip      bool
		why       string
		wantCount string
	}{
		{name: "first replay", headers: base, wantCount: "1"},
		{name: "conflict by default", headers: append(dropHeader(base, dlq.HeaderReason), h(dlq.HeaderReason, "conflict")), skip: true},
		{name: "invalid by default", headers: append(dropHeader(base, dlq.HeaderReason), h(dlq.HeaderReason, "invalid")), skip: true},
		{name: "matching filter", headers: base, filter: dlq.Exhausted, wantCount: "1"},
		{name: "other reason", headers: base, filter: dlq.Invalid, skip: true},
		{name: "no reason header, filtered", headers: dropHeader(base, dlq.HeaderReason), filter: dlq.Exhausted, skip: true},
		{name: "no reason header", headers: dropHeader(base, dlq.HeaderReason), skip: true},
		{name: "below the limit", headers: append(slices.Clone(base), h(dlq.HeaderReplayCount, "2")), wantCount: "3"},
		{name: "at the limit", headers: append(slices.Clone(base), h(dlq.HeaderReplayCount, "3")), why: "dlq-replay-count 3 has reached the limit of 3 replays"},
		{name: "filtered out at the limit", headers: append(slices.Clone(base), h(dlq.HeaderReplayCount, "3")), filter: dlq.Conflict, skip: true},
		{name: "two counts, highest wins", headers: append(slices.Clone(base), h(dlq.HeaderReplayCount, "3"), h(dlq.HeaderReplayCount, "0")), why: "dlq-replay-count 3 has reached"},
		{name: "garbage count", headers: append(slices.Clone(base), h(dlq.HeaderReplayCount, "two")), why: "is not a count"},
		{name: "no origin", headers: dropHeader(base, dlq.HeaderOriginalTopic), why: "no dlq-original-topic"},
		{name: "other origin", headers: append(dropHeader(base, dlq.HeaderOriginalTopic), h(dlq.HeaderOriginalTopic, "x")), why: "is not the source topic"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := kafka.Message{Topic: "dlq", Key: []byte("k"), Value: []byte("v"), Headers: tc.headers}
			v := r.judge(msg, Options{Reason: tc.filter})
			if v.notSelected != tc.skip || !strings.Contains(v.why, tc.why) || (tc.why == "") != (v.why == "") {
				t.Fatalf("verdict skip=%v why=%q, want skip=%v why~%q", v.notSelected, v.why, tc.skip, tc.why)
			}
			if tc.skip || tc.why != "" {
				return
			}
			want := []kafka.Header{h("traceparent", "t"), h("x-b", "b"), h(dlq.HeaderReplayCount, tc.wantCount)}
			if v.out.Topic != "orders" || string(v.out.Key) != "k" || string(v.out.Value) != "v" || fmt.Sprint(v.out.Headers) != fmt.Sprint(want) {
				t.Fatalf("out %s %q %q %v, want orders k v %v", v.out.Topic, v.out.Key, v.out.Value, v.out.Headers, want)
			}
		})
	}
}
