// Package field is the error a package's Config.Validate returns for one
// field: the package that owns a rule checks it, names its own Go field,
// and says what is wrong; cmd/billing-consumer maps each Go field to the
// BILLING_ variable that sets it, so that a rule is written once and still
// reported under the name the operator sets.
package field

import (
	"errors"
	"fmt"
)

// Error is what is wrong with one field of a Config.
type Error struct {
	// Field is the Go name of the field, as in its struct ("DrainTimeout").
	Field  string
	format string
	args   []any
}

// Ref names another field of the same Config in a problem: Error prints
// it as is, Problem lets the caller name it.
type Ref string

// Errorf returns the Error of field; the problem is format with args, as
// "must be below %s (%s), got %s" with a Ref among the args.
func Errorf(field, format string, args ...any) *Error {
	return &Error{Field: field, format: format, args: args}
}

func (e *Error) Error() string {
	return e.Field + ": " + e.Problem(func(f string) string { return f })
}

// Problem says what is wrong, with each Ref named by name.
func (e *Error) Problem(name func(field string) string) string {
	args := make([]any, len(e.args))
	for i, a := range e.args {
		if r, ok := a.(Ref); ok {
			a = name(string(r))
		}
		args[i] = a
	}
	return fmt.Sprintf(e.format, args...)
}

// Errors returns the *Error values of err, an errors.Join of them as a
// Validate returns (none for nil). An error that is no *Error comes back
// as the Error of the unnamed field "".
func Errors(err error) []*Error {
	if err == nil {
		return nil
	}
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var out []*Error
		for _, e := range joined.Unwrap() {
			out = append(out, Errors(e)...)
		}
		return out
	}
	var fe *Error
	if errors.As(err, &fe) {
		return []*Error{fe}
	}
	return []*Error{Errorf("", "%s", err.Error())}
}
