package field

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestErrorNamesItsFieldsAsTheCallerAsks(t *testing.T) {
	err := errors.Join(
		Errorf("DrainTimeout", "must be below %s (%s), got %s", Ref("SessionTimeout"), 10*time.Second, 20*time.Second),
		fmt.Errorf("wrapped: %w", Errorf("Topic", "%q is not a valid topic name", "{SessionTimeout}")),
		errors.New("plain"),
	)
	if got, want := err.Error(), "DrainTimeout: must be below SessionTimeout (10s), got 20s\nwrapped: Topic: \"{SessionTimeout}\" is not a valid topic name\nplain"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	env := func(f string) string { return "BILLING_" + f }
	var got []string
	for _, fe := range Errors(err) {
		got = append(got, fe.Field+"|"+fe.Problem(env))
	}
	want := []string{"DrainTimeout|must be below BILLING_SessionTimeout (10s), got 20s", "Topic|\"{SessionTimeout}\" is not a valid topic name", "|plain"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Errors = %q, want %q", got, want)
	}
	if Errors(nil) != nil {
		t.Error("Errors(nil) is not empty")
	}
}
