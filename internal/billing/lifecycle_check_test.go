package billing

import (
	"strings"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
)

// scenario is one bounded configuration of the model.
type scenario struct {
	name    string
	amounts []int8 // one per event: equal amounts are duplicates of one order
	budget  budgetM
}

// modelScenarios are the bounds make test explores: two events of one
// order (the same amount under two keys, or another amount), with one
// environment move each on top of every delivery, answer, completer
// pass, deferral and operator decision: a crash of every replica, a
// pause and resume, a dead letter replayed. The four together reach
// about 1.2 million states.
var modelScenarios = []scenario{
	{"two events, same amount", []int8{0, 0}, budgetM{}},
	{"two events, same amount, a crash", []int8{0, 0}, budgetM{crash: 1}},
	{"two events, same amount, a pause", []int8{0, 0}, budgetM{pause: 1}},
	{"two events, other amount, a replay", []int8{0, 1}, budgetM{replay: 1}},
}

func (sc scenario) init() world {
	w := world{n: int8(len(sc.amounts)), budget: sc.budget}
	for i, a := range sc.amounts {
		w.ev[i].amount = a
	}
	return w
}

// explore checks the lifecycle invariants over sc under rules r.
func explore(t *testing.T, r modelRules, sc scenario) modelcheck.Result[world] {
	t.Helper()
	res, err := modelcheck.Explore(modelcheck.Config[world]{Init: sc.init(), Next: r.steps,
		Invariants: lifecycleInvariants(), MaxStates: 2_000_000})
	if err != nil {
		t.Fatalf("%s, %s: %v", r.name, sc.name, err)
	}
	t.Logf("%s, %s: %d states, %d transitions, depth %d, %d violations", r.name, sc.name, res.States, res.Transitions, res.Depth, len(res.Violations))
	return res
}

// violated returns the invariants res found broken, each counterexample
// logged.
func violated(t *testing.T, res modelcheck.Result[world]) map[string]bool {
	t.Helper()
	found := map[string]bool{}
	for _, v := range res.Violations {
		found[v.Invariant] = true
		t.Logf("%s", v.Format(world.show))
	}
	return found
}

// TestLifecycleModel is SPEC §11's check: I1–I5 hold in every state the
// model reaches under this code's rules.
func TestLifecycleModel(t *testing.T) {
	total := 0
	for _, sc := range modelScenarios {
		res := explore(t, productionRules(), sc)
		total += res.States
		for _, v := range res.Violations {
			t.Errorf("%s: %s", sc.name, v.Format(world.show))
		}
	}
	t.Logf("%d states explored in all", total)
}

// TestModelFindsTheDefectsOfTheRulesBefore29 runs the checker on the
// rules of 4e65814: it must find the double charge (I1), the trace that
// lies (I2), the orders left without a path (I3), the sends while paused
// (I4) and the operator's race with a request in flight (I5) that the
// reviews of issue 29 found by hand, and print a shortest counterexample
// for each.
func TestModelFindsTheDefectsOfTheRulesBefore29(t *testing.T) {
	found := violated(t, explore(t, rulesBefore29(), modelScenarios[0]))
	for k, v := range violated(t, explore(t, rulesBefore29(), scenario{"one event, a pause", []int8{0}, budgetM{pause: 1}})) {
		found[k] = found[k] || v
	}
	for _, inv := range lifecycleInvariants() {
		if !found[inv.Name] {
			t.Errorf("the rules before issue 29 break %s, but the checker found no counterexample", inv.Name)
		}
	}
}

// TestModelCatchesABrokenRule breaks one rule of this code at a time and
// wants the checker to find the invariant it keeps.
func TestModelCatchesABrokenRule(t *testing.T) {
	for _, tc := range []struct {
		name    string
		want    string
		breakIt func(r *modelRules)
	}{
		{"a blocked claim dead-letters the events behind it (defects 2, 7)", "I3 a path to the charge",
			func(r *modelRules) { r.decide = decideBefore29 }},
		{"the completer does not check the pause (defect 5)", "I4 pause means pause",
			func(r *modelRules) { r.completerWaitsOnPause = func() bool { return false } }},
		{"parking keeps only the claim (defect 4)", "I3 a path to the charge",
			func(r *modelRules) { r.parkKeeps = func(*world, int8) {} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := productionRules()
			tc.breakIt(&r)
			r.name = tc.name
			sc := modelScenarios[0]
			if strings.HasPrefix(tc.want, "I4") {
				sc = scenario{"one event, a pause", []int8{0}, budgetM{pause: 1}}
			}
			if !violated(t, explore(t, r, sc))[tc.want] {
				t.Fatalf("with %s, the checker found no violation of %s", tc.name, tc.want)
			}
		})
	}
}
