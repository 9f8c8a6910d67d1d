package pipeline

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/field"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
)

// Errors of each kind, as the billing service returns them (wrapped once
// more, as a caller would).
var (
	errInvalid   = fmt.Errorf("bill: %w", fault.New(fault.Invalid, errors.New("amount out of range")))
	errPermanent = fmt.Errorf("bill: %w", fault.New(fault.Permanent, errors.New("provider answered 400")))
	errConflict  = fmt.Errorf("bill: %w", fault.New(fault.Conflict, errors.New("provider answered 422")))
	errTransient = fmt.Errorf("bill: %w", fault.New(fault.Transient, errors.New("provider answered 503")))
	errSystemic  = fmt.Errorf("bill: %w", fault.New(fault.Systemic, errors.New("provider answered 401")))
	// errUnknown has no kind: it must be retried like a transient one.
	errUnknown = errors.New("connection reset by peer")
)

// seq answers call n with steps[n-1], and with the last step after that.
type step struct {
	res billing.Result
	err error
}

func seq(steps ...step) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
	return func(_ context.Context, call int, _ events.OrderConfirmed) (billing.Result, error) {
		s := steps[min(call, len(steps))-1]
		return s.res, s.err
	}
}

func fail(err error) step { return step{err: err} }
func ok(o billing.Outcome) step {
	return step{res: billing.Result{Outcome: o}}
}

