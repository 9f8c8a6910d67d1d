package main

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// environ lists the process environment for the unknown-variable check.
// Tests replace it to hide the BILLING_TEST_* variables that locate their
// own Postgres and Kafka; nothing else does.
var environ = os.Environ

// knownVariables is the name of every variable the config struct reads,
// derived from its envconfig tags: a field added to config is known at once.
func knownVariables() []string {
	var b strings.Builder
	if err := envconfig.Usagef(envPrefix, &config{}, &b, "{{range .}}{{usage_key .}}\n{{end}}"); err != nil {
		panic(fmt.Sprintf("config struct: %v", err)) // a programmer error in the tags
	}
	return strings.Fields(b.String())
}

// serviceLinkVar matches the variables Kubernetes injects into every pod of
// the namespace for a Service named billing-consumer when service links are
// on (enableServiceLinks, the default): BILLING_CONSUMER_SERVICE_HOST,
// BILLING_CONSUMER_SERVICE_PORT[_<port name>], BILLING_CONSUMER_PORT and
// BILLING_CONSUMER_PORT_<port>_<protocol>[_PROTO|_PORT|_ADDR]. They are not
// ours, but a user's manifests may keep service links on: rejecting them
// would be a crash loop.
var serviceLinkVar = regexp.MustCompile(`^BILLING_CONSUMER_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT|PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$`)

// unknownVariables returns one problem per BILLING_* variable of env that
// the binary does not read (a typo that would otherwise leave a default in
// force), each naming the nearest known variable. Values are never shown.
func unknownVariables(env []string) []string {
	known := knownVariables()
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix+"_") || slices.Contains(known, name) || serviceLinkVar.MatchString(name) {
			continue
		}
		out = append(out, fmt.Sprintf("%s: unknown variable; did you mean %s? (billing-consumer help lists them all)", name, nearest(name, known)))
	}
	slices.Sort(out)
	return out
}

// nearest is the name of names closest to s by edit distance; the first
// of equals.
func nearest(s string, names []string) string {
	best, bestD := "", -1
	for _, n := range names {
		if d := editDistance(s, n); bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes: the names
// are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
