package billing

import (
	"os"
	"slices"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/modelcheck"
)

// failoverScenarios are the bounds of the failover's checks: two events
// and one failover, no other environment move (a failover is a crash of
// every replica already), the operator acting only after the failover
// (failoverRulesWith).
var failoverScenarios = []scenario{
	{"two events, same amount, a failover", []int8{0, 0}, budgetM{}},
	{"two events, other amount, a failover", []int8{0, 1}, budgetM{}},
}

// exploreFailover checks the lifecycle invariants over sc with one
// failover under rules f, until every invariant in stopWhen has failed
// (none: all of it).
func exploreFailover(t *testing.T, f failoverRules, sc scenario, stopWhen ...string) modelcheck.Result[world] {
	t.Helper()
	init := sc.init()
	init.fo.left = 1
	res, err := modelcheck.Explore(modelcheck.Config[world]{Init: init, Next: f.steps,
		Invariants: failoverInvariants(), MaxStates: 2_000_000, StopWhen: stopWhen})
	if err != nil {
		t.Fatalf("%s, %s: %v", f.name, sc.name, err)
	}
	t.Logf("%s, %s: %d states, %d transitions, depth %d, %d violations", f.name, sc.name, res.States, res.Transitions, res.Depth, len(res.Violations))
	return res
}

// failoverInvariants are lifecycleInvariants, I3 read as the heal reads
// the world between a failover and the heal: a committed record whose
// decision the database lost is held by the gap between its commit and
// the database's position, which the heal re-reads.
func failoverInvariants() []modelcheck.Invariant[world] {
	invs := lifecycleInvariants()
	for k, inv := range invs {
		if inv.Name == "I3 a path to the charge" {
			invs[k].Holds = func(w world) bool {
				if w.fo.heal {
					for i := range w.n {
						w.ev[i].committed = w.ev[i].committed && w.fo.decided[i]
					}
				}
				return pathToCharge(w)
			}
		}
	}
	return invs
}

// counterexample returns res's violation of inv, logged, or fails t.
func counterexample(t *testing.T, res modelcheck.Result[world], inv string) modelcheck.Violation[world] {
	t.Helper()
	for _, v := range res.Violations {
		if v.Invariant == inv {
			t.Logf("%s", v.Format(world.showFailover))
			return v
		}
	}
	t.Fatalf("the checker found no violation of %s", inv)
	return modelcheck.Violation[world]{}
}

// TestLifecycleFailover is SPEC §9's failover paragraph over the
// lifecycle model: with the heal and its four additions, I1–I5 hold
// through a failover that loses any suffix of the database's commits,
// when every such loss is proven (the assumption, proofAnyLoss) and when
// every failover is healed, lost or not (proofEveryFailover).
func TestLifecycleFailover(t *testing.T) {
	for _, proof := range []healProof{proofAnyLoss, proofEveryFailover} {
		f := healChecked()
		f.proof = proof
		if proof == proofEveryFailover {
			f.name += ", every failover healed"
		}
		for _, sc := range failoverScenarios {
			for _, v := range exploreFailover(t, f, sc).Violations {
				t.Errorf("%s, %s: %s", f.name, sc.name, v.Format(world.showFailover))
			}
		}
	}
}

// TestFailoverWithoutTheHealChargesTwice: without the heal, the checker
// finds an order charged twice after a failover (issue 30's runs).
func TestFailoverWithoutTheHealChargesTwice(t *testing.T) {
	f := failoverRulesWith("no heal", false, proofKafkaAhead)
	counterexample(t, exploreFailover(t, f, failoverScenarios[0], "I1 once"), "I1 once")
}

// TestFailoverHealLimit documents the heal's limit (docs/design.md, "The
// heal"): a loss that took no committed record's decision with it is not
// proven (no marked commit is ahead of the database's position), so the
// records past the committed offsets are redelivered as after a crash,
// and two events decided in the last moments before the failover are
// decided again in the other order: the order is charged twice. This
// counterexample is expected: TestLifecycleFailover assumes every loss
// proven (proofAnyLoss), or every failover healed.
func TestFailoverHealLimit(t *testing.T) {
	f := healChecked()
	f.proof, f.name = proofKafkaAhead, "the heal, a loss proven by Kafka alone"
	v := counterexample(t, exploreFailover(t, f, failoverScenarios[0], "I1 once"), "I1 once")
	if !slices.Contains(v.Trace, "the heal finds no loss") {
		t.Fatalf("the double charge is not the limit's (a loss the heal does not see): %s", v.Format(world.showFailover))
	}
}

// TestFailoverHealNeedsEachAddition takes each of the additions
// away from the checked heal at a time, and wants the checker to find
// the invariant it keeps.
func TestFailoverHealNeedsEachAddition(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		sc         scenario
		take       func(f *failoverRules)
	}{
		{"no in-flight window on a loss: the operator races a request whose window was lost", "I1 once", failoverScenarios[0],
			func(f *failoverRules) { f.window = false }},
		{"the heal's claim marked charged in its first event's name", "I2 one true decision", failoverScenarios[0],
			func(f *failoverRules) { f.namesCharged = false }},
		{"dead-letter decisions not restored", "I2 one reason", failoverScenarios[0],
			func(f *failoverRules) { f.restores = restoreNone }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := healChecked()
			tc.take(&f)
			f.name = tc.name
			counterexample(t, exploreFailover(t, f, tc.sc, tc.want), tc.want)
		})
	}
}

// wideFailoverScenarios are larger bounds than make test explores (about
// 3 million states, some three minutes): a failover beside a crash, beside
// a lost offset commit, and with three events.
var wideFailoverScenarios = []scenario{
	{"two events, same amount, a failover and a crash", []int8{0, 0}, budgetM{crash: 1}},
	{"two events, same amount, a failover and a redelivery", []int8{0, 0}, budgetM{redeliver: 1}},
	{"three events, two amounts, a failover", []int8{0, 0, 1}, budgetM{}},
}

// TestLifecycleFailoverWide runs the failover check over
// wideFailoverScenarios when BILLING_TEST_MODEL_WIDE is set, and the two
// additions that only these bounds need, each taken away: a surviving
// claim the lost history had released (three events), and a redelivered
// record's dead letter, which no position covers.
func TestLifecycleFailoverWide(t *testing.T) {
	if os.Getenv("BILLING_TEST_MODEL_WIDE") == "" {
		t.Skip("set BILLING_TEST_MODEL_WIDE=1 to explore the wider failover scenarios (some three minutes)")
	}
	for _, sc := range wideFailoverScenarios {
		for _, v := range exploreFailover(t, healChecked(), sc).Violations {
			t.Errorf("%s: %s", sc.name, v.Format(world.showFailover))
		}
	}
	f := healChecked()
	f.blocksSurviving, f.name = false, "only an order with no surviving claim blocked"
	counterexample(t, exploreFailover(t, f, wideFailoverScenarios[2], "I1 once"), "I1 once")
	f = healChecked()
	f.name = "dead-letter decisions restored for the re-decided records only"
	f.restores = restoreRanges
	counterexample(t, exploreFailover(t, f, wideFailoverScenarios[1], "I2 one reason"), "I2 one reason")
}