// repeat is n copies of s.
func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestHandle(t *testing.T) {
	future := time.Now().Add(48 * time.Hour)
	tests := []struct {
		name string
		// value is the record value; nil means a fresh valid event.
		value func(t *testing.T) []byte
		// steps answer the biller's calls; nil means it must not be called.
		steps []step
		// dlqFailures is how many Sends fail before one succeeds.
		dlqFailures int

		wantCalls    int
		wantReason   dlq.Reason // "" when nothing may be dead-lettered
		wantAttempts int
		wantCause    error // errors.Is(cause, wantCause); nil to skip
		wantCauseKnd fault.Kind
		want         map[string]float64
	}{
		{
			name:         "garbage bytes are invalid, biller never called",
			value:        func(*testing.T) []byte { return []byte("not json at all") },
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCauseKnd: fault.Invalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
		{
			name:         "empty value (tombstone) is invalid",
			value:        func(*testing.T) []byte { return nil },
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCauseKnd: fault.Invalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
		{
			name: "event_id 48h in the future is invalid",
			value: func(t *testing.T) []byte {
				return eventJSON(events.IDAt(future), time.Now(), 1001, "99.95")
			},
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCauseKnd: fault.Invalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
		{
			name: "occurred_at 48h in the future is invalid",
			value: func(t *testing.T) []byte {
				return eventJSON(events.IDAt(time.Now()), future, 1001, "99.95")
			},
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCauseKnd: fault.Invalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
		{
			name: "old event is valid",
			value: func(t *testing.T) []byte {
				old := time.Now().AddDate(-1, 0, 0)
				return eventJSON(events.IDAt(old), old, 1001, "99.95")
			},
			steps:     []step{ok(billing.Charged)},
			wantCalls: 1,
			want:      map[string]float64{eventsKey("charged"): 1},
		},
		{
			name:      "charged",
			steps:     []step{ok(billing.Charged)},
			wantCalls: 1,
			want:      map[string]float64{eventsKey("charged"): 1},
		},
		{
			name:      "duplicate",
			steps:     []step{ok(billing.Duplicate)},
			wantCalls: 1,
			want:      map[string]float64{eventsKey("duplicate"): 1},
		},
		{
			name:      "duplicate order",
			steps:     []step{ok(billing.DuplicateOrder)},
			wantCalls: 1,
			want:      map[string]float64{eventsKey("duplicate_order"): 1},
		},
		{
			name:      "outside every dedup partition is counted",
			steps:     []step{{res: billing.Result{Outcome: billing.Charged, DedupBypassed: true}}},
			wantCalls: 1,
			want:      map[string]float64{eventsKey("charged"): 1, outOfRangeKey: 1},
		},
		{
			name:         "invalid from the biller is dead-lettered at once",
			steps:        []step{fail(errInvalid)},
			wantCalls:    1,
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCause:    errInvalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
		{
			name:         "permanent after one attempt",
			steps:        []step{fail(errPermanent)},
			wantCalls:    1,
			wantReason:   dlq.Permanent,
			wantAttempts: 1,
			wantCause:    errPermanent,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("permanent"): 1},
		},
		{
			name:         "conflict after one attempt",
			steps:        []step{fail(errConflict)},
			wantCalls:    1,
			wantReason:   dlq.Conflict,
			wantAttempts: 1,
			wantCause:    errConflict,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("conflict"): 1},
		},
		{
			name:         "transient is retried MaxAttempts times, then exhausted",
			steps:        []step{fail(errTransient)},
			wantCalls:    testMaxAttempts,
			wantReason:   dlq.Exhausted,
			wantAttempts: testMaxAttempts,
			wantCause:    errTransient,
			want: map[string]float64{eventsKey("dlq"): 1, dlqKey("exhausted"): 1,
				retriesKey("transient"): testMaxAttempts - 1},
		},
		{
			name:         "an error without a kind is retried like a transient one",
			steps:        []step{fail(errUnknown)},
			wantCalls:    testMaxAttempts,
			wantReason:   dlq.Exhausted,
			wantAttempts: testMaxAttempts,
			wantCause:    errUnknown,
			want: map[string]float64{eventsKey("dlq"): 1, dlqKey("exhausted"): 1,
				retriesKey("transient"): testMaxAttempts - 1},
		},
		{
			name:      "transient then success",
			steps:     []step{fail(errTransient), fail(errTransient), ok(billing.Charged)},
			wantCalls: 3,
			want:      map[string]float64{eventsKey("charged"): 1, retriesKey("transient"): 2},
		},
		{
			name:         "transient then permanent counts the attempts",
			steps:        []step{fail(errTransient), fail(errPermanent)},
			wantCalls:    2,
			wantReason:   dlq.Permanent,
			wantAttempts: 2,
			wantCause:    errPermanent,
			want: map[string]float64{eventsKey("dlq"): 1, dlqKey("permanent"): 1,
				retriesKey("transient"): 1},
		},
		{
			name:      "systemic failures do not consume attempts",
			steps:     append(repeat(20, fail(errSystemic)), ok(billing.Charged)),
			wantCalls: 21,
			want:      map[string]float64{eventsKey("charged"): 1, retriesKey("systemic"): 20},
		},
		{
			name: "systemic between transients is not an attempt",
			steps: append(append([]step{fail(errTransient)}, repeat(5, fail(errSystemic))...),
				fail(errTransient), fail(errTransient)),
			wantCalls:    8,
			wantReason:   dlq.Exhausted,
			wantAttempts: testMaxAttempts,
			wantCause:    errTransient,
			want: map[string]float64{eventsKey("dlq"): 1, dlqKey("exhausted"): 1,
				retriesKey("transient"): 2, retriesKey("systemic"): 5},
		},
		{
			name:         "DLQ write failing is retried until acknowledged, counted once",
			steps:        []step{fail(errPermanent)},
			dlqFailures:  4,
			wantCalls:    1,
			wantReason:   dlq.Permanent,
			wantAttempts: 1,
			wantCause:    errPermanent,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("permanent"): 1},
		},
		{
			name:         "DLQ write failing for an invalid record",
			value:        func(*testing.T) []byte { return []byte(`{"event_id":1}`) },
			dlqFailures:  2,
			wantReason:   dlq.Invalid,
			wantAttempts: 1,
			wantCauseKnd: fault.Invalid,
			want:         map[string]float64{eventsKey("dlq"): 1, dlqKey("invalid"): 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var msg kafka.Message
			if tt.value == nil {
				msg, _ = validRecord(t)
			} else {
				msg = record(tt.value(t))
			}
			orig := kafkatest.CloneMessage(msg)

			biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				t.Error("biller called for a record that must not be billed")
				return billing.Result{}, errPermanent
			}}
			if tt.steps != nil {
				biller.process = seq(tt.steps...)
			}
			dl := &fakeDLQ{send: func(_ context.Context, call int) error {
				if call <= tt.dlqFailures {
					return errors.New("kafka: not enough in-sync replicas")
				}
				return nil
			}}
			env := newEnv(t, biller, dl, nil)

			if err := env.h.Handle(context.Background(), msg); err != nil {
				t.Fatalf("Handle: %v", err)
			}

			calls := biller.calls()
			if len(calls) != tt.wantCalls {
				t.Errorf("biller called %d times, want %d", len(calls), tt.wantCalls)
			}
			if len(calls) > 0 {
				want, err := events.Decode(msg.Value, time.Now())
				if err != nil {
					t.Fatalf("decode: %v", err)
				}
				for i, ev := range calls {
					if !reflect.DeepEqual(ev, want) {
						t.Errorf("call %d billed %+v, want the decoded record %+v", i+1, ev, want)
					}
				}
			}

			sends := dl.calls()
			if tt.wantReason == "" {
				if len(sends) != 0 {
					t.Errorf("dead-lettered %d times (reason %s), want never", len(sends), sends[0].reason)
				}
			} else {
				if len(sends) != tt.dlqFailures+1 {
					t.Fatalf("Send called %d times, want %d", len(sends), tt.dlqFailures+1)
				}
				if !dl.isAcked() {
					t.Error("Handle returned before the DLQ acknowledged the record")
				}
				for i, s := range sends {
					if s.reason != tt.wantReason || s.attempts != tt.wantAttempts {
						t.Errorf("Send %d: reason %s attempts %d, want %s attempts %d", i+1, s.reason, s.attempts, tt.wantReason, tt.wantAttempts)
					}
					if !kafkatest.EqualMessages(s.msg, orig) {
						t.Errorf("Send %d: message %+v, want the original %+v", i+1, s.msg, orig)
					}
					if s.cause == nil {
						t.Errorf("Send %d: nil cause", i+1)
					} else if tt.wantCause != nil && !errors.Is(s.cause, tt.wantCause) {
						t.Errorf("Send %d: cause %v, want %v", i+1, s.cause, tt.wantCause)
					} else if tt.wantCause == nil && fault.KindOf(s.cause) != tt.wantCauseKnd {
						t.Errorf("Send %d: cause kind %v, want %v", i+1, fault.KindOf(s.cause), tt.wantCauseKnd)
					}
				}
			}
			diffCounters(t, env.counters(t), tt.want)
			if env.h.Stalled() {
				t.Error("Stalled() after Handle returned")
			}
		})
	}
}

