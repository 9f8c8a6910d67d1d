// Package harness drives billing-consumer from the outside, as the demo,
// the crash test, the fault suite and the benchmark do: it generates a
// workload of order.confirmed records with known expected outcomes,
// produces it, runs the real binary as a subprocess, waits for the group to
// drain the topic and checks SPEC §9 against the provider simulator, the
// database, the dead-letter topic and the committed offsets.
package harness

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/money"
)

// Spec describes a workload.
type Spec struct {
	// Orders is the number of distinct orders, each with one valid event.
	Orders int
	// FirstOrderID numbers the orders FirstOrderID, FirstOrderID+1, ...;
	// pick a fresh range per run when the database is reused.
	FirstOrderID int64
	// DuplicateRate is the fraction of valid events sent a second time,
	// byte for byte; CrossPartitionRate of those go with another record key
	// and so, most likely, to another partition.
	DuplicateRate      float64
	CrossPartitionRate float64
	// Invalid records (bad JSON, wrong UUID version, bad amount, ...).
	Invalid int
	// SecondEvents orders get a second, distinct event with the same
	// amount: outcome duplicate_order. Conflicts orders get one with a
	// different amount: DLQ conflict.
	SecondEvents int
	Conflicts    int
	// ConcurrentEvents orders arrive as 2 to EventsPerOrder distinct
	// events (each its own event_id; same order, amount and customer) under
	// different record keys, so most likely on different partitions, and
	// next to each other in the stream, so that they are in flight at
	// once: outcome charged for one, duplicate_order for the others.
	// EventsPerOrder below 2 means 2.
	ConcurrentEvents int
	EventsPerOrder   int
	// Declined orders are refused by the provider: DLQ permanent. The
	// simulator must decline exactly the orders of Plan.Declined.
	Declined int
	Seed     uint64
	Now      time.Time
}

// Plan is a generated workload and what must come of it.
type Plan struct {
	Records []kafka.Message
	// Charged maps each order that must be charged exactly once to its
	// amount.
	Charged map[int64]money.Amount
	// Declined orders must never be charged.
	Declined map[int64]bool
	// DLQ is the minimum number of dead-letter records per reason (at
	// least once: a crash after a DLQ write may repeat one).
	DLQ map[dlq.Reason]int
	// InvalidValues are the values of the invalid records, each of which
	// must be found in the dead-letter topic.
	InvalidValues map[string]bool
	// Outcomes counts the expected billing_events_total per result in a run
	// without crashes.
	Outcomes map[string]int
	// Events maps each valid order to its number of distinct events (1 for
	// most; exact duplicates are not distinct events).
	Events map[int64]int
}

type eventJSON struct {
	EventID     string `json:"event_id"`
	EventType   string `json:"event_type"`
	OccurredAt  string `json:"occurred_at"`
	OrderID     int64  `json:"order_id"`
	CustomerID  int64  `json:"customer_id"`
	TotalAmount string `json:"total_amount"`
}

// Generate builds the records of spec in a shuffled order that keeps every
// order's own events in sequence (an order's events share a key, hence a
// partition, and a second event always follows the first).
func Generate(spec Spec) (Plan, error) {
	if spec.Declined+spec.SecondEvents+spec.Conflicts+spec.ConcurrentEvents > spec.Orders {
		return Plan{}, fmt.Errorf("workload: %d orders cannot carry %d declined, %d second events, %d conflicts and %d concurrent events",
			spec.Orders, spec.Declined, spec.SecondEvents, spec.Conflicts, spec.ConcurrentEvents)
	}
	perOrder := max(2, spec.EventsPerOrder)
	rng := rand.New(rand.NewPCG(spec.Seed, spec.Seed^0x9e3779b97f4a7c15))
	p := Plan{
		Charged: map[int64]money.Amount{}, Declined: map[int64]bool{},
		DLQ: map[dlq.Reason]int{}, InvalidValues: map[string]bool{}, Outcomes: map[string]int{},
		Events: map[int64]int{},
	}
	// streams holds each order's records in order; they are interleaved
	// at random below.
	var streams []stream
	concurrent := spec.Declined + spec.SecondEvents + spec.Conflicts + spec.ConcurrentEvents
	for i := range spec.Orders {
		order := spec.FirstOrderID + int64(i)
		amount := money.Amount(100 + rng.IntN(50_000))
		key := []byte(strconv.FormatInt(order, 10))
		first := encode(order, amount, spec.Now)
		s := []kafka.Message{{Key: key, Value: first}}
		together := false
		switch {
		case i < spec.Declined:
			p.Declined[order] = true
			p.DLQ[dlq.Permanent]++
			p.Outcomes["dlq"]++
		case i < spec.Declined+spec.SecondEvents:
			p.Charged[order] = amount
			s = append(s, kafka.Message{Key: key, Value: encode(order, amount, spec.Now)})
			p.Outcomes["charged"]++
			p.Outcomes["duplicate_order"]++
		case i < spec.Declined+spec.SecondEvents+spec.Conflicts:
			p.Charged[order] = amount
			s = append(s, kafka.Message{Key: key, Value: encode(order, amount+1, spec.Now)})
			p.DLQ[dlq.Conflict]++
			p.Outcomes["charged"]++
			p.Outcomes["dlq"]++
		case i < concurrent:
			p.Charged[order] = amount
			p.Outcomes["charged"]++
			together = true
			for j := range 1 + rng.IntN(perOrder-1) {
				s = append(s, kafka.Message{Key: fmt.Appendf(nil, "%s-again-%d", key, j+1), Value: encode(order, amount, spec.Now)})
				p.Outcomes["duplicate_order"]++
			}
		default:
			p.Charged[order] = amount
			p.Outcomes["charged"]++
			if rng.Float64() < spec.DuplicateRate {
				dupKey := key
				if rng.Float64() < spec.CrossPartitionRate {
					dupKey = []byte("resent-" + string(key))
				}
				s = append(s, kafka.Message{Key: dupKey, Value: first})
				p.Outcomes["duplicate"]++
			}
		}
		if !p.Declined[order] {
			p.Events[order] = distinct(s)
		}
		streams = append(streams, stream{records: s, together: together})
	}
	for i := range spec.Invalid {
		v := invalidRecord(i, spec.Now)
		p.InvalidValues[string(v)] = true
		streams = append(streams, stream{records: []kafka.Message{{Key: []byte("bad-" + strconv.Itoa(i)), Value: v}}})
		p.DLQ[dlq.Invalid]++
		p.Outcomes["dlq"]++
	}
	p.Records = interleave(rng, streams)
	return p, nil
}

