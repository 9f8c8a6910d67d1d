package kafkagroup

import "testing"

func TestMarkRoundTrip(t *testing.T) {
	for _, m := range []Mark{{Frontier: 0, Since: 0}, {Frontier: 1 << 40, Since: 17}} {
		got, ok := ParseMark(m.String())
		if !ok || got != m {
			t.Fatalf("ParseMark(%q) = %+v, %v; want %+v", m.String(), got, ok, m)
		}
	}
}

func TestParseMarkRefusesOtherMetadata(t *testing.T) {
	for _, meta := range []string{"", "replay done=1,2", "billing-consumer/2 frontier=5 since=1",
		"billing-consumer/1 frontier=-1 since=0", "billing-consumer/1 frontier=5"} {
		if m, ok := ParseMark(meta); ok {
			t.Errorf("ParseMark(%q) = %+v, true; want not a mark", meta, m)
		}
	}
}
