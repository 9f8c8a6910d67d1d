package modelcheck_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
)

// counters is a toy model: two counters, each step increments one of
// them, up to 3; the state space is the 16 pairs.
type counters struct{ a, b int }

func next(s counters) []modelcheck.Step[counters] {
	var out []modelcheck.Step[counters]
	if s.a < 3 {
		out = append(out, modelcheck.Step[counters]{Label: "a++", To: counters{s.a + 1, s.b}})
	}
	if s.b < 3 {
		out = append(out, modelcheck.Step[counters]{Label: "b++", To: counters{s.a, s.b + 1}})
	}
	return out
}

func TestExploreCountsEveryStateOnce(t *testing.T) {
	res, err := modelcheck.Explore(modelcheck.Config[counters]{Next: next,
		Invariants: []modelcheck.Invariant[counters]{{Name: "bounded", Holds: func(s counters) bool { return s.a <= 3 && s.b <= 3 }}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.States != 16 || res.Depth != 6 || len(res.Violations) != 0 {
		t.Fatalf("got %d states, depth %d, %d violations; want 16, 6, 0", res.States, res.Depth, len(res.Violations))
	}
	// 24 steps: every state but the last row and column has two.
	if res.Transitions != 24 {
		t.Fatalf("got %d transitions, want 24", res.Transitions)
	}
}

func TestExploreGivesAShortestCounterexamplePerInvariant(t *testing.T) {
	res, err := modelcheck.Explore(modelcheck.Config[counters]{Next: next, Invariants: []modelcheck.Invariant[counters]{
		{Name: "a below 2", Holds: func(s counters) bool { return s.a < 2 }},
		{Name: "never both 3", Holds: func(s counters) bool { return s.a+s.b < 6 }},
		{Name: "holds", Holds: func(counters) bool { return true }},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Violations) != 2 {
		t.Fatalf("got %d violations, want 2: %+v", len(res.Violations), res.Violations)
	}
	v := res.Violations[0]
	if v.Invariant != "a below 2" || !slices.Equal(v.Trace, []string{"a++", "a++"}) || v.State != (counters{2, 0}) {
		t.Fatalf("first violation %+v, want a below 2 after a++, a++", v)
	}
	if w := res.Violations[1]; w.Invariant != "never both 3" || len(w.Trace) != 6 {
		t.Fatalf("second violation %+v, want never both 3 after 6 steps", w)
	}
	out := v.Format(func(s counters) string { return fmt.Sprintf("a=%d b=%d", s.a, s.b) })
	if !strings.Contains(out, " 2. a++") || !strings.Contains(out, "state: a=2 b=0") {
		t.Fatalf("format:\n%s", out)
	}
}

func TestExploreStopsAtItsBound(t *testing.T) {
	res, err := modelcheck.Explore(modelcheck.Config[counters]{Next: next, MaxStates: 5})
	if err == nil || res.States != 5 {
		t.Fatalf("got %d states and error %v; want 5 and an error", res.States, err)
	}
}

func TestExploreStopsOnceTheNamedInvariantsFailed(t *testing.T) {
	res, err := modelcheck.Explore(modelcheck.Config[counters]{Next: next, StopWhen: []string{"a below 1"},
		Invariants: []modelcheck.Invariant[counters]{
			{Name: "a below 1", Holds: func(s counters) bool { return s.a < 1 }},
			{Name: "never both 3", Holds: func(s counters) bool { return s.a+s.b < 6 }},
		}})
	if err != nil {
		t.Fatal(err)
	}
	// Breadth first: (0,0) is expanded, then (1,0) fails and ends it.
	if len(res.Violations) != 1 || res.Violations[0].Invariant != "a below 1" || res.States >= 16 {
		t.Fatalf("got %d states and %+v; want one violation of a below 1 and fewer than 16 states", res.States, res.Violations)
	}
}
