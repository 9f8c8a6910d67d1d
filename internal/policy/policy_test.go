package policy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
	"github.com/billing-consumer/billing-consumer/internal/fault"
)

const s = time.Second

// cfg is the configuration of the table: 3 attempts, a 10 s budget,
// parked or deferred after 4 s.
var cfg = Config{MaxAttempts: 3, RetryBudget: 10 * s, ParkAfter: 4 * s}

// noPark is cfg without parking or deferring.
var noPark = Config{MaxAttempts: 3, RetryBudget: 10 * s}

func TestDecide(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		f    Failure
		want Action
	}{
		// The event's own definite faults: dead-lettered with their kind.
		{"handler invalid", cfg, Failure{Kind: fault.Invalid}, DeadLetterInvalid},
		{"handler permanent", cfg, Failure{Kind: fault.Permanent, Attempts: 7, Spent: 20 * s}, DeadLetterPermanent},
		{"handler conflict", cfg, Failure{Kind: fault.Conflict, Held: true}, DeadLetterConflict},
		{"handler canceled conflict", cfg, Failure{Kind: fault.Conflict, Canceled: true}, Leave},
		{"handler canceled transient", cfg, Failure{Attempts: 9, Spent: 20 * s, Canceled: true}, Leave},
		{"handler canceled busy held", cfg, Failure{Kind: fault.Busy, Held: true, Canceled: true}, Leave},

		// Transient: retried until parked or exhausted.
		{"first transient", cfg, Failure{}, Retry},
		{"transient below park", cfg, Failure{Attempts: 1, Spent: 2 * s, SinceCounted: 2*s - 1}, Retry},
		{"transient reaches park", cfg, Failure{Attempts: 1, Spent: 2 * s, SinceCounted: 2 * s}, Park},
		{"transient park on spent alone", cfg, Failure{Attempts: 0, Spent: 4 * s}, Park},
		{"transient park failed", cfg, Failure{Attempts: 1, Spent: 4 * s, ParkFailed: true}, Retry},
		{"transient past budget parks first", cfg, Failure{Attempts: 5, Spent: 10 * s}, Park},
		{"transient past budget park failed", cfg, Failure{Attempts: 5, Spent: 10 * s, ParkFailed: true}, DeadLetterExhausted},
		{"transient budget not spent", cfg, Failure{Attempts: 5, Spent: 10*s - 1, ParkFailed: true}, Retry},
		{"transient attempts not reached", cfg, Failure{Attempts: 1, Spent: 30 * s, ParkFailed: true}, Retry},
		{"transient attempts reached", cfg, Failure{Attempts: 2, Spent: 8 * s, SinceCounted: 2 * s, ParkFailed: true}, DeadLetterExhausted},
		{"transient no park exhausted", noPark, Failure{Attempts: 2, Spent: 10 * s}, DeadLetterExhausted},
		{"transient no park retried", noPark, Failure{Attempts: 2, Spent: 9 * s}, Retry},
		{"transient zero budget", Config{MaxAttempts: 3}, Failure{Attempts: 2}, DeadLetterExhausted},
		{"transient zero budget first", Config{MaxAttempts: 3}, Failure{Attempts: 1}, Retry},
		{"transient one attempt", Config{MaxAttempts: 1}, Failure{}, DeadLetterExhausted},
		{"transient held ignored", cfg, Failure{Held: true}, Retry},
		{"transient waited ignored", cfg, Failure{Waited: time.Hour}, Retry},
		{"unknown kind as transient", cfg, Failure{Kind: fault.Kind(42), Attempts: 2, Spent: 10 * s, ParkFailed: true}, DeadLetterExhausted},
		{"unknown kind ignores outage", cfg, Failure{Kind: fault.Kind(42), Outage: true}, Retry},

		// Outages and systemic failures: wait, spending nothing.
		{"transient in outage", cfg, Failure{Outage: true, Attempts: 9, Spent: time.Hour}, Stall},
		{"systemic", cfg, Failure{Kind: fault.Systemic, Attempts: 9, Spent: time.Hour}, Stall},
		{"systemic never deferred", cfg, Failure{Kind: fault.Systemic, Waited: time.Hour, Held: true}, Stall},

		// Busy: wait on the other claim, deferred after ParkAfter or when held.
		{"busy", cfg, Failure{Kind: fault.Busy}, Wait},
		{"busy below park", cfg, Failure{Kind: fault.Busy, Waited: 4*s - 1, Attempts: 9, Spent: time.Hour}, Wait},
		{"busy waited park", cfg, Failure{Kind: fault.Busy, Waited: 4 * s}, Defer},
		{"busy held", cfg, Failure{Kind: fault.Busy, Held: true}, Defer},
		{"busy held defer failed", cfg, Failure{Kind: fault.Busy, Held: true, DeferFailed: true}, Wait},
		{"busy waited defer failed", cfg, Failure{Kind: fault.Busy, Waited: time.Hour, DeferFailed: true}, Wait},
		{"busy held no park", noPark, Failure{Kind: fault.Busy, Held: true, Waited: time.Hour}, Wait},
		{"busy outage ignored", cfg, Failure{Kind: fault.Busy, Outage: true}, Wait},

		// The deciding loop: decided, left, or given back; never exhausted.
		{"decider invalid", cfg, Failure{By: Decider, Kind: fault.Invalid}, DeadLetterInvalid},
		{"decider permanent", cfg, Failure{By: Decider, Kind: fault.Permanent}, DeadLetterPermanent},
		{"decider conflict canceled", cfg, Failure{By: Decider, Kind: fault.Conflict, Canceled: true}, DeadLetterConflict},
		{"decider canceled", cfg, Failure{By: Decider, Kind: fault.Busy, Paused: true, Canceled: true}, Leave},
		{"decider paused", cfg, Failure{By: Decider, Kind: fault.Busy, Paused: true}, GiveBackUnsent},
		{"decider systemic", cfg, Failure{By: Decider, Kind: fault.Systemic}, GiveBackAndStop},
		{"decider transient", cfg, Failure{By: Decider, Attempts: 99, Spent: time.Hour}, GiveBack},
		{"decider transient outage", cfg, Failure{By: Decider, Outage: true}, GiveBack},
		{"decider busy", cfg, Failure{By: Decider, Kind: fault.Busy, Waited: time.Hour}, GiveBack},
		{"decider held", cfg, Failure{By: Decider, Kind: fault.Busy, Held: true}, GiveBack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.cfg, tt.f); got != tt.want {
				t.Errorf("Decide(%+v, %+v) = %v, want %v", tt.cfg, tt.f, got, tt.want)
			}
		})
	}
}

