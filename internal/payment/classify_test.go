package payment

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// TestChargeAnswers drives every row of the SPEC §5 table, and the statuses
// the spec is silent on, through a real HTTP exchange.
func TestChargeAnswers(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		tests := []struct {
			name       string
			status     int
			header     map[string]string
			body       string
			wantErr    bool
			kind       fault.Kind
			retryAfter time.Duration
			code       string
			chargeID   string
			replayed   bool
		}{
			{name: "200 with charge id", status: 200, body: `{"charge_id":"ch_1","status":"succeeded"}`, chargeID: "ch_1"},
			{name: "201 with charge id", status: 201, body: `{"charge_id":"ch_2"}`, chargeID: "ch_2"},
			{name: "200 replayed", status: 200, header: map[string]string{"Idempotent-Replayed": "true"}, body: `{"charge_id":"ch_3"}`, chargeID: "ch_3", replayed: true},
			{name: "204 no body", status: 204},
			{name: "200 not JSON", status: 200, body: `<html>ok</html>`},
			{name: "200 charge id not a string", status: 200, body: `{"charge_id":12}`},
			{name: "200 charge id with control chars", status: 200, body: `{"charge_id":"ch\n1"}`},
			{name: "200 oversized body", status: 200, body: `{"charge_id":"ch_4","pad":"` + strings.Repeat("x", maxResponseBody) + `"}`},
			{name: "409 in progress", status: 409, header: map[string]string{"Retry-After": "2"}, body: `{"error":{"code":"idempotency_key_in_use"}}`, wantErr: true, kind: fault.Transient, retryAfter: 2 * time.Second, code: "idempotency_key_in_use"},
			{name: "422 key reused", status: 422, body: `{"error":{"type":"invalid_request_error","code":"idempotency_key_reused"}}`, wantErr: true, kind: fault.Conflict, code: "idempotency_key_reused"},
			{name: "400", status: 400, body: `{"error":{"code":"parameter_invalid","message":"amount 99.90 for customer 42"}}`, wantErr: true, kind: fault.Permanent, code: "parameter_invalid"},
			{name: "402 declined", status: 402, body: `{"error":{"type":"card_error","code":"card_declined"}}`, wantErr: true, kind: fault.Permanent, code: "card_declined"},
			{name: "404", status: 404, wantErr: true, kind: fault.Permanent},
			{name: "410", status: 410, wantErr: true, kind: fault.Permanent},
			{name: "408", status: 408, wantErr: true, kind: fault.Transient},
			{name: "401", status: 401, wantErr: true, kind: fault.Systemic},
			{name: "403", status: 403, wantErr: true, kind: fault.Systemic},
			{name: "429", status: 429, header: map[string]string{"Retry-After": "7"}, wantErr: true, kind: fault.Transient, retryAfter: 7 * time.Second},
			{name: "500", status: 500, body: `{"error":"boom with spaces"}`, wantErr: true, kind: fault.Transient},
			{name: "502", status: 502, wantErr: true, kind: fault.Transient},
			{name: "503", status: 503, header: map[string]string{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, wantErr: true, kind: fault.Transient},
			{name: "504", status: 504, wantErr: true, kind: fault.Transient},
			{name: "302 not followed", status: 302, header: map[string]string{"Location": "/elsewhere"}, wantErr: true, kind: fault.Systemic},
			{name: "307 not followed", status: 307, header: map[string]string{"Location": "/elsewhere"}, wantErr: true, kind: fault.Systemic},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var redirected atomic.Int32
				srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if r.URL.Path == "/elsewhere" {
						redirected.Add(1)
					}
					for k, v := range tt.header {
						w.Header().Set(k, v)
					}
					w.WriteHeader(tt.status)
					_, _ = w.Write([]byte(tt.body))
				}))
				c := newClient(t, srv.URL, nil)
				res, err := c.Charge(t.Context(), testCharge())
				if redirected.Load() != 0 {
					t.Error("redirect was followed")
				}
				if !tt.wantErr {
					if err != nil {
						t.Fatalf("Charge() error = %v", err)
					}
					want := Result{ChargeID: tt.chargeID, Status: tt.status, Replayed: tt.replayed}
					if res != want {
						t.Errorf("Charge() = %+v, want %+v", res, want)
					}
					return
				}
				e := mustPaymentError(t, err)
				if e.Status != tt.status || e.Kind != tt.kind || fault.KindOf(err) != tt.kind {
					t.Errorf("error %+v, KindOf %v; want status %d kind %v", e, fault.KindOf(err), tt.status, tt.kind)
				}
				if e.RetryAfter != tt.retryAfter || e.Code != tt.code {
					t.Errorf("RetryAfter %v code %q, want %v %q", e.RetryAfter, e.Code, tt.retryAfter, tt.code)
				}
				if strings.Contains(err.Error(), "99.90") {
					t.Errorf("error leaks the provider's body: %v", err)
				}
			})
		}
	})
}

func TestClassify(t *testing.T) {
	for status, want := range map[int]fault.Kind{
		100: fault.Transient, 101: fault.Transient, 199: fault.Transient,
		300: fault.Systemic, 301: fault.Systemic, 308: fault.Systemic,
		400: fault.Permanent, 401: fault.Systemic, 402: fault.Permanent, 403: fault.Systemic,
		404: fault.Permanent, 407: fault.Systemic, 408: fault.Transient, 409: fault.Transient,
		413: fault.Permanent, 422: fault.Conflict, 429: fault.Transient, 499: fault.Permanent,
		500: fault.Transient, 503: fault.Transient, 599: fault.Transient, 600: fault.Transient, 0: fault.Transient,
	} {
		if got := classify(status); got != want {
			t.Errorf("classify(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	for h, want := range map[string]time.Duration{
		"": 0, "0": 0, "3": 3 * time.Second, " 10 ": 10 * time.Second, "-1": 0, "1.5": 0,
		"Wed, 21 Oct 2015 07:28:00 GMT": 0, "99999999999999999999": 0, "999999": maxRetryAfter,
	} {
		if got := parseRetryAfter(h); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", h, got, want)
		}
	}
}

func TestErrorCode(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"code":"card_declined"}}`:                   "card_declined",
		`{"error":{"type":"api_error"}}`:                       "api_error",
		`{"error":{"code":"Bad Code","type":"x_y"}}`:           "x_y",
		`{"error":{"code":"customer 42 paid 99.90"}}`:          "",
		`{"error":"string form"}`:                              "",
		`not json`:                                             "",
		`{"error":{"code":"` + strings.Repeat("a", 65) + `"}}`: "",
	} {
		if got := errorCode([]byte(body)); got != want {
			t.Errorf("errorCode(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{Status: 429, Kind: fault.Transient, RetryAfter: 2 * time.Second, Code: "rate_limited"}
	if got, want := e.Error(), "payment: provider answered 429 Too Many Requests (transient): rate_limited, retry after 2s"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	cause := errors.New("connection reset by peer")
	e = &Error{Kind: fault.Transient, Err: cause}
	if !errors.Is(e, cause) || !strings.Contains(e.Error(), "outcome unknown") {
		t.Errorf("Error() = %q, Is(cause) = %v", e.Error(), errors.Is(e, cause))
	}
}