func encode(order int64, amount money.Amount, now time.Time) []byte {
	b, _ := json.Marshal(eventJSON{
		EventID: uuid.Must(uuid.NewV7()).String(), EventType: "order.confirmed.v1",
		OccurredAt: now.UTC().Format(time.RFC3339), OrderID: order, CustomerID: 1 + order%997,
		TotalAmount: amount.String(),
	})
	return b
}

// invalidRecord returns the i-th of a cycle of invalid records, each
// unique (so it can be found in the DLQ) and each broken in its own way.
func invalidRecord(i int, now time.Time) []byte {
	good := func(mutate func(*eventJSON)) []byte {
		e := eventJSON{EventID: uuid.Must(uuid.NewV7()).String(), EventType: "order.confirmed.v1",
			OccurredAt: now.UTC().Format(time.RFC3339), OrderID: int64(900_000_000 + i), CustomerID: 7, TotalAmount: "10.00"}
		mutate(&e)
		b, _ := json.Marshal(e)
		return b
	}
	switch i % 6 {
	case 0:
		return []byte(fmt.Sprintf(`{"event_id": "not json %d`, i))
	case 1:
		return good(func(e *eventJSON) { e.EventID = uuid.NewString() }) // version 4
	case 2:
		return good(func(e *eventJSON) { e.TotalAmount = "-5.00" })
	case 3:
		return good(func(e *eventJSON) { e.TotalAmount = "1.005" })
	case 4:
		return good(func(e *eventJSON) { e.OccurredAt = now.Add(72 * time.Hour).UTC().Format(time.RFC3339) })
	default:
		return good(func(e *eventJSON) { e.EventType = "order.cancelled.v1" })
	}
}

// distinct counts the distinct event_ids among records.
func distinct(records []kafka.Message) int {
	ids := map[string]bool{}
	for _, m := range records {
		var ev eventJSON
		if json.Unmarshal(m.Value, &ev) == nil {
			ids[ev.EventID] = true
		}
	}
	return len(ids)
}

// stream is one order's records (or one invalid record), in the order they
// must arrive. A stream together arrives as one run of adjacent records.
type stream struct {
	records  []kafka.Message
	together bool
}

// interleave merges the streams in random order, keeping each stream's
// own order, and the records of a together stream adjacent.
func interleave(rng *rand.Rand, streams []stream) []kafka.Message {
	units := func(s stream) int {
		if s.together {
			return 1
		}
		return len(s.records)
	}
	var total int
	for _, s := range streams {
		total += units(s)
	}
	// Each unit (a record, or a together stream) gets a slot; a stream's
	// units take its slots in increasing order.
	slots := rng.Perm(total)
	placed := make([][]kafka.Message, total)
	next := 0
	for _, s := range streams {
		mine := slots[next : next+units(s)]
		next += units(s)
		slices.Sort(mine)
		if s.together {
			placed[mine[0]] = s.records
			continue
		}
		for j, m := range s.records {
			placed[mine[j]] = []kafka.Message{m}
		}
	}
	out := make([]kafka.Message, 0, total)
	for _, u := range placed {
		out = append(out, u...)
	}
	return out
}
