package main

import (
	"github.com/billing-consumer/billing-consumer/internal/field"
)

// fieldVars names the variable (without BILLING_) that sets each field a
// package's Validate reports on, by the package's own Go name for it: the
// rule lives in the package, the name the operator sets lives here.
var fieldVars = map[string]map[string]string{
	"completer": {
		"After":      "COMPLETER_AFTER",
		"BlockAfter": "CLAIM_BLOCK_AFTER",
	},
}

// report adds to v each problem of err, the result of the Validate of
// what fieldVars calls owner, under the variable of its field. A field
// missing from the table is a bug of this file, reported with its Go name
// rather than lost.
func report(v problem, owner string, err error) {
	vars := fieldVars[owner]
	name := func(f string) string {
		if n, ok := vars[f]; ok {
			return envPrefix + "_" + n
		}
		return owner + "." + f
	}
	for _, fe := range field.Errors(err) {
		if n, ok := vars[fe.Field]; ok {
			v(n, "%s", fe.Problem(name))
		} else {
			v("", "%s: %s", name(fe.Field), fe.Problem(name))
		}
	}
}
