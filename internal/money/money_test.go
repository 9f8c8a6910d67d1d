package money

import "testing"

func TestParseAmount(t *testing.T) {
	tests := []struct {
		in   string
		want Amount
		ok   bool
	}{
		{"99.90", 9990, true},
		{"99.9", 9990, true},
		{"99", 9900, true},
		{"0.01", 1, true},
		{"0.5", 50, true},
		{"100000000.00", Max, true},
		{"100000000.01", 0, false},
		{"999999999", 0, false},
		{"1000000000", 0, false},
		{"0", 0, false},
		{"0.00", 0, false},
		{"", 0, false},
		{".5", 0, false},
		{"5.", 0, false},
		{"05", 0, false},
		{"1.234", 0, false},
		{"-1.00", 0, false},
		{"+1.00", 0, false},
		{"1e2", 0, false},
		{"1E2", 0, false},
		{" 1", 0, false},
		{"1,00", 0, false},
		{"1.2.3", 0, false},
		{"١٢", 0, false},
		{"NaN", 0, false},
		{"99999999999999999999999999", 0, false},
	}
	for _, tt := range tests {
		got, err := ParseAmount(tt.in)
		if tt.ok != (err == nil) || got != tt.want {
			t.Errorf("ParseAmount(%q) = %d, %v; want %d, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestAmountString(t *testing.T) {
	for a, want := range map[Amount]string{1: "0.01", 9990: "99.90", 500: "5.00", Max: "100000000.00", -150: "-1.50"} {
		if got := a.String(); got != want {
			t.Errorf("Amount(%d).String() = %q, want %q", int64(a), got, want)
		}
	}
}

func FuzzParseAmount(f *testing.F) {
	for _, s := range []string{"99.90", "0.01", "1e2", "05", "100000000.00", "-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAmount(s)
		if err != nil {
			return
		}
		if a <= 0 || a > Max {
			t.Fatalf("ParseAmount(%q) = %d outside (0, Max]", s, a)
		}
		// The canonical form parses back to the same amount.
		back, err := ParseAmount(a.String())
		if err != nil || back != a {
			t.Fatalf("round trip of %q: %q -> %d, %v", s, a.String(), back, err)
		}
	})
}
