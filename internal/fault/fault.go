// Package fault classifies errors into the few kinds that decide what the
// consumer does with an event: retry it, pause, or send it to the dead-letter
// queue with a reason.
//
// Packages wrap their errors with New; callers read the kind back with KindOf
// and never match on error strings. An error without a kind is Transient:
// retrying an unknown failure is safe because every stage is idempotent,
// while dead-lettering it could lose a charge.
package fault

import (
	"errors"
	"fmt"
)

// Kind is the class of a failure. The zero value is Transient.
type Kind int

const (
	// Transient failures may succeed on retry with the same input: timeouts,
	// connection resets, 409/429/5xx from the provider, Postgres
	// serialization or connection errors. Retry with backoff, then DLQ
	// "exhausted".
	Transient Kind = iota
	// Invalid input can never succeed: the record does not decode or does
	// not validate. DLQ "invalid".
	Invalid
	// Permanent means the provider rejected this charge (400, 404, other
	// 4xx). DLQ "permanent".
	Permanent
	// Conflict means the same key was used with different parameters: a
	// second event for an order with another amount, or a 422 from the
	// provider. DLQ "conflict" and alert: never retried, never charged.
	Conflict
	// Systemic failures are not the event's fault: credentials rejected
	// (401/403), database unreachable. Pause consumption and retry; never
	// dead-letter, or every healthy event would follow.
	Systemic
	// Busy means another event holds the order's ledger claim and its
	// charge's outcome is not known yet (SPEC §6): this event can only be
	// decided once that claim settles. Wait and retry without spending
	// attempts toward "exhausted" and without counting toward outage
	// detection; it is neither this event's fault nor a dependency's.
	Busy
)

// String returns the kind's name, which is also the DLQ reason for the kinds
// that are dead-lettered.
func (k Kind) String() string {
	switch k {
	case Transient:
		return "transient"
	case Invalid:
		return "invalid"
	case Permanent:
		return "permanent"
	case Conflict:
		return "conflict"
	case Systemic:
		return "systemic"
	case Busy:
		return "busy"
	}
	return fmt.Sprintf("kind(%d)", int(k))
}

// Error is an error with a kind. Its message is the wrapped error's.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// New wraps err with kind. It returns nil when err is nil.
func New(kind Kind, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Kind: kind, Err: err}
}

// Errorf formats an error of the given kind, like fmt.Errorf.
func Errorf(kind Kind, format string, args ...any) error {
	return &Error{Kind: kind, Err: fmt.Errorf(format, args...)}
}

// KindOf returns the kind of the outermost *Error in err's chain, or
// Transient when there is none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Transient
}

// Is reports whether err has the given kind.
func Is(err error, kind Kind) bool { return err != nil && KindOf(err) == kind }
