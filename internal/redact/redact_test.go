package redact

import (
	"slices"
	"testing"
)

func TestString(t *testing.T) {
	tests := []struct {
		in, want  string
		passwords []string
	}{
		{"postgres://u:pw@db:5432/x", "postgres://u:***@db:5432/x", []string{"pw"}},
		{"postgresql://u:p@ss@db/x", "postgresql://u:***@db/x", []string{"p@ss"}},
		{"postgres://u@db/x", "postgres://u@db/x", nil},
		{"postgres://db/x?user=u&password=pw&sslmode=require", "postgres://db/x?user=u&password=***&sslmode=require", []string{"pw"}},
		{"host=db user=u password='p w' sslpassword=k dbname=x", "host=db user=u password=*** sslpassword=*** dbname=x", []string{"p w", "k"}},
		{"host=db password= dbname=x", "host=db password= dbname=x", nil},
		{"https://collector:4318/v1/traces", "https://collector:4318/v1/traces", nil},
		{"https://tok:s3cr3t@collector:4318", "https://tok:***@collector:4318", []string{"s3cr3t"}},
		{"", "", nil},
	}
	for _, tt := range tests {
		if got := String(tt.in); got != tt.want {
			t.Errorf("String(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := Passwords(tt.in); !slices.Equal(got, tt.passwords) {
			t.Errorf("Passwords(%q) = %q, want %q", tt.in, got, tt.passwords)
		}
	}
}
