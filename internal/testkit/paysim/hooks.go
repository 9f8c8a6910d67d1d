package paysim

import "net/http"

// Request names one charge request the simulator processes afresh (a new
// Idempotency-Key), as handed to Hooks.
type Request struct {
	Key     string // its Idempotency-Key
	OrderID int64
}

// Hooks let a fault test act at the two moments of a charge that matter to
// the consumer's transactions: while the request is in flight, and just
// after its answer left. They are called only for requests processed
// afresh, never for replays of stored answers or rejections, synchronously
// on the request's own goroutine and without locks held, so a hook can cut
// the caller's database connection before the provider answers. A hook
// must be safe for concurrent use and return quickly: the request waits
// for it. The zero value calls nothing and leaves the simulator's
// behaviour as it is.
type Hooks struct {
	// Received is called once the request has been accepted and its faults
	// drawn, before the charge is taken (or refused) and before any answer
	// is sent. A request answered 409 by ConflictRate is not reported.
	Received func(Request)
	// Answered is called after the answer was written and flushed to the
	// connection (status is its HTTP status), or after the connection was
	// reset without one (status 0). For a slow body it is called once the
	// whole body is sent.
	Answered func(r Request, status int)
}

// SetHooks replaces the hooks for requests processed from now on. Safe for
// concurrent use.
func (s *Sim) SetHooks(h Hooks) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hooks = h
}

// answered flushes what was written to w, so that the answer is on its way
// before the hook runs, and calls Hooks.Answered if set.
func answered(h Hooks, w http.ResponseWriter, r Request, status int) {
	if h.Answered == nil {
		return
	}
	if f, ok := w.(http.Flusher); ok && status != 0 {
		f.Flush()
	}
	h.Answered(r, status)
}
