package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"
)

const operationsDoc = "../../docs/operations.md"

// helpDefaults returns the default of every variable, as help prints it.
func helpDefaults(t *testing.T) map[string]string {
	t.Helper()
	var b bytes.Buffer
	if err := printUsage(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	def, meaning := strings.Index(lines[0], "DEFAULT"), strings.Index(lines[0], "MEANING")
	if def < 0 || meaning < def {
		t.Fatalf("usage header %q", lines[0])
	}
	out := map[string]string{}
	for _, l := range lines[1:] {
		if len(l) < meaning {
			continue
		}
		out[strings.Fields(l)[0]] = strings.TrimSpace(l[def:meaning])
	}
	return out
}

// docs/operations.md names only variables the binary reads, and its table
// of defaults says what help says: the documentation cannot drift from the
// code (it once stated a pool default of 16).
func TestOperationsDocMatchesHelp(t *testing.T) {
	b, err := os.ReadFile(operationsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	defaults := helpDefaults(t)
	for _, m := range regexp.MustCompile(`BILLING_[A-Z0-9_]*[A-Z0-9]`).FindAllString(doc, -1) {
		if _, ok := defaults[m]; !ok && m != "BILLING_TEST_DATABASE_URL" {
			t.Errorf("%s names %s, which billing-consumer does not read (see billing-consumer help)", operationsDoc, m)
		}
	}
	rows := regexp.MustCompile("(?m)^\\| `(BILLING_[A-Z0-9_]+)` \\| (`([^`]*)`|\\(empty[^)]*\\)) \\|$").FindAllStringSubmatch(doc, -1)
	if len(rows) < 10 {
		t.Fatalf("%s: found %d rows of the defaults table; the pattern no longer matches it", operationsDoc, len(rows))
	}
	for _, r := range rows {
		want, documented := defaults[r[1]], r[3]
		if strings.HasPrefix(r[2], "(empty") {
			documented = ""
		}
		if documented != want {
			t.Errorf("%s documents %s default %q; help says %q", operationsDoc, r[1], documented, want)
		}
	}
}