// The biller gets the very same event on every attempt, so the payment call
// carries the same Idempotency-Key and body each time.
func TestRetriesBillTheIdenticalEvent(t *testing.T) {
	msg, id := validRecord(t)
	biller := &fakeBiller{process: seq(fail(errTransient), fail(errSystemic), fail(errUnknown), ok(billing.Charged))}
	env := newEnv(t, biller, nil, func(c *Config) { c.MaxAttempts = 10 })
	if err := env.h.Handle(context.Background(), msg); err != nil {
		t.Fatal(err)
	}
	calls := biller.calls()
	if len(calls) != 4 {
		t.Fatalf("%d calls, want 4", len(calls))
	}
	for i, ev := range calls {
		if ev.EventID != id || ev.TotalAmount.String() != "99.95" || ev.OrderID != 1001 || ev.CustomerID != 42 {
			t.Errorf("call %d: event %s order %d customer %d amount %s, want %s 1001 42 99.95",
				i+1, ev.EventID, ev.OrderID, ev.CustomerID, ev.TotalAmount, id)
		}
		if !reflect.DeepEqual(ev, calls[0]) {
			t.Errorf("call %d differs from call 1: %+v vs %+v", i+1, ev, calls[0])
		}
	}
}

func TestStalledWhileWaitingOutSystemicFailure(t *testing.T) {
	msg, _ := validRecord(t)
	var release atomic.Bool
	biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
		if !release.Load() {
			return billing.Result{}, errSystemic
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, func(c *Config) { c.MaxAttempts = 1 })
	if env.h.Stalled() {
		t.Fatal("Stalled() before any event")
	}
	done := make(chan error, 1)
	go func() { done <- env.h.Handle(context.Background(), msg) }()

	poll.Until(t, 10*time.Second, "Stalled() while the biller fails systemically", env.h.Stalled)
	// Still stalled well past MaxAttempts: systemic failures are not the
	// event's fault and must not dead-letter it.
	poll.Until(t, 10*time.Second, "many systemic failures", func() bool { return len(biller.calls()) > 10 })
	if len(env.dlq.calls()) != 0 {
		t.Fatal("dead-lettered during a systemic failure")
	}
	release.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("Handle: %v", err)
	}
	if env.h.Stalled() {
		t.Error("Stalled() after the failure cleared")
	}
	if got := env.counters(t)[eventsKey("charged")]; got != 1 {
		t.Errorf("charged = %v, want 1", got)
	}
	if got := env.counters(t)[eventsKey("dlq")]; got != 0 {
		t.Errorf("dlq = %v, want 0", got)
	}
	if got := env.counters(t)[retriesKey("systemic")]; got < 10 {
		t.Errorf("systemic retries = %v, want > 10", got)
	}
}

