package grafana

import (
	"bytes"
	"os"
	"testing"
)

// TestGenerated fails when billing-consumer.json is not what Dashboard
// generates: the JSON was edited by hand, or the code changed without
// `go generate ./grafana` (run in deploy/).
func TestGenerated(t *testing.T) {
	want, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("billing-consumer.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("billing-consumer.json differs from the generated dashboard: run `go generate ./grafana` in deploy/ and commit the result")
	}
}
