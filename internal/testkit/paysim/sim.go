// Package paysim simulates a Stripe-like payment provider for tests, the
// demo and benchmarks. Sim is an http.Handler serving POST /payments/charge
// with idempotency keys, counters that tell whether any order was charged
// twice, and deterministic fault injection (latency, 5xx, accept-then-reset,
// declines). Wrap it in httptest.Server or http.Server.
//
// Per Idempotency-Key: the first request is processed and its answer
// (status and body) stored; a later request with the same key and a
// byte-identical body gets the stored answer again with header
// Idempotent-Replayed: true; the same key with another body gets 422; a
// request whose key is still being processed gets 409. Requests rejected by
// validation (400) are not stored.
package paysim

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/money"
)

// ChargePath is the only path served.
const ChargePath = "/payments/charge"

const (
	maxBody   = 64 << 10
	maxKeyLen = 255
)

// Config configures a Sim. The zero value is a fault-free simulator without
// authentication, seeded with 0.
type Config struct {
	// Token, when set, is the bearer token every request must carry;
	// anything else is answered 401.
	Token string
	// Seed makes fault injection reproducible: the same seed and the same
	// sequence of processed requests give the same faults.
	Seed uint64
	// Faults are the initial faults; see SetFaults.
	Faults Faults
}

// Sim is the simulated provider. All its methods, ServeHTTP included, are
// safe for concurrent use.
type Sim struct {
	token string

	mu       sync.Mutex
	rng      *rand.Rand
	faults   Faults
	keys     map[string]*entry
	requests map[int]int
	charges  []ChargeRecord
	perOrder map[int64]int
	injected FaultCounts
	replays  int
	inFlight int
	hooks    Hooks
}

// entry is what the simulator remembers of one idempotency key.
type entry struct {
	body   []byte // the request body, compared byte for byte
	done   bool   // false while the first request is in flight
	status int
	answer []byte
}

// New returns a Sim configured by cfg.
func New(cfg Config) *Sim {
	return &Sim{
		token:    cfg.Token,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15)),
		faults:   cfg.Faults,
		keys:     make(map[string]*entry),
		requests: make(map[int]int),
		perOrder: make(map[int64]int),
	}
}

// chargeRequest is the request body.
type chargeRequest struct {
	OrderID    int64  `json:"order_id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"`
}

// chargeAnswer is the body of a successful charge.
type chargeAnswer struct {
	ChargeID   string `json:"charge_id"`
	Status     string `json:"status"`
	OrderID    int64  `json:"order_id"`
	CustomerID int64  `json:"customer_id"`
	Amount     string `json:"amount"`
}

