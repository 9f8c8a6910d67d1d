package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// The in-flight budget (BILLING_MAX_INFLIGHT_BYTES, see consumer.Config)
// is sized from the memory the process may use. docs/operations.md
// ("Memory") explains the fractions; deploy/memory_test.go checks that the
// manifests' limit, GOMEMLIMIT and the default agree.
//
// The heap the budget costs is about twice the budget: the GC lets the
// heap grow to twice what is live before it collects (GOGC=100), and a
// heap held near GOMEMLIMIT instead costs CPU in collections (1.8x the
// CPU per event at 160 partitions on 6a74246, whose windows held 185 MB
// of heap).
const (
	// inflightDefaultShare: by default a thirty-second of the memory
	// limit, 7.2 MiB of the Deployment's GOMEMLIMIT (230MiB), about 9,000
	// records of the bench's size, far more than BILLING_CONCURRENCY
	// needs queued (a sixteenth measured 177 MB of peak RSS at 160
	// partitions, at the 180 MB target).
	inflightDefaultShare = 32
	// inflightMaxShare: at most a quarter of it. Twice that is the heap
	// the budget may cost; the rest is the handlers' working memory
	// (bounded by BILLING_CONCURRENCY), the readers, the pools and the
	// runtime.
	inflightMaxShare = 4
	// inflightNoLimit is the default without any memory limit.
	inflightNoLimit = 8 << 20
)

// memoryLimit is the most memory the process may use, and where that
// limit comes from: the Go runtime's soft limit (GOMEMLIMIT, which the
// runtime has read), else the cgroup's hard limit (v2 memory.max, v1
// memory.limit_in_bytes). ok is false when there is none.
func memoryLimit() (limit int64, source string, ok bool) {
	if l := debug.SetMemoryLimit(-1); l < math.MaxInt64 {
		return l, "GOMEMLIMIT", true
	}
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// "max", or a v1 "unlimited" near MaxInt64 rounded to pages.
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err == nil && n > 0 && n < 1<<60 {
			return n, "the cgroup's memory limit", true
		}
	}
	return 0, "", false
}

// maxInflightBytes is the consumer's in-flight budget: BILLING_MAX_INFLIGHT_BYTES,
// or when it is 0 a thirty-second of the memory limit (8 MiB without one).
func (c config) maxInflightBytes() int64 {
	if c.MaxInflightBytes > 0 {
		return c.MaxInflightBytes
	}
	if limit, _, ok := memoryLimit(); ok {
		return limit / inflightDefaultShare
	}
	return inflightNoLimit
}

// validateBudget checks the in-flight budget against one maximal record
// (the consumer's rule, consumer.Config.Validate) and against the memory
// limit: either failing would be a consumer that cannot fetch, or one the
// GC or the kernel stops. cmd's own limits on the record size (1 KiB to
// 64 MiB) come first.
func (c config) validateBudget(v problem, told map[string]bool) {
	if c.KafkaMaxRecordBytes < 1024 || c.KafkaMaxRecordBytes > 64<<20 {
		v("KAFKA_MAX_RECORD_BYTES", "must be between 1024 and 67108864 (64MiB), got %d", c.KafkaMaxRecordBytes)
		return
	}
	if c.MaxInflightBytes < 0 {
		v("MAX_INFLIGHT_BYTES", "must be 0 (a thirty-second of the memory limit) or positive, got %d", c.MaxInflightBytes)
		return
	}
	budget, what := c.maxInflightBytes(), ""
	if c.MaxInflightBytes == 0 {
		what = "the default "
	}
	vb := func(name, format string, args ...any) { v(name, what+format, args...) } // "the default 8388608 cannot hold ..."
	report(vb, told, "consumer", c.consumerConfig().Validate(), "MaxInFlightBytes")
	if told["MAX_INFLIGHT_BYTES"] {
		return
	}
	if limit, source, ok := memoryLimit(); ok && budget > limit/inflightMaxShare {
		v("MAX_INFLIGHT_BYTES", "%s does not fit in the process's memory limit of %d bytes (%s): at most a quarter of it, %d",
			what+fmt.Sprint(budget), limit, source, limit/inflightMaxShare)
	}
}
