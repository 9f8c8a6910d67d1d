package events

import (
	"testing"
)

// BenchmarkDecode measures one record through Decode: a valid record in
// its compact and pretty forms, one with an escaped key, and an invalid one
// (a duplicate key) that must be refused. Run it with -benchmem: allocs/op
// and B/op are what the hot path pays per event.
func BenchmarkDecode(b *testing.B) {
	for _, tc := range []struct{ dir, name string }{
		{"valid", "basic"},
		{"valid", "pretty"},
		{"valid", "escaped_key"},
		{"valid", "unknown_fields"},
		{"invalid", "duplicate_total_amount"},
	} {
		value := readFixture(b, tc.dir, tc.name)
		_, wantErr := Decode(value, testNow)
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(value)))
			for b.Loop() {
				if _, err := Decode(value, testNow); (err != nil) != (wantErr != nil) {
					b.Fatalf("Decode: %v", err)
				}
			}
		})
	}
}
