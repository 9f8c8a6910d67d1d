package heal

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Event is a valid event read in a heal's ranges.
type Event struct {
	EventID    uuid.UUID
	OrderID    int64
	CustomerID int64
	Amount     money.Amount
}

// Suspect is an order with two or more distinct events in the ranges:
// which of them the old primary let charge is exactly what the standby
// lost, and the order in which the ranges are re-decided need not be the
// one in which they were decided (different partitions, or different keys
// of one partition, run concurrently). The heal blocks it for an operator
// (a 'blocked' claim in First's name, or its surviving pending claim
// blocked) unless its claim survived charged. A surviving pending claim
// does not keep the first order either: the events deferred behind it
// are re-deferred in the order of the re-decisions, and its release would
// let the first of them charge.
type Suspect struct {
	OrderID int64
	// First is the event the blocked claim is recorded for: the earliest
	// created (the smallest UUIDv7), for a stable choice.
	First Event
	// EventIDs are every distinct event of the order in the ranges, in
	// order; the claim's last_error names them for the runbook.
	EventIDs []uuid.UUID
}

// Suspects returns the orders with two or more distinct events among
// evs, by order id.
func Suspects(evs []Event) []Suspect {
	byOrder := map[int64][]Event{}
	for _, e := range evs {
		byOrder[e.OrderID] = append(byOrder[e.OrderID], e)
	}
	var out []Suspect
	for _, order := range slices.Sorted(maps.Keys(byOrder)) {
		list := byOrder[order]
		slices.SortFunc(list, func(a, b Event) int { return bytes.Compare(a.EventID[:], b.EventID[:]) })
		list = slices.CompactFunc(list, func(a, b Event) bool { return a.EventID == b.EventID })
		if len(list) < 2 {
			continue
		}
		ids := make([]uuid.UUID, len(list))
		for i, e := range list {
			ids[i] = e.EventID
		}
		out = append(out, Suspect{OrderID: order, First: list[0], EventIDs: ids})
	}
	return out
}

// readTimeout bounds the wait for each record of a range: a range ends
// at or before the log end the plan saw, so its records exist unless
// retention or compaction removed them meanwhile.
const readTimeout = 10 * time.Second

// readRanges reads every record in ranges, one reader per partition, and
// returns the valid events among them (an invalid record is dead-lettered
// when it is re-decided and never charges).
func readRanges(ctx context.Context, rc kafkagroup.ReaderConfig, ranges map[int]Range, now time.Time) ([]Event, error) {
	var (
		mu   sync.Mutex
		all  []Event
		errs []error
		wg   sync.WaitGroup
	)
	for id, r := range ranges {
		if r.Hi <= r.Lo {
			continue
		}
		wg.Go(func() {
			evs, err := readRange(ctx, rc, id, r, now)
			mu.Lock()
			defer mu.Unlock()
			all = append(all, evs...)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return all, nil
}

func readRange(ctx context.Context, rc kafkagroup.ReaderConfig, partition int, r Range, now time.Time) ([]Event, error) {
	rc.Partition = partition
	rd, err := kafkagroup.OpenPartition(rc, r.Lo)
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var out []Event
	for {
		mctx, cancel := context.WithTimeout(ctx, readTimeout)
		msg, err := rd.FetchMessage(mctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("re-read %s/%d [%d, %d): %w", rc.Topic, partition, r.Lo, r.Hi, err)
		}
		if msg.Offset >= r.Hi {
			return out, nil
		}
		if e, err := events.Decode(msg.Value, now); err == nil {
			out = append(out, Event{EventID: e.EventID, OrderID: e.OrderID, CustomerID: e.CustomerID, Amount: e.TotalAmount})
		}
		if msg.Offset+1 >= r.Hi {
			return out, nil
		}
	}
}
