package paysim

import (
	"net"
	"net/http"
	"strconv"
	"time"
)

// Faults are the misbehaviours the simulator injects. They apply only to
// requests it processes afresh (a new key); replays of stored answers and
// rejections (400, 409, 422, ...) are always served cleanly. The zero value
// injects nothing.
type Faults struct {
	// Latency delays processing; LatencyJitter adds a uniformly drawn extra
	// delay in [0, LatencyJitter). The key is in flight meanwhile, so a
	// concurrent request with it gets 409. Processing goes on even if the
	// client gives up, as at a real provider: that is the timeout whose
	// outcome is unknown.
	Latency       time.Duration
	LatencyJitter time.Duration
	// ErrorRate is the probability of answering 500 without taking the
	// charge. The key is not stored, so a retry is processed afresh.
	ErrorRate float64
	// ResetRate is the probability of accept-then-reset: the charge is
	// taken and its answer stored, then the connection is closed (with a
	// TCP reset where possible) without any response. A retry with the same
	// key gets the stored answer.
	ResetRate float64
	// ConflictRate is the probability of answering 409 at once, as a
	// provider does while it believes a request with the key is in
	// progress; nothing is charged and the key is not stored.
	ConflictRate float64
	// SlowBodyRate is the probability that the answer, after the charge is
	// taken and stored, is sent slowly: the status and half the body at
	// once, the rest after SlowBodyDelay. A client whose timeout is shorter
	// loses the answer mid-body: outcome unknown, the money taken.
	SlowBodyRate  float64
	SlowBodyDelay time.Duration
	// Decline, when set, is asked for each processed order; true answers
	// 402 Payment Required, stored like any completed answer, no charge
	// taken. It is called without locks held and must be safe for
	// concurrent use.
	Decline func(orderID int64) bool
	// Unavailable, when set, is asked for each processed order; true
	// answers 503 without taking the charge (the key is not stored), as a
	// provider does when one account or a fraud check on it is stuck while
	// every other order is charged. Same rules as Decline.
	Unavailable func(orderID int64) bool
}

// FaultCounts counts the faults injected so far.
type FaultCounts struct {
	Errors     int // 500 answers from ErrorRate
	Resets     int // connections closed without an answer from ResetRate
	Conflicts  int // 409 answers from ConflictRate
	SlowBodies int // answers trickled from SlowBodyRate
	Declines   int // 402 answers from Decline
}

// SetFaults replaces the faults for requests processed from now on; requests
// already past the draw keep the faults they drew. Safe for concurrent use.
func (s *Sim) SetFaults(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f
}

// Injected returns the counts of injected faults. Safe for concurrent use.
func (s *Sim) Injected() FaultCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.injected
}

// draw is what the random source decided for one processed request.
type draw struct {
	delay    time.Duration
	fail     bool
	reset    bool
	conflict bool
	slow     bool
}

// drawLocked rolls the dice for one request; s.mu must be held. It always
// consumes five values, so the sequence of outcomes for a seed does not
// depend on which faults happen to be enabled.
func (s *Sim) drawLocked(f Faults) draw {
	jitter, fail, reset := s.rng.Float64(), s.rng.Float64(), s.rng.Float64()
	conflict, slow := s.rng.Float64(), s.rng.Float64()
	d := draw{delay: max(f.Latency, 0)}
	if f.LatencyJitter > 0 {
		d.delay += time.Duration(jitter * float64(f.LatencyJitter))
	}
	d.conflict = conflict < f.ConflictRate
	d.fail = !d.conflict && fail < f.ErrorRate
	d.reset = !d.conflict && !d.fail && reset < f.ResetRate
	d.slow = !d.conflict && !d.fail && !d.reset && slow < f.SlowBodyRate
	return d
}

// replySlowly sends status and the first half of body, then the rest after
// delay, unless the client has gone.
func replySlowly(w http.ResponseWriter, status int, body []byte, delay time.Duration) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	half := len(body) / 2
	_, _ = w.Write(body[:half])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	time.Sleep(delay)
	_, _ = w.Write(body[half:])
}

// abort drops the connection without writing a response. Hijacking lets us
// send a TCP reset, the harshest realistic failure; where the connection
// cannot be hijacked (HTTP/2, wrapped writers) the documented
// http.ErrAbortHandler panic makes the server abort the response instead.
func abort(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // close with RST rather than FIN
			}
			_ = conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}
