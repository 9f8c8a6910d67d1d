package harness

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestConcurrentEvents: the distinct events of a ConcurrentEvents order are
// adjacent, each under its own key and event_id, with one amount and
// customer; the plan expects one charge and duplicate_order for the rest.
func TestConcurrentEvents(t *testing.T) {
	const orders, concurrent = 200, 80
	p, err := Generate(Spec{Orders: orders, FirstOrderID: 1000, DuplicateRate: 0.2, CrossPartitionRate: 0.5,
		ConcurrentEvents: concurrent, EventsPerOrder: 3, Seed: 9, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		first, last, n int
		keys, ids      map[string]bool
		amounts        map[string]bool
	}
	byOrder := map[int64]*seen{}
	for i, m := range p.Records {
		var ev eventJSON
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			t.Fatal(err)
		}
		s := byOrder[ev.OrderID]
		if s == nil {
			s = &seen{first: i, keys: map[string]bool{}, ids: map[string]bool{}, amounts: map[string]bool{}}
			byOrder[ev.OrderID] = s
		}
		s.last, s.n = i, s.n+1
		s.keys[string(m.Key)], s.ids[ev.EventID] = true, true
		s.amounts[fmt.Sprint(ev.TotalAmount, "/", ev.CustomerID)] = true
	}
	together, dupOrders := 0, 0
	for order, s := range byOrder {
		if p.Events[order] != len(s.ids) {
			t.Fatalf("order %d: plan says %d distinct events, the records have %d", order, p.Events[order], len(s.ids))
		}
		if len(s.ids) < 2 {
			continue
		}
		together++
		dupOrders += len(s.ids) - 1
		if len(s.ids) > 3 || len(s.keys) != len(s.ids) || len(s.amounts) != 1 || s.last-s.first+1 != s.n {
			t.Fatalf("order %d: %d events, %d keys, %d amounts, at records %d..%d: want 2 or 3 adjacent events with distinct keys and one amount",
				order, len(s.ids), len(s.keys), len(s.amounts), s.first, s.last)
		}
	}
	if together != concurrent || p.Outcomes["duplicate_order"] != dupOrders || p.Outcomes["charged"] != orders {
		t.Fatalf("%d orders with distinct events, outcomes %v; want %d, duplicate_order %d, charged %d",
			together, p.Outcomes, concurrent, dupOrders, orders)
	}
}
