package main

import (
	"slices"

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
	"consumer": {
		"Brokers":           "KAFKA_BROKERS",
		"Topic":             "KAFKA_TOPIC",
		"GroupID":           "KAFKA_GROUP_ID",
		"MaxRecordBytes":    "KAFKA_MAX_RECORD_BYTES",
		"MaxInFlightBytes":  "MAX_INFLIGHT_BYTES",
		"SessionTimeout":    "KAFKA_SESSION_TIMEOUT",
		"RebalanceTimeout":  "KAFKA_REBALANCE_TIMEOUT",
		"HeartbeatInterval": "KAFKA_HEARTBEAT_INTERVAL",
		"DrainTimeout":      "DRAIN_TIMEOUT",
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
// nothing. With only, it reports the problems of those fields alone, so
// that cmd can say them in the order of its own checks. A field missing
// from the table is a bug of this file, reported with its Go name rather
// than lost.
func report(v problem, told map[string]bool, owner string, err error, only ...string) {
	vars := fieldVars[owner]
	name := func(f string) string {
		if n, ok := vars[f]; ok {
			return envPrefix + "_" + n
		}
		return owner + "." + f
	}
	for _, fe := range field.Errors(err) {
		if len(only) > 0 && !slices.Contains(only, fe.Field) {
			continue
		}
		if n, ok := vars[fe.Field]; ok {
			if !told[n] {
				v(n, "%s", fe.Problem(name))
			}
		} else {
			v("", "%s: %s", name(fe.Field), fe.Problem(name))
		}
	}
}
