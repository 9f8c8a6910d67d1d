package billing

import (
	"errors"
	"fmt"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// ErrHeld is in the chain of Process's error for an event held behind a
// blocked claim on its order: another event's, or its own (blocked now
// because it is past BILLING_CLAIM_BLOCK_AFTER, or blocked before). Such
// an event is neither a conflict nor decidable now: an operator decides
// the claim (`claim release` or `claim mark-charged`), and the event is
// decided with it (SPEC §11, I3). The error's fault.Kind is Busy, so a
// caller that does not look for ErrHeld waits and retries, never
// dead-letters; the pipeline defers the event at once instead of waiting
// BILLING_PARK_AFTER (waiting cannot help), and the deciding loop gives
// its row back (RetryDeferred). Test with errors.Is.
var ErrHeld = errors.New("held behind a blocked claim")

// heldf returns a Busy error wrapping ErrHeld, with the message given.
func heldf(format string, args ...any) error {
	return fault.New(fault.Busy, fmt.Errorf(format+": %w", append(args, ErrHeld)...))
}
