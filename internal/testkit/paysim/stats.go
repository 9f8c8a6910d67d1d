package paysim

import (
	"maps"
	"slices"
)

// ChargeRecord is one charge taken by the simulator.
type ChargeRecord struct {
	Key        string // Idempotency-Key of the request that took it
	OrderID    int64
	CustomerID int64
	Amount     string // canonical form, e.g. "99.90"
	ChargeID   string // "ch_000001", "ch_000002", ... in the order taken
}

// Requests returns how many answers were given per HTTP status; key 0
// counts connections reset without an answer. Safe for concurrent use.
func (s *Sim) Requests() map[int]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.requests)
}

// Replays returns how many stored answers were replayed. Safe for
// concurrent use.
func (s *Sim) Replays() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.replays
}

// InFlight returns how many requests are being processed right now. Tests
// poll it to know a key is in flight. Safe for concurrent use.
func (s *Sim) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inFlight
}

// ChargesTaken returns the number of charges taken, each under a distinct
// key. Safe for concurrent use.
func (s *Sim) ChargesTaken() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.charges)
}

// ChargesFor returns how many charges were taken for orderID; exactly-once
// billing means 1 for every valid order. Safe for concurrent use.
func (s *Sim) ChargesFor(orderID int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perOrder[orderID]
}

// DoubleCharged returns, in ascending order, the orders charged more than
// once (necessarily under different keys). Safe for concurrent use.
func (s *Sim) DoubleCharged() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int64
	for id, n := range s.perOrder {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Charges returns a copy of all charges taken, in the order taken. Safe for
// concurrent use.
func (s *Sim) Charges() []ChargeRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.charges)
}
