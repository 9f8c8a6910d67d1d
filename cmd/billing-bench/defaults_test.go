package main

import (
	"strings"
	"testing"
)

// The defaults come from the binary's help table, the group settings of
// the recovery scenario too; a variable missing from
// it, or a default that is not a number, stops the bench.
func TestParseDefaults(t *testing.T) {
	const help = `Environment:
BILLING_BATCH_SIZE                Integer                         31                             most events billed in one transaction
BILLING_CONCURRENCY               Integer                         257                            events processed at once by this instance
BILLING_KAFKA_SESSION_TIMEOUT     Duration                        10s                            consumer group session timeout
BILLING_DRAIN_TIMEOUT             Duration                        5s                             how long in-flight events may finish
BILLING_KAFKA_TOPIC               String                                                         the source topic
`
	d, err := parseDefaults(help)
	if err != nil || d.Concurrency != 257 || d.BatchSize != 31 {
		t.Fatalf("parseDefaults = %+v, %v", d, err)
	}
	if len(d.Group) != 2 || d.Group["BILLING_KAFKA_SESSION_TIMEOUT"] != "10s" || d.Group["BILLING_DRAIN_TIMEOUT"] != "5s" {
		t.Errorf("group settings %v, want the session and drain timeouts of the help (and nothing for the variables it lacks)", d.Group)
	}
	if _, err := parseDefaults(strings.Replace(help, "BILLING_CONCURRENCY", "BILLING_OTHER", 1)); err == nil ||
		!strings.Contains(err.Error(), "BILLING_CONCURRENCY") {
		t.Errorf("without BILLING_CONCURRENCY: %v, want an error naming it", err)
	}
	if _, err := parseDefaults(strings.Replace(help, " 31 ", " 3x ", 1)); err == nil || !strings.Contains(err.Error(), "BILLING_BATCH_SIZE") {
		t.Errorf("a default that is not a number: %v, want an error naming the variable", err)
	}
}
