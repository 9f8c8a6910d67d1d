package pipeline

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/billing-consumer/billing-consumer/internal/events"
)

// streak is the run of transient failures since the handler's last
// success: the events that failed in it at their first attempt, and when
// it began.
type streak struct {
	mu      sync.Mutex
	failing map[uuid.UUID]struct{}
	since   time.Time
	// active mirrors !since.IsZero(), so that a success need not take mu
	// when there is no streak to end.
	active atomic.Bool
}

// outage records ev's transient failure at now and, when the streak it
// extends is an outage (OutageThreshold distinct events failing at their
// first attempt, or OutageAfter long), says why; otherwise it returns "".
// Only first attempts count towards the threshold: a dependency that is
// down fails every fresh event, while the retries of a few orders the
// provider keeps failing (a handful of them land between two batches'
// successes at any rate) are those orders' trouble, not an outage. A
// retry still starts and extends the streak's time.
func (h *Handler) outage(ev events.OrderConfirmed, now time.Time, first bool) string {
	if h.cfg.OutageThreshold <= 0 && h.cfg.OutageAfter <= 0 {
		return ""
	}
	s := &h.streak
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.since.IsZero() {
		s.since = now
		s.active.Store(true)
	}
	if first {
		s.failing[ev.EventID] = struct{}{}
	}
	n, d := len(s.failing), now.Sub(s.since)
	if (h.cfg.OutageThreshold > 0 && n >= h.cfg.OutageThreshold) || (h.cfg.OutageAfter > 0 && d >= h.cfg.OutageAfter) {
		return fmt.Sprintf("%d events failing, no success for %s", n, d)
	}
	return ""
}

// recovered ends a failure streak: something got an answer.
func (h *Handler) recovered() {
	s := &h.streak
	if !s.active.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.failing)
	s.active.Store(false)
	s.since = time.Time{}
}

// budget is what one event has spent of its retries: the transient
// failures counted against it and for how long it has been failing.
type budget struct {
	attempts int
	spent    time.Duration
	// last is the previous counted failure; zero after a pause, so the
	// time paused is not spent.
	last time.Time
}

// fail counts a transient failure at now.
func (b *budget) fail(now time.Time) {
	if !b.last.IsZero() {
		b.spent += now.Sub(b.last)
	}
	b.last = now
	b.attempts++
}

// since is how long ago its last counted failure was, at now: zero when
// there is none, or its clock is stopped.
func (b *budget) since(now time.Time) time.Duration {
	if b.last.IsZero() {
		return 0
	}
	return now.Sub(b.last)
}

// pause stops the clock of the budget until the next counted failure.
func (b *budget) pause() { b.last = time.Time{} }