// TestDecideEverywhere sweeps every combination of the facts, at the
// boundaries of each limit, and checks the rules the service's guarantees
// rest on, whatever the table above forgot.
func TestDecideEverywhere(t *testing.T) {
	kinds := []fault.Kind{fault.Transient, fault.Invalid, fault.Permanent, fault.Conflict, fault.Systemic, fault.Busy, fault.Kind(42)}
	configs := []Config{cfg, noPark, {MaxAttempts: 1}, {MaxAttempts: 3, RetryBudget: 10 * s, ParkAfter: 20 * s}}
	n := 0
	for _, c := range configs {
		everyFailure(kinds, func(f Failure) {
			n++
			if a := Decide(c, f); !t.Failed() {
				if err := check(c, f, a); err != nil {
					t.Errorf("Decide(%+v, %+v) = %v: %v", c, f, a, err)
				}
			}
		})
	}
	t.Logf("%d combinations", n)
}

// everyFailure calls visit with every combination of kinds, askers,
// booleans, attempts at the limits of MaxAttempts and durations at those
// of the configurations.
func everyFailure(kinds []fault.Kind, visit func(Failure)) {
	spents := []time.Duration{0, 2*s - 1, 2 * s, 4*s - 1, 4 * s, 10*s - 1, 10 * s, 20 * s}
	waits := []time.Duration{0, 4*s - 1, 4 * s, 20*s - 1, 20 * s}
	for _, by := range []Asker{Handler, Decider} {
		for _, k := range kinds {
			for bits := range 1 << 6 {
				b := func(i int) bool { return bits&(1<<i) != 0 }
				for _, attempts := range []int{0, 1, 2, 3, 9} {
					for _, spent := range spents {
						for _, since := range []time.Duration{0, 1, 2 * s} {
							for _, waited := range waits {
								visit(Failure{By: by, Kind: k, Canceled: b(0), Held: b(1), Paused: b(2), Outage: b(3),
									ParkFailed: b(4), DeferFailed: b(5), Attempts: attempts, Spent: spent, SinceCounted: since, Waited: waited})
							}
						}
					}
				}
			}
		}
	}
}