// Stalled is true while any of several concurrent events waits out a
// systemic failure, and false once all have finished.
func TestStalledCountsConcurrentEvents(t *testing.T) {
	var release atomic.Bool
	biller := &fakeBiller{process: func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
		if !release.Load() {
			return billing.Result{}, errSystemic
		}
		return billing.Result{Outcome: billing.Charged}, nil
	}}
	env := newEnv(t, biller, nil, nil)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		msg, _ := validRecord(t)
		wg.Go(func() { errs <- env.h.Handle(context.Background(), msg) })
	}
	poll.Until(t, 10*time.Second, "Stalled()", env.h.Stalled)
	release.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Handle: %v", err)
		}
	}
	if env.h.Stalled() {
		t.Error("Stalled() after every event finished")
	}
	if got := env.counters(t)[eventsKey("charged")]; got != n {
		t.Errorf("charged = %v, want %d", got, n)
	}
}

// A cancelled ctx (rebalance, shutdown) leaves the record uncommitted for
// redelivery: Handle returns ctx's error, dead-letters nothing and counts
// nothing.
func TestHandleContextEnds(t *testing.T) {
	tests := []struct {
		name string
		// bill answers the biller's calls; cancel ends the context.
		bill    func(cancel context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error)
		dlqFail bool
		// cancelSend, when not 0, is the DLQ Send that ends the context
		// and fails because of it, as a real writer would.
		cancelSend int
	}{
		{
			name: "during a transient backoff",
			bill: func(cancel context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
					// Handle is in its (hour-long) backoff when this fires.
					time.AfterFunc(5*time.Millisecond, cancel)
					return billing.Result{}, errTransient
				}
			},
		},
		{
			name: "during a systemic pause",
			bill: func(cancel context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
					time.AfterFunc(5*time.Millisecond, cancel)
					return billing.Result{}, errSystemic
				}
			},
		},
		{
			name: "while the biller runs",
			bill: func(cancel context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return func(ctx context.Context, _ int, _ events.OrderConfirmed) (billing.Result, error) {
					cancel()
					<-ctx.Done()
					// A permanent-looking error caused by the cancellation
					// must not dead-letter the event.
					return billing.Result{}, fmt.Errorf("%w: %w", errPermanent, ctx.Err())
				}
			},
		},
		{
			name: "while the DLQ write is retried",
			bill: func(cancel context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
					time.AfterFunc(20*time.Millisecond, cancel)
					return billing.Result{}, errPermanent
				}
			},
			dlqFail: true,
		},
		{
			name: "while a DLQ write is in flight",
			bill: func(context.CancelFunc) func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
				return func(context.Context, int, events.OrderConfirmed) (billing.Result, error) {
					return billing.Result{}, errConflict
				}
			},
			dlqFail:    true,
			cancelSend: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msg, _ := validRecord(t)
			biller := &fakeBiller{process: tt.bill(cancel)}
			dl := &fakeDLQ{send: func(ctx context.Context, call int) error {
				if call == tt.cancelSend {
					cancel()
					return fmt.Errorf("write: %w", ctx.Err())
				}
				if tt.dlqFail {
					return errors.New("kafka: leader not available")
				}
				return nil
			}}
			env := newEnv(t, biller, dl, func(c *Config) {
				if !tt.dlqFail {
					c.BackoffBase, c.BackoffMax = time.Hour, time.Hour
				}
			})
			done := make(chan error, 1)
			go func() { done <- env.h.Handle(ctx, msg) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Handle did not return after ctx was cancelled")
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Handle = %v, want context.Canceled", err)
			}
			if dl.isAcked() {
				t.Error("record dead-lettered although ctx ended")
			}
			if tt.dlqFail && len(dl.calls()) == 0 {
				t.Error("DLQ never tried")
			}
			got := env.counters(t)
			for k, v := range got {
				if k != retriesKey("transient") && k != retriesKey("systemic") {
					t.Errorf("%s = %v, want 0", k, v)
				}
			}
			if env.h.Stalled() {
				t.Error("Stalled() after Handle returned")
			}
		})
	}
}

