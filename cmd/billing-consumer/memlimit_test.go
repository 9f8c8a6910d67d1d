package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// withMemoryLimit sets the Go runtime's soft memory limit (what GOMEMLIMIT
// sets) for the test, and restores it after.
func withMemoryLimit(t *testing.T, limit int64) {
	t.Helper()
	old := debug.SetMemoryLimit(limit)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
}

// TestInflightBudget: BILLING_MAX_INFLIGHT_BYTES defaults to a thirty-second of
// the memory limit; run stops with one line naming the variable when the
// budget cannot hold one maximal record or does not fit in the memory
// limit, and names BILLING_KAFKA_MAX_RECORD_BYTES when that is out of
// range. Not run: the subcommands that do not consume share the ConfigMap
// with smaller pods, and do not check it.
func TestInflightBudget(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name    string
		limit   int64
		env     map[string]string
		want    int64  // the budget, when valid
		wantVar string // the variable named, when not
	}{
		{"default: a thirty-second of the pod's GOMEMLIMIT", 230 * mib, nil, 230 * mib / 32, ""},
		{"explicit, within a quarter", 230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "33554432"}, 32 * mib, ""},
		{"a small record limit allows a small budget", 230 * mib, map[string]string{
			"BILLING_MAX_INFLIGHT_BYTES": "65536", "BILLING_KAFKA_MAX_RECORD_BYTES": "16384"}, 64 << 10, ""},
		{"beyond a quarter of the memory limit", 230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "104857600"}, 0, "BILLING_MAX_INFLIGHT_BYTES"},
		{"smaller than one maximal record", 230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "1048576"}, 0, "BILLING_MAX_INFLIGHT_BYTES"},
		{"the default too small for one maximal record", 8 * mib, nil, 0, "BILLING_MAX_INFLIGHT_BYTES"},
		{"negative", 230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "-1"}, 0, "BILLING_MAX_INFLIGHT_BYTES"},
		{"record limit too small", 230 * mib, map[string]string{"BILLING_KAFKA_MAX_RECORD_BYTES": "100"}, 0, "BILLING_KAFKA_MAX_RECORD_BYTES"},
		{"record limit too large", 230 * mib, map[string]string{"BILLING_KAFKA_MAX_RECORD_BYTES": "134217728"}, 0, "BILLING_KAFKA_MAX_RECORD_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			withMemoryLimit(t, tt.limit)
			setEnv(t, validEnv, tt.env)
			cfg, err := configFor(need{kafka: true, payment: true, consume: true})
			if tt.wantVar == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				if got := cfg.maxInflightBytes(); got != tt.want {
					t.Errorf("budget %d, want %d", got, tt.want)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tt.wantVar+":") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %v, want one line starting with %s", err, tt.wantVar)
			}
			if _, err := configFor(need{kafka: true, payment: true}); err != nil {
				t.Errorf("a command that does not consume rejected it too: %v", err)
			}
		})
	}
}
