package main

import (
	"fmt"
	"os"
	"testing"
)

// The rules that a package's Validate owns (consumer, pipeline, the
// completer) are reported under the BILLING_ variable that sets each field,
// in words that do not change when a rule moves: each case pins the whole
// line.
func TestPackageRulesKeepTheirMessages(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"BILLING_COMPLETER_AFTER": "0s"}, "BILLING_COMPLETER_AFTER: must be positive, got 0s"},
		{map[string]string{"BILLING_COMPLETER_AFTER": "-1s"}, "BILLING_COMPLETER_AFTER: must be positive, got -1s"},
		{map[string]string{"BILLING_CLAIM_BLOCK_AFTER": "1m", "BILLING_COMPLETER_AFTER": "1m"}, "BILLING_CLAIM_BLOCK_AFTER: must exceed BILLING_COMPLETER_AFTER (1m0s), got 1m0s"},
		{map[string]string{"BILLING_DRAIN_TIMEOUT": "0s"}, "BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (6s) and BILLING_KAFKA_REBALANCE_TIMEOUT (12s), got 0s"},
		{map[string]string{"BILLING_DRAIN_TIMEOUT": "-1s"}, "BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (6s) and BILLING_KAFKA_REBALANCE_TIMEOUT (12s), got -1s"},
		{map[string]string{"BILLING_DRAIN_TIMEOUT": "30s", "BILLING_SHUTDOWN_TIMEOUT": "60s"}, "BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (6s) and BILLING_KAFKA_REBALANCE_TIMEOUT (12s), got 30s"},
		{map[string]string{"BILLING_DRAIN_TIMEOUT": "20s", "BILLING_KAFKA_REBALANCE_TIMEOUT": "20s", "BILLING_KAFKA_SESSION_TIMEOUT": "45s", "BILLING_SHUTDOWN_TIMEOUT": "60s"}, "BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (45s) and BILLING_KAFKA_REBALANCE_TIMEOUT (20s), got 20s"},
		{map[string]string{"BILLING_DRAIN_TIMEOUT": "100ms", "BILLING_KAFKA_SESSION_TIMEOUT": "500ms"}, "BILLING_KAFKA_SESSION_TIMEOUT: must be at least 1s (brokers also enforce group.min.session.timeout.ms, 6s by default), got 500ms; BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (500ms), got 500ms"},
		{map[string]string{"BILLING_KAFKA_HEARTBEAT_INTERVAL": "0s"}, "BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (6s), got 0s"},
		{map[string]string{"BILLING_KAFKA_HEARTBEAT_INTERVAL": "-1s"}, "BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (6s), got -1s"},
		{map[string]string{"BILLING_KAFKA_HEARTBEAT_INTERVAL": "2s"}, "BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (6s), got 2s"},
		{map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "0s"}, "BILLING_KAFKA_SESSION_TIMEOUT: must be at least 1s (brokers also enforce group.min.session.timeout.ms, 6s by default), got 0s; BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (0s), got 500ms; BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (0s) and BILLING_KAFKA_REBALANCE_TIMEOUT (12s), got 3s"},
		{map[string]string{"BILLING_KAFKA_BROKERS": ""}, "BILLING_KAFKA_BROKERS: required"},
		{map[string]string{"BILLING_KAFKA_GROUP_ID": ""}, "BILLING_KAFKA_GROUP_ID: required"},
		{map[string]string{"BILLING_KAFKA_TOPIC": ""}, "BILLING_KAFKA_TOPIC: \"\" is not a valid topic name"},
		{map[string]string{"BILLING_KAFKA_TOPIC": "orders confirmed"}, "BILLING_KAFKA_TOPIC: \"orders confirmed\" is not a valid topic name"},
		{map[string]string{"BILLING_KAFKA_MAX_RECORD_BYTES": "2000000000"}, "<nil>"},
		{map[string]string{"BILLING_RETRY_BACKOFF": "0s"}, "BILLING_RETRY_BACKOFF: must be positive, got 0s"},
		{map[string]string{"BILLING_RETRY_BACKOFF": "-1s", "BILLING_RETRY_BACKOFF_MAX": "-2s"}, "BILLING_RETRY_BACKOFF: must be positive, got -1s"},
		{map[string]string{"BILLING_RETRY_BACKOFF": "2s", "BILLING_RETRY_BACKOFF_MAX": "1s"}, "BILLING_RETRY_BACKOFF_MAX: must be at least BILLING_RETRY_BACKOFF (2s), got 1s"},
		{map[string]string{"BILLING_MAX_ATTEMPTS": "0"}, "BILLING_MAX_ATTEMPTS: must be between 1 and 100, got 0"},
		{map[string]string{"BILLING_MAX_ATTEMPTS": "101"}, "BILLING_MAX_ATTEMPTS: must be between 1 and 100, got 101"},
		{map[string]string{"BILLING_OUTAGE_THRESHOLD": "-1"}, "BILLING_OUTAGE_THRESHOLD: must be between 0 and 10000, got -1"},
		{map[string]string{"BILLING_OUTAGE_AFTER": "-1s"}, "BILLING_OUTAGE_AFTER: must be between 0s and 1h, got -1s"},
		{map[string]string{"BILLING_RETRY_BUDGET": "-1m"}, "BILLING_RETRY_BUDGET: must be between 0s and 24h, got -1m0s"},
		{map[string]string{"BILLING_OUTAGE_AFTER": "1m", "BILLING_PARK_AFTER": "0s", "BILLING_RETRY_BUDGET": "1m"}, "BILLING_RETRY_BUDGET: must exceed BILLING_OUTAGE_AFTER (1m0s), or an event failing alone is exhausted before the outage is seen, got 1m0s"},
		{map[string]string{"BILLING_PARK_AFTER": "-1s"}, "BILLING_PARK_AFTER: must be 0 (never park), or above BILLING_PAYMENT_TIMEOUT (10s), at least BILLING_OUTAGE_AFTER (30s) and below BILLING_RETRY_BUDGET (30m0s), got -1s"},
		{map[string]string{"BILLING_PARK_AFTER": "30m"}, "BILLING_PARK_AFTER: must be 0 (never park), or above BILLING_PAYMENT_TIMEOUT (10s), at least BILLING_OUTAGE_AFTER (30s) and below BILLING_RETRY_BUDGET (30m0s), got 30m0s"},
		{map[string]string{"BILLING_COMPLETER_AFTER": "0s", "BILLING_DRAIN_TIMEOUT": "0s", "BILLING_KAFKA_GROUP_ID": "", "BILLING_KAFKA_HEARTBEAT_INTERVAL": "0s", "BILLING_MAX_ATTEMPTS": "0", "BILLING_RETRY_BACKOFF": "0s"}, "BILLING_COMPLETER_AFTER: must be positive, got 0s; BILLING_KAFKA_GROUP_ID: required; BILLING_KAFKA_HEARTBEAT_INTERVAL: must be positive and below a third of BILLING_KAFKA_SESSION_TIMEOUT (6s), got 0s; BILLING_DRAIN_TIMEOUT: must be positive and below BILLING_KAFKA_SESSION_TIMEOUT (6s) and BILLING_KAFKA_REBALANCE_TIMEOUT (12s), got 0s; BILLING_MAX_ATTEMPTS: must be between 1 and 100, got 0; BILLING_RETRY_BACKOFF: must be positive, got 0s"},
		{map[string]string{}, "<nil>"},
	}
	for _, tt := range tests {
		setEnv(t, validEnv, tt.env)
		_, err := loadAndValidate()
		got := "<nil>"
		if err != nil {
			got = err.Error()
		}
		if os.Getenv("BILLING_TEST_PRINT_GOLDEN") != "" {
			fmt.Printf("\t\t{%#v, %q},\n", tt.env, got)
			continue
		}
		if got != tt.want {
			t.Errorf("env %v:\n got %q\nwant %q", tt.env, got, tt.want)
		}
	}
}

