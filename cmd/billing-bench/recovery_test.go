package main

import (
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/billing-consumer/billing-consumer/internal/consumer"
)

// progressAfter measures from the disturbance until the slowest partition
// has passed its committed offset at the disturbance, and says when one
// never did.
func TestProgressAfter(t *testing.T) {
	samples := []sample{
		at(0, 10, 10), at(1000, 20, 20), // both advancing
		at(1500, 20, 20),                   // the disturbance at 1.5 s
		at(2000, 30, 20),                   // partition 0 goes on
		at(3000, 40, 20), at(9500, 50, 25), // partition 1 again only at 9.5 s
	}
	d, ok := progressAfter(samples, t0.Add(1500*time.Millisecond))
	if !ok || d != 8*time.Second {
		t.Errorf("progressAfter = %v, %v; want 8s, true", d, ok)
	}
	if d, ok := progressAfter(samples[:5], t0.Add(1500*time.Millisecond)); ok {
		t.Errorf("partition 1 never advanced, progressAfter = %v, true; want false", d)
	}
	// A disturbance before the first sample compares with nothing committed.
	if d, ok := progressAfter(samples, t0.Add(-time.Second)); !ok || d != time.Second {
		t.Errorf("before any sample: %v, %v; want 1s, true", d, ok)
	}
}

// longestStall finds the longest gap between two advances of one
// partition that overlaps the stage, a gap still open at the stage's end
// counting up to it, and ignores gaps wholly outside the stage.
func TestLongestStall(t *testing.T) {
	samples := []sample{
		at(0, 0, 0), at(1000, 5, 5),
		at(2000, 10, 10), // gap of 5 s on partition 0 before the stage: outside
		at(7000, 15, 15),
		// the stage: 7.5 s .. 12 s
		at(8000, 20, 15),  // partition 1 stalls from 7 s
		at(9000, 25, 15),  //
		at(11000, 30, 15), // partition 0: 2 s gap
		at(12000, 35, 15), // partition 1 still stalled at the stage's end: 5 s
		at(20000, 40, 40), // after the stage
	}
	d, part := longestStall(samples, t0.Add(7500*time.Millisecond), t0.Add(12*time.Second))
	if d != 5*time.Second || part != 1 {
		t.Errorf("longestStall = %v on partition %d; want 5s on partition 1", d, part)
	}
	// A gap that began before the stage counts from its start: here from
	// 2 s, and up to the stage's end, where it is still open.
	d, part = longestStall(samples, t0.Add(6*time.Second), t0.Add(6500*time.Millisecond))
	if d != 4500*time.Millisecond || part != 0 {
		t.Errorf("straddling gap: %v on partition %d; want 4.5s on partition 0 (2 s to 6.5 s)", d, part)
	}
	if d, part := longestStall(nil, t0, t0.Add(time.Second)); d != 0 || part != -1 {
		t.Errorf("no samples: %v, %d; want 0, -1", d, part)
	}
}

// The README line and the target come from the run under test, not the
// baseline, and the target says not met above 10 s.
func TestRecoverySummaryAndTarget(t *testing.T) {
	run := func(baseline bool, crash, rolling time.Duration) recovery {
		return recovery{Baseline: baseline, Rate: 1000, Settings: map[string]string{"BILLING_KAFKA_SESSION_TIMEOUT": "30s"},
			Stages: []stage{{Name: "crash: SIGKILL", AllProgress: crash}, {Name: "rolling restart", LongestStall: rolling}}}
	}
	r := report{recovery: []recovery{run(false, 31500*time.Millisecond, 4200*time.Millisecond), run(true, 9*time.Second, time.Second)}}
	s := r.recoverySummary()
	if !strings.Contains(s, "**31.5 s**") || !strings.Contains(s, "**4.2 s**") || !strings.Contains(s, "BILLING_KAFKA_SESSION_TIMEOUT=30s") {
		t.Errorf("summary %q lacks the crash and rolling figures or the settings of the run under test", s)
	}
	ts := r.recoveryTargets()
	if len(ts) != 1 || ts[0].met || ts[0].measured != "31.5 s" {
		t.Errorf("targets %+v, want one, not met, 31.5 s", ts)
	}
}

// The group counts as settled only when Stable with the expected members,
// each assigned something: a member that has joined but holds nothing
// (or a group still rebalancing) is not.
func TestGroupSettled(t *testing.T) {
	member := func(parts ...int) kafka.DescribeGroupsResponseMember {
		m := kafka.DescribeGroupsResponseMember{}
		if len(parts) > 0 {
			m.MemberAssignments.Topics = []kafka.GroupMemberTopic{{Topic: "t", Partitions: parts}}
		}
		return m
	}
	g := kafka.DescribeGroupsResponseGroup{GroupState: "Stable", Members: []kafka.DescribeGroupsResponseMember{member(0, 1, 2), member(3, 4, 5)}}
	if !groupSettled(consumer.Assignment(g, "t", []int{0, 1, 2, 3, 4, 5}), 2) {
		t.Error("stable, two assigned members: not settled")
	}
	if groupSettled(consumer.Assignment(g, "t", []int{0, 1, 2, 3, 4, 5}), 1) {
		t.Error("two members where one is expected: settled")
	}
	g.Members[1] = member()
	if groupSettled(consumer.Assignment(g, "t", []int{0, 1, 2, 3, 4, 5}), 2) {
		t.Error("a member without partitions: settled")
	}
	g.Members[1], g.GroupState = member(3), "CompletingRebalance"
	if groupSettled(consumer.Assignment(g, "t", []int{0, 1, 2, 3, 4, 5}), 2) {
		t.Error("a group still rebalancing: settled")
	}
}

// A stage's time until every partition advances runs from the
// disturbance, through the wait for the group to settle, to the first
// advance of the slowest partition after that.
func TestStageMeasure(t *testing.T) {
	samples := []sample{at(0, 10, 10), at(1000, 20, 20), at(2000, 30, 20), at(5000, 30, 30), at(6000, 40, 40)}
	s := stage{from: t0.Add(1500 * time.Millisecond), settled: t0.Add(2500 * time.Millisecond), to: t0.Add(6 * time.Second)}
	s.measure(samples)
	// settled after 1 s; then partition 0 first advances at 6 s: 4.5 s in all.
	if s.AllProgress != 4500*time.Millisecond {
		t.Errorf("AllProgress = %v, want 4.5s", s.AllProgress)
	}
	if s.LongestStall != 4*time.Second || s.StallPartition != 0 {
		t.Errorf("LongestStall = %v on %d, want 4s on partition 0 (2 s to 6 s)", s.LongestStall, s.StallPartition)
	}
}