// check returns what is wrong with Decide(c, f) == a.
func check(c Config, f Failure, a Action) error {
	own := f.Kind == fault.Invalid || f.Kind == fault.Permanent || f.Kind == fault.Conflict
	spent := f.Spent + f.SinceCounted
	counted := !own && f.Kind != fault.Busy && f.Kind != fault.Systemic && !(f.Kind == fault.Transient && f.Outage)
	switch {
	case a < Retry || a > Leave:
		return errors.New("not an action")
	case f.By == Decider && (a == Retry || a == Wait || a == Stall || a == Park || a == Defer || a == DeadLetterExhausted):
		return errors.New("a Handler's action for the Decider")
	case f.By == Handler && (a == GiveBack || a == GiveBackAndStop || a == GiveBackUnsent):
		return errors.New("a Decider's action for the Handler")
	case own && a.Reason() != "" && string(a.Reason()) != f.Kind.String():
		return errors.New("dead-lettered with another reason than its kind")
	case (f.Kind == fault.Busy || f.Kind == fault.Systemic || f.Outage && f.Kind == fault.Transient) && a.Reason() != "":
		return errors.New("dead-lettered while the fault is not the event's (SPEC §11 I3)")
	case f.Canceled != (a == Leave) && !(f.By == Decider && own):
		return errors.New("ctx ended but not left, or left while ctx lives")
	case f.Canceled:
		return nil
	case own != (a.Reason() != "" && a != DeadLetterExhausted):
		return errors.New("the event's own fault not dead-lettered with its kind, or another fault dead-lettered so")
	case f.By == Decider:
		if !own && f.Kind == fault.Systemic && !f.Paused && a != GiveBackAndStop {
			return errors.New("a systemic failure does not end the deciding pass")
		}
		if !own && f.Paused && a != GiveBackUnsent {
			return errors.New("a paused attempt not given back at once")
		}
		return nil
	case (a == Park || a == Defer) && c.ParkAfter == 0:
		return errors.New("parked or deferred with ParkAfter 0")
	case a == Park && (!counted || f.ParkFailed || spent < c.ParkAfter):
		return errors.New("parked but not a counted failure past ParkAfter, or parked again")
	case counted && !f.ParkFailed && c.ParkAfter > 0 && spent >= c.ParkAfter && a != Park:
		return errors.New("a counted failure past ParkAfter not parked")
	case a == DeadLetterExhausted && (!counted || f.Attempts+1 < c.MaxAttempts || spent < c.RetryBudget):
		return errors.New("exhausted before its attempts and budget are spent")
	case counted && a == Retry && f.Attempts+1 >= c.MaxAttempts && spent >= c.RetryBudget:
		return errors.New("retried past its attempts and budget")
	case a == Defer && (f.Kind != fault.Busy || f.DeferFailed || !f.Held && f.Waited < c.ParkAfter):
		return errors.New("deferred but not busy past ParkAfter or held, or deferred again")
	case f.Kind == fault.Busy && c.ParkAfter > 0 && !f.DeferFailed && (f.Held || f.Waited >= c.ParkAfter) && a != Defer:
		return errors.New("busy past ParkAfter or held, not deferred")
	case a.Spends() != counted:
		return errors.New("the budget is spent by a failure that is not the event's, or not by one that is")
	case f.Kind == fault.Busy && a != Defer && a != Wait:
		return errors.New("a busy event neither waits nor is deferred")
	case (f.Kind == fault.Systemic || f.Kind == fault.Transient && f.Outage) && a != Stall:
		return errors.New("a systemic failure or an outage does not stall")
	}
	return redecide(c, f, a)
}

// redecide checks that a failed Park or Defer is decided again as an
// action that spends as the first did, and is not the same action: the
// Handler's loop of carrying out ends.
func redecide(c Config, f Failure, a Action) error {
	switch a {
	case Park:
		f.ParkFailed = true
	case Defer:
		f.DeferFailed = true
	default:
		return nil
	}
	b := Decide(c, f)
	if b == a || b.Spends() != a.Spends() || b == Park || b == Defer {
		return fmt.Errorf("failed %v decided again as %v", a, b)
	}
	return nil
}

func TestActionReason(t *testing.T) {
	want := map[Action]dlq.Reason{DeadLetterInvalid: dlq.Invalid, DeadLetterPermanent: dlq.Permanent,
		DeadLetterConflict: dlq.Conflict, DeadLetterExhausted: dlq.Exhausted}
	for a := Retry; a <= Leave; a++ {
		if got := a.Reason(); got != want[a] {
			t.Errorf("%v.Reason() = %q, want %q", a, got, want[a])
		}
		if s := a.String(); s == "" || s == fmt.Sprintf("action(%d)", int(a)) {
			t.Errorf("action %d has no name", int(a))
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		fields []string
	}{
		{"valid", cfg, nil},
		{"valid without budget or parking", Config{MaxAttempts: 1}, nil},
		{"zero attempts", Config{RetryBudget: s}, []string{"MaxAttempts"}},
		{"negative budget", Config{MaxAttempts: 1, RetryBudget: -1}, []string{"RetryBudget"}},
		{"negative park", Config{MaxAttempts: 1, ParkAfter: -1}, []string{"ParkAfter"}},
		{"all wrong", Config{MaxAttempts: -1, RetryBudget: -1, ParkAfter: -1}, []string{"MaxAttempts", "RetryBudget", "ParkAfter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			var fields []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var fe *Error
					if !errors.As(e, &fe) {
						t.Fatalf("Validate() = %v, not all *Error", err)
					}
					fields = append(fields, fe.Field)
				}
			}
			if fmt.Sprint(fields) != fmt.Sprint(tt.fields) {
				t.Errorf("Validate() = %v, fields %v; want fields %v", err, fields, tt.fields)
			}
		})
	}
}
