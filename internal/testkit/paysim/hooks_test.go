package paysim

import (
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestHooks: Received runs before the charge is taken and before any
// answer, Answered after the answer (status 0 for a reset); neither runs for
// a replay of a stored answer.
func TestHooks(t *testing.T) {
	h := newHarness(t, Config{})
	var mu sync.Mutex
	var seen []string
	h.sim.SetHooks(Hooks{
		Received: func(r Request) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, "received "+r.Key)
			if n := h.sim.ChargesFor(r.OrderID); n != 0 {
				t.Errorf("Received: %d charges of order %d already taken", n, r.OrderID)
			}
		},
		Answered: func(r Request, status int) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, "answered "+r.Key)
			if status != 200 && status != 0 {
				t.Errorf("Answered: status %d", status)
			}
		},
	})
	if a := h.post(t, "k1", body1001); a.status != 200 {
		t.Fatalf("first charge: %+v", a)
	}
	// The answer reaches the client before Answered runs: wait for it.
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
	poll.Until(t, 10*time.Second, "2 hook calls", func() bool { return count() == 2 })
	if a := h.post(t, "k1", body1001); !a.replayed {
		t.Fatalf("second request: %+v, want a replay", a)
	}
	h.sim.SetFaults(Faults{ResetRate: 1})
	if a := h.post(t, "k2", `{"order_id":1002,"customer_id":42,"amount":"1.00"}`); a.err == nil {
		t.Fatalf("reset request answered: %+v", a)
	}
	poll.Until(t, 10*time.Second, "4 hook calls", func() bool { return count() == 4 })
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []string{"received k1", "answered k1", "received k2", "answered k2"}) {
		t.Fatalf("hooks saw %v", seen)
	}
}
