package main

import (
	"github.com/billing-consumer/billing-consumer/internal/field"
)

// fieldVars names the variable (without BILLING_) that sets each field a
// package's Validate reports on, by the package's own Go name for it: the
// rule lives in the package, the name the operator sets lives here.
var fieldVars = map[string]map[string]string{
	"pipeline": {
		"MaxAttempts":     "MAX_ATTEMPTS",
		"RetryBudget":     "RETRY_BUDGET",
		"ParkAfter":       "PARK_AFTER",
		"OutageThreshold": "OUTAGE_THRESHOLD",
		"OutageAfter":     "OUTAGE_AFTER",
		"BackoffBase":     "RETRY_BACKOFF",
		"BackoffMax":      "RETRY_BACKOFF_MAX",
	},
	"completer": {
		"After":      "COMPLETER_AFTER",
		"BlockAfter": "CLAIM_BLOCK_AFTER",
	},
}

// report adds to v each problem of err, the result of the Validate of
// what fieldVars calls owner, under the variable of its field, unless
// that variable is already told: where cmd holds a limit of its own on a
// variable (BILLING_MAX_ATTEMPTS between 1 and 100), that limit is checked
// first and the package's wider rule (MaxAttempts at least 1) adds
// nothing. A field missing from the table is a bug of this file, reported
// with its Go name rather than lost.
func report(v problem, told map[string]bool, owner string, err error) {
	vars := fieldVars[owner]
	name := func(f string) string {
		if n, ok := vars[f]; ok {
			return envPrefix + "_" + n
		}
		return owner + "." + f
	}
	for _, fe := range field.Errors(err) {
		if n, ok := vars[fe.Field]; ok {
			if !told[n] {
				v(n, "%s", fe.Problem(name))
			}
		} else {
			v("", "%s: %s", name(fe.Field), fe.Problem(name))
		}
	}
}
