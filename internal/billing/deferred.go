package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// Deferred decisions (SPEC §10, §11): an event that waits on another
// event's unsettled claim on its order (Process answers fault.Busy) must
// not hold its partition either. After BILLING_PARK_AFTER of waiting the
// pipeline defers it — at once when the claim is blocked, its own or
// another event's (ErrHeld): only an operator's decision settles that —
// and a parked event keeps its record in a row waiting on its own claim
// (park.go). Defer stores its record, exactly as consumed, in
// deferred_event (migrations 00008 and 00009: its header keys as bytes), and the record is committed. Once the
// claim it waits on is settled (charged, released; a blocked claim by the
// operator), the deciding loop takes the row
// up (TakeDeferred), decides the event through Process exactly as a
// redelivery would be decided — Duplicate, DuplicateOrder, a Conflict to
// dead-letter from the stored bytes, or its own charge if the claim was
// released (a definite refusal of that charge then dead-letters it
// `permanent`) — and deletes the row (FinishDeferred) only after that
// decision is durable. A crash before the delete decides the event again:
// the ledger and processed_event make the second decision a Duplicate, so
// nothing is charged twice; a dead-letter record may be written twice (at
// least once, as every DLQ write is).

// Record is a Kafka record as consumed: what a deferred event's decision
// needs to dead-letter it with its original key, value and headers.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

// Header is one record header. Key is the key's bytes as kafka-go hands
// them over, not necessarily UTF-8 (Kafka's own clients write Java strings,
// but any producer may write any bytes): Defer keeps them exactly, for the
// dead letter written from the stored record.
type Header struct {
	Key   string
	Value []byte
}

// Deferred is a deferred event: a row of deferred_event.
type Deferred struct {
	// Seq is the row's place in the order of deferrals.
	Seq     int64
	EventID uuid.UUID
	OrderID int64
	// WaitsFor is the event whose claim held the order at deferral.
	WaitsFor uuid.UUID
	Record   Record
	// Age is the time since the deferral, by the database's clock.
	Age time.Duration
	// Attempts counts the times the row was taken up, this one included.
	Attempts int
}

// Defer stores ev's record rec for a later decision. It returns true when
// the record is stored (now or by an earlier delivery of the same bytes):
// the caller may commit it. False means neither another event's claim nor
// ev's own blocked claim holds ev's order any more: the caller processes
// ev again, which decides it now.
func (s *Service) Defer(ctx context.Context, ev events.OrderConfirmed, rec Record) (bool, error) {
	dctx, cancel := s.live(ctx)
	defer cancel()
	return s.store.Defer(dctx, s.group, ev, rec)
}

// TakeDeferred leases one deferred event that is due and whose order is
// held neither by an unsettled claim (another event's, or its own blocked
// or parked one) nor by an event deferred before it, or returns false: no other replica takes it for lease, which
// must outlast its decision. A row whose decision crashed is taken up
// again once its lease ends.
func (s *Service) TakeDeferred(ctx context.Context, lease time.Duration) (Deferred, bool, error) {
	qctx, cancel := s.live(ctx)
	defer cancel()
	return s.store.TakeDeferred(qctx, s.group, lease)
}

// FinishDeferred deletes d's row: its decision is durable (the ledger and
// processed_event, or an acknowledged dead-letter record). A decider
// whose lease was taken over deletes nothing: the new holder decides the
// event again (to the same outcome) and finishes it.
func (s *Service) FinishDeferred(ctx context.Context, d Deferred) error {
	fctx, cancel := s.detached(ctx)
	defer cancel()
	return s.store.FinishDeferred(fctx, d)
}

// RetryDeferred gives d back, to be taken up again after the delay: its
// decision did not finish (its own charge's outcome is unknown, or the
// order is claimed again), cause says why.
func (s *Service) RetryDeferred(ctx context.Context, d Deferred, after time.Duration, cause error) error {
	rctx, cancel := s.detached(ctx)
	defer cancel()
	return s.store.RetryDeferred(rctx, d, after, cause.Error())
}

// held reads, for evs[idx], the events deferred before them that hold
// their orders (heldSQL). Only an event whose claim found no row asks:
// rarely, and never on the common paths.
func (s *Service) held(ctx context.Context, evs []events.OrderConfirmed, idx []int) (map[uuid.UUID]uuid.UUID, error) {
	orders, ids := make([]int64, len(idx)), make([]uuid.UUID, len(idx))
	for k, i := range idx {
		orders[k], ids[k] = evs[i].OrderID, evs[i].EventID
	}
	cctx, cancel := s.live(ctx)
	defer cancel()
	return s.store.HeldBy(cctx, s.group, orders, ids)
}

// DeferredBehind is a deferred event as `claim show` lists it.
type DeferredBehind struct {
	Group    string
	EventID  uuid.UUID
	WaitsFor uuid.UUID
	// DeferredAt is the database's clock; Attempts counts the times the
	// deciding loop took the row up; LastError is its last word ("" for
	// none).
	DeferredAt time.Time
	Attempts   int
	LastError  string
}

// DeferredOn returns the events deferred on order, in every consumer
// group, in the order they will be decided. It changes nothing.
func DeferredOn(ctx context.Context, db OperatorStore, order int64) ([]DeferredBehind, error) {
	out, err := db.DeferredOn(ctx, order)
	if err != nil {
		return nil, fmt.Errorf("read the events deferred on order %d: %w", order, err)
	}
	return out, nil
}