// A context that is already done still lets nothing through: no DLQ for a
// valid record, no count.
func TestHandleDeadlineExceeded(t *testing.T) {
	msg, _ := validRecord(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	biller := &fakeBiller{process: func(ctx context.Context, _ int, _ events.OrderConfirmed) (billing.Result, error) {
		<-ctx.Done()
		return billing.Result{}, ctx.Err()
	}}
	env := newEnv(t, biller, nil, nil)
	if err := env.h.Handle(ctx, msg); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Handle = %v, want DeadlineExceeded", err)
	}
	if n := len(env.dlq.calls()); n != 0 {
		t.Errorf("%d DLQ sends, want 0", n)
	}
	diffCounters(t, env.counters(t), map[string]float64{})
}

// Handle is safe for concurrent use: many events at once, each counted
// exactly once.
func TestHandleConcurrent(t *testing.T) {
	const n = 60
	biller := &fakeBiller{process: func(_ context.Context, _ int, ev events.OrderConfirmed) (billing.Result, error) {
		switch ev.OrderID % 3 {
		case 0:
			return billing.Result{Outcome: billing.Charged}, nil
		case 1:
			return billing.Result{}, errPermanent
		}
		return billing.Result{Outcome: billing.Duplicate}, nil
	}}
	env := newEnv(t, biller, nil, nil)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			id := events.IDAt(time.Now())
			if err := env.h.Handle(context.Background(), record(eventJSON(id, time.Now(), int64(i+1), "1.00"))); err != nil {
				t.Errorf("Handle: %v", err)
			}
		})
	}
	wg.Wait()
	diffCounters(t, env.counters(t), map[string]float64{
		eventsKey("charged"): n / 3, eventsKey("duplicate"): n / 3,
		eventsKey("dlq"): n / 3, dlqKey("permanent"): n / 3,
	})
}

func TestNewRejectsIncompleteConfig(t *testing.T) {
	valid := func() Config {
		reg := newEnv(t, &fakeBiller{}, nil, nil)
		return reg.h.cfg
	}
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"no biller", func(c *Config) { c.Biller = nil }},
		{"no dlq", func(c *Config) { c.DLQ = nil }},
		{"no decisions", func(c *Config) { c.Decisions = nil }},
		{"no metrics", func(c *Config) { c.Metrics = nil }},
		{"no logger", func(c *Config) { c.Logger = nil }},
		{"no clock", func(c *Config) { c.Now = nil }},
		{"zero attempts", func(c *Config) { c.MaxAttempts = 0 }},
		{"negative budget", func(c *Config) { c.RetryBudget = -time.Second }},
		{"negative outage time", func(c *Config) { c.OutageAfter = -time.Second }},
		{"negative outage threshold", func(c *Config) { c.OutageThreshold = -1 }},
		{"zero backoff", func(c *Config) { c.BackoffBase = 0 }},
		{"negative backoff", func(c *Config) { c.BackoffBase, c.BackoffMax = -time.Second, time.Second }},
		{"max below base", func(c *Config) { c.BackoffMax = c.BackoffBase / 2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.edit(&cfg)
			if h, err := New(cfg); err == nil {
				t.Errorf("New = %v, nil; want an error", h)
			}
		})
	}
	if _, err := New(valid()); err != nil {
		t.Errorf("New(valid) = %v", err)
	}
}

// Validate names each wrong field as the struct does, so that cmd can
// report it under the variable that sets it.
func TestValidateNamesTheFields(t *testing.T) {
	cfg := Config{MaxAttempts: 0, RetryBudget: -time.Second, OutageThreshold: -1, OutageAfter: -time.Second,
		BackoffBase: 2 * time.Second, BackoffMax: time.Second}
	var got []string
	for _, fe := range field.Errors(cfg.Validate()) {
		got = append(got, fe.Error())
	}
	want := []string{"MaxAttempts: 0, want at least 1", "RetryBudget: -1s, want 0 or more",
		"OutageThreshold: must be 0 (off) or more, got -1", "OutageAfter: must be 0s (off) or more, got -1s",
		"BackoffMax: must be at least BackoffBase (2s), got 1s"}
	if !slices.Equal(got, want) {
		t.Errorf("Validate() fields:\n got %q\nwant %q", got, want)
	}
	if err := (Config{MaxAttempts: 1, BackoffBase: time.Second, BackoffMax: time.Second}).Validate(); err != nil {
		t.Errorf("Validate(valid) = %v", err)
	}
}
