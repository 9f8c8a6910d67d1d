package events

import (
	"testing"
	"time"
)

func TestIDAt(t *testing.T) {
	at := time.Date(2026, 11, 30, 13, 14, 15, 678e6, time.UTC)
	id := IDAt(at)
	if id.Version() != 7 || id.Variant().String() != "RFC4122" {
		t.Fatalf("%s: version %d, variant %s", id, id.Version(), id.Variant())
	}
	sec, nsec := id.Time().UnixTime()
	if got := time.Unix(sec, nsec).UTC(); !got.Equal(at) {
		t.Fatalf("embedded time %v, want %v", got, at)
	}
	if IDAt(at) == id {
		t.Fatal("two ids for one moment are equal")
	}
}