// ServeHTTP answers one request; see the package comment for the semantics.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != ChargePath {
		s.reject(w, http.StatusNotFound, "resource_missing", "no such endpoint")
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.reject(w, http.StatusMethodNotAllowed, "method_not_allowed", "only POST is served")
		return
	}
	if s.token != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+s.token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="paysim"`)
		s.reject(w, http.StatusUnauthorized, "authentication_required", "invalid bearer token")
		return
	}
	key := r.Header.Get("Idempotency-Key")
	if key == "" || len(key) > maxKeyLen {
		s.reject(w, http.StatusBadRequest, "idempotency_key_invalid", "Idempotency-Key is required, at most 255 bytes")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.reject(w, http.StatusRequestEntityTooLarge, "body_too_large", "request body too large")
			return
		}
		s.reject(w, http.StatusBadRequest, "body_unreadable", "request body could not be read")
		return
	}
	req, parseErr := parseCharge(body)

	s.mu.Lock()
	if e, ok := s.keys[key]; ok {
		switch {
		case !e.done:
			s.mu.Unlock()
			s.reject(w, http.StatusConflict, "idempotency_key_in_use", "a request with this key is in progress")
		case !bytes.Equal(e.body, body):
			s.mu.Unlock()
			s.reject(w, http.StatusUnprocessableEntity, "idempotency_key_reused", "this key was used with different parameters")
		default:
			status, answer := e.status, e.answer
			s.replays++
			s.mu.Unlock()
			w.Header().Set("Idempotent-Replayed", "true")
			s.reply(w, status, answer)
		}
		return
	}
	if parseErr != nil {
		s.mu.Unlock()
		s.reject(w, http.StatusBadRequest, "parameter_invalid", parseErr.Error())
		return
	}
	e := &entry{body: body}
	s.keys[key] = e
	s.inFlight++
	f, h := s.faults, s.hooks
	d := s.drawLocked(f)
	s.mu.Unlock()

	s.process(w, key, e, req, f, d, h)
}

// process takes (or declines, or fails) the charge of a new key and answers.
// h's hooks see it after the draw and after the answer.
func (s *Sim) process(w http.ResponseWriter, key string, e *entry, req chargeRequest, f Faults, d draw, h Hooks) {
	if d.conflict {
		s.mu.Lock()
		s.inFlight--
		delete(s.keys, key)
		s.injected.Conflicts++
		s.mu.Unlock()
		s.reject(w, http.StatusConflict, "idempotency_key_in_use", "injected: a request with this key is in progress")
		return
	}
	hr := Request{Key: key, OrderID: req.OrderID}
	if h.Received != nil {
		h.Received(hr)
	}
	if d.delay > 0 {
		time.Sleep(d.delay) // not cut short by the client leaving: see Faults.Latency
	}
	declined := !d.fail && f.Decline != nil && f.Decline(req.OrderID)
	unavailable := !d.fail && f.Unavailable != nil && f.Unavailable(req.OrderID)

	s.mu.Lock()
	s.inFlight--
	if d.fail || unavailable {
		delete(s.keys, key)
		s.injected.Errors++
		s.mu.Unlock()
		status := http.StatusInternalServerError
		if unavailable {
			status = http.StatusServiceUnavailable
		}
		s.reject(w, status, "api_error", "injected failure, nothing charged")
		answered(h, w, hr, status)
		return
	}
	if declined {
		s.injected.Declines++
		e.status, e.answer = http.StatusPaymentRequired, errorBody("card_declined", "the payment was declined")
	} else {
		rec := ChargeRecord{
			Key:        key,
			OrderID:    req.OrderID,
			CustomerID: req.CustomerID,
			Amount:     req.Amount,
			ChargeID:   fmt.Sprintf("ch_%06d", len(s.charges)+1),
		}
		s.charges = append(s.charges, rec)
		s.perOrder[req.OrderID]++
		e.status, e.answer = http.StatusOK, mustJSON(chargeAnswer{
			ChargeID: rec.ChargeID, Status: "succeeded",
			OrderID: rec.OrderID, CustomerID: rec.CustomerID, Amount: rec.Amount,
		})
	}
	e.done = true
	if d.reset {
		s.injected.Resets++
		s.requests[0]++
		s.mu.Unlock()
		if h.Answered != nil {
			defer h.Answered(hr, 0) // abort may end the handler by panic
		}
		abort(w)
		return
	}
	status, answer := e.status, e.answer
	if d.slow {
		s.injected.SlowBodies++
		s.requests[status]++
		s.mu.Unlock()
		replySlowly(w, status, answer, f.SlowBodyDelay)
		answered(h, w, hr, status)
		return
	}
	s.mu.Unlock()
	s.reply(w, status, answer)
	answered(h, w, hr, status)
}

// parseCharge validates a request body. Amounts are stored in canonical
// form.
func parseCharge(body []byte) (chargeRequest, error) {
	var req chargeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, errors.New("body is not a valid charge object")
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) > 0 {
		return req, errors.New("data after the charge object")
	}
	if req.OrderID <= 0 || req.CustomerID <= 0 {
		return req, errors.New("order_id and customer_id must be positive")
	}
	a, err := money.ParseAmount(req.Amount)
	if err != nil {
		return req, errors.New("amount must be a positive decimal string with at most 2 fractional digits")
	}
	req.Amount = a.String()
	return req, nil
}

// reply writes an answer and counts it.
func (s *Sim) reply(w http.ResponseWriter, status int, body []byte) {
	s.mu.Lock()
	s.requests[status]++
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// reject answers an error that is not stored under the key.
func (s *Sim) reject(w http.ResponseWriter, status int, code, message string) {
	s.reply(w, status, errorBody(code, message))
}

func errorBody(code, message string) []byte {
	type apiError struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	typ := "invalid_request_error"
	switch code {
	case "card_declined":
		typ = "card_error"
	case "api_error":
		typ = "api_error"
	}
	return mustJSON(struct {
		Error apiError `json:"error"`
	}{apiError{Type: typ, Code: code, Message: message}})
}

// mustJSON marshals values built from this package's own types, which
// cannot fail; a failure is a programmer error.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("paysim: marshal answer: %v", err))
	}
	return append(b, '\n')
}
