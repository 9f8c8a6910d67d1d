package main

import (
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
)

func TestNeedsRejoin(t *testing.T) {
	view := func(gen int32, state string, unassigned ...int) *groupView {
		return &groupView{gen: gen, GroupAssignment: consumer.GroupAssignment{State: state, Unassigned: unassigned}}
	}
	for _, c := range []struct {
		name       string
		prev, now  *groupView
		wantRejoin bool
	}{
		{"first reading", nil, view(3, "Stable", 4), false},
		{"stable, two readings leave 4 to nobody", view(3, "Stable", 4), view(3, "Stable", 4), true},
		{"a new generation since: give it time", view(2, "Stable", 4), view(3, "Stable", 4), false},
		{"rebalancing: every partition reads unowned", view(3, "Stable", 4), view(3, "PreparingRebalance", 0, 1, 2, 4), false},
		{"between generations", view(-1, "Stable", 4), view(-1, "Stable", 4), false},
		{"all owned now", view(3, "Stable", 4), view(3, "Stable"), false},
	} {
		if got := needsRejoin(c.prev, c.now); got != c.wantRejoin {
			t.Errorf("%s: needsRejoin = %v, want %v", c.name, got, c.wantRejoin)
		}
	}
}