// The in-flight budget's rule (one maximal record fits, consumer's) keeps
// its message too, "the default" included when the variable is unset;
// these run with consume, as `run` does.
func TestBudgetRulesKeepTheirMessages(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		limit int64
		env   map[string]string
		want  string
	}{
		{230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "1048576"}, "BILLING_MAX_INFLIGHT_BYTES: 1048576 cannot hold one maximal record: BILLING_KAFKA_MAX_RECORD_BYTES (1048576) plus 512 bytes of overhead"},
		{8 * mib, map[string]string{}, "BILLING_MAX_INFLIGHT_BYTES: the default 262144 cannot hold one maximal record: BILLING_KAFKA_MAX_RECORD_BYTES (1048576) plus 512 bytes of overhead"},
		{230 * mib, map[string]string{"BILLING_MAX_INFLIGHT_BYTES": "104857600"}, "BILLING_MAX_INFLIGHT_BYTES: 104857600 does not fit in the process's memory limit of 241172480 bytes (GOMEMLIMIT): at most a quarter of it, 60293120"},
		{230 * mib, map[string]string{"BILLING_KAFKA_MAX_RECORD_BYTES": "100"}, "BILLING_KAFKA_MAX_RECORD_BYTES: must be between 1024 and 67108864 (64MiB), got 100"},
	}
	for _, tt := range tests {
		withMemoryLimit(t, tt.limit)
		setEnv(t, validEnv, tt.env)
		_, err := configFor(need{kafka: true, payment: true, consume: true})
		got := "<nil>"
		if err != nil {
			got = err.Error()
		}
		if os.Getenv("BILLING_TEST_PRINT_GOLDEN") != "" {
			fmt.Printf("\t\t{%d * mib, %#v, %q},\n", tt.limit/mib, tt.env, got)
			continue
		}
		if got != tt.want {
			t.Errorf("limit %d, env %v:\n got %q\nwant %q", tt.limit, tt.env, got, tt.want)
		}
	}
}
