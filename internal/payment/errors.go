package payment

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// maxRetryAfter caps the provider's Retry-After hint, so that a bogus header
// cannot park a partition for days (or overflow a Duration).
const maxRetryAfter = time.Hour

// Error is a failed charge attempt. Client.Charge returns it wrapped in a
// *fault.Error of the same Kind, so both errors.As(err, &*Error) and
// fault.KindOf(err) work.
//
// Its message never contains the bearer token, the request body or the
// provider's response body: it may end up in logs and in the dlq-error
// header, and the body carries amounts and customer ids.
type Error struct {
	// Status is the HTTP status the provider answered, or 0 when no answer
	// was received (network error, timeout, reset, cancellation): then the
	// outcome is unknown and Kind is Transient; or Systemic when the TLS
	// handshake failed our verification and nothing was sent.
	Status int
	// Kind is what the caller must do; see classify for the mapping.
	Kind fault.Kind
	// RetryAfter is the provider's Retry-After hint in seconds, when the
	// answer carried one (typically with 409, 429 or 503); zero otherwise.
	// The HTTP-date form is ignored: it would need a trusted clock.
	RetryAfter time.Duration
	// Code is the provider's machine-readable error code from a body such as
	// {"error":{"code":"card_declined"}}, kept only when it looks like an
	// identifier (lowercase letters, digits, '_', '.', '-'); else "".
	Code string
	// Err is the underlying cause for attempts without an answer; nil when
	// Status is set.
	Err error
	// Conns is how many connections the request was handed to: more than
	// one when net/http replayed it after a reused connection died, 0 when
	// none was had (the dial or the TLS handshake failed). The FastHTTP
	// engine never replays: 1 whenever a connection was had. Set by
	// Client.Charge; see NotTaken.
	Conns int
}

// Error describes the attempt without secrets or personal data.
func (e *Error) Error() string {
	if e.Status == 0 && e.Kind == fault.Systemic {
		return fmt.Sprintf("payment: charge not sent (%s): %v", e.Kind, e.Err)
	}
	if e.Status == 0 {
		return fmt.Sprintf("payment: charge attempt failed (%s, outcome unknown): %v", e.Kind, e.Err)
	}
	msg := fmt.Sprintf("payment: provider answered %d %s (%s)", e.Status, http.StatusText(e.Status), e.Kind)
	if e.Code != "" {
		msg += ": " + e.Code
	}
	if e.RetryAfter > 0 {
		msg += ", retry after " + e.RetryAfter.String()
	}
	return msg
}

// NotTaken reports whether the attempt proves that the provider did not
// take the money: it refused the charge (Permanent: 400, 402, 404, ...),
// refused our credentials (401, or 407 from a forward proxy: both answer
// the request before it is passed on), or the request was never sent (the
// provider's certificate failed verification before any connection was
// had). A redirect, a 403 (a WAF may answer it from the provider's
// response, after the charge was taken), a 409, a 422 or any outcome
// without an answer proves nothing.
//
// Nor does any answer to a request net/http handed to more than one
// connection (Conns > 1), nor a certificate rejected after one connection
// was had: the Transport replayed the request after a connection died
// with a copy written, and the refusal answers the replay, not the copy
// the provider may have charged. Any other Charger behind billing's port
// must keep the same rule: a refusal proves nothing when the request may
// have been written more than once.
func (e *Error) NotTaken() bool {
	switch {
	case e.Status == 0:
		return e.Kind == fault.Systemic && e.Conns == 0
	case e.Conns > 1:
		return false
	case e.Kind == fault.Permanent:
		return true
	default:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusProxyAuthRequired
	}
}

// Unwrap returns the underlying cause, if any.
func (e *Error) Unwrap() error { return e.Err }

// wrap returns e as an error whose outermost fault kind is e.Kind.
func (e *Error) wrap() error { return fault.New(e.Kind, e) }

// classify maps a non-2xx status to what the consumer does (SPEC §5).
//
// Where the spec is silent:
//   - 3xx is Systemic. A redirect is never an answer about this charge; it
//     means the configured URL, scheme or a proxy is wrong, which hits every
//     event alike, like bad credentials. Redirects are not followed: 301-303
//     would turn the POST into a GET, 307/308 would re-send the charge to a
//     location nobody vetted.
//   - 407 (proxy credentials) is Systemic like 401/403.
//   - 408 (the server gave up waiting for our request) is Transient: the
//     same request retried is expected to succeed.
//   - 1xx that reach us and codes outside 100-599 are Transient: the
//     outcome is unknown, and a retry with the same key is always safe.
func classify(status int) fault.Kind {
	switch {
	case status == http.StatusConflict, status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return fault.Transient
	case status == http.StatusUnprocessableEntity:
		return fault.Conflict
	case status == http.StatusUnauthorized, status == http.StatusForbidden, status == http.StatusProxyAuthRequired:
		return fault.Systemic
	case status >= 400 && status < 500:
		return fault.Permanent
	case status >= 500 && status < 600:
		return fault.Transient
	case status >= 300 && status < 400:
		return fault.Systemic
	}
	return fault.Transient
}

// refused is the error of a non-2xx answer: its status, kind, Retry-After
// header and the first bytes of its body (for the code).
func refused(status int, retryAfter string, body []byte) error {
	e := &Error{
		Status:     status,
		Kind:       classify(status),
		RetryAfter: parseRetryAfter(retryAfter),
		Code:       errorCode(body),
	}
	return e.wrap()
}

// parseRetryAfter reads a Retry-After header given in delta-seconds.
func parseRetryAfter(h string) time.Duration {
	h = strings.TrimSpace(h)
	if h == "" {
		return 0
	}
	secs, err := strconv.ParseInt(h, 10, 64)
	if err != nil || secs <= 0 {
		return 0
	}
	if secs > int64(maxRetryAfter/time.Second) {
		return maxRetryAfter
	}
	return time.Duration(secs) * time.Second
}

// errorCode extracts a provider error code from an error body, keeping it
// only when it is a short identifier and so cannot smuggle personal data
// into logs.
func errorCode(body []byte) string {
	var v struct {
		Error struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &v) != nil {
		return ""
	}
	for _, c := range []string{v.Error.Code, v.Error.Type} {
		if isIdentifier(c) {
			return c
		}
	}
	return ""
}

func isIdentifier(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}
