package heal

import (
	"testing"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/kafkagroup"
)

func marked(offset, frontier, since int64) kafkagroup.Committed {
	return kafkagroup.Committed{Offset: offset, Mark: kafkagroup.Mark{Frontier: frontier, Since: since}, Marked: true}
}

func TestPlan(t *testing.T) {
	inStep := Found{Committed: marked(100, 140, 0), HasCommit: true, Position: 100, HasPosition: true, End: 500}
	for _, tc := range []struct {
		name  string
		found map[int]Found
		want  map[int]Range // nil: no heal
	}{
		{"every position in step: no heal", map[int]Found{0: inStep, 1: inStep}, nil},
		{"a position ahead of its commit: no heal",
			map[int]Found{0: {Committed: marked(100, 140, 0), HasCommit: true, Position: 120, HasPosition: true, End: 500}}, nil},
		{"an unmarked commit ahead (an older release, a reset by Kafka's tools): no heal",
			map[int]Found{0: {Committed: kafkagroup.Committed{Offset: 300}, HasCommit: true, Position: 100, HasPosition: true, End: 500}}, nil},
		{"nothing committed, no row: no heal", map[int]Found{0: {End: 500}}, nil},
		{"a lost position: every marked partition gets a range, up to its frontier",
			map[int]Found{
				0: {Committed: marked(300, 340, 0), HasCommit: true, Position: 100, HasPosition: true, End: 500},
				1: inStep,
				2: {Committed: kafkagroup.Committed{Offset: 50}, HasCommit: true, End: 80}, // unmarked: held, no range
			},
			map[int]Range{0: {Lo: 100, Hi: 340, Committed: 300, Position: 100}, 1: {Lo: 100, Hi: 140, Committed: 100, Position: 100}}},
		{"a lost row: from the mark's since",
			map[int]Found{0: {Committed: marked(300, 340, 20), HasCommit: true, End: 500}},
			map[int]Range{0: {Lo: 20, Hi: 340, Committed: 300, Position: -1}}},
		{"the frontier past the log end: the log end",
			map[int]Found{0: {Committed: marked(300, 900, 0), HasCommit: true, Position: 200, HasPosition: true, End: 310}},
			map[int]Range{0: {Lo: 200, Hi: 310, Committed: 300, Position: 200}}},
		{"retention deleted the start: from the first offset",
			map[int]Found{0: {Committed: marked(300, 340, 0), HasCommit: true, Position: 100, HasPosition: true, First: 150, End: 500}},
			map[int]Range{0: {Lo: 150, Hi: 340, Committed: 300, Position: 100}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Plan(tc.found)
			if len(got) != len(tc.want) || (got == nil) != (tc.want == nil) {
				t.Fatalf("Plan = %+v, want %+v", got, tc.want)
			}
			for id, w := range tc.want {
				if got[id] != w {
					t.Errorf("partition %d: %+v, want %+v", id, got[id], w)
				}
			}
		})
	}
}

func TestExpiredAndRewound(t *testing.T) {
	f := Found{Committed: marked(300, 340, 0), HasCommit: true, Position: 100, HasPosition: true, First: 150, End: 500}
	if got := f.Expired(); got != 50 {
		t.Errorf("Expired = %d, want 50", got)
	}
	if got := Rewound(Plan(map[int]Found{0: f})); got != 150 {
		t.Errorf("Rewound = %d, want 150 (300 - 150)", got)
	}
}

func TestSuspects(t *testing.T) {
	a, b, c := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	evs := []Event{
		{EventID: b, OrderID: 1, CustomerID: 9, Amount: 100},
		{EventID: a, OrderID: 1, CustomerID: 9, Amount: 100},
		{EventID: a, OrderID: 1, CustomerID: 9, Amount: 100}, // a redelivery: the same event
		{EventID: c, OrderID: 2, CustomerID: 9, Amount: 100},
		{EventID: c, OrderID: 2, CustomerID: 9, Amount: 100},
	}
	got := Suspects(evs)
	if len(got) != 1 || got[0].OrderID != 1 || got[0].First.EventID != a || len(got[0].EventIDs) != 2 {
		t.Fatalf("Suspects = %+v, want order 1 only, first event %v, two events", got, a)
	}
}
