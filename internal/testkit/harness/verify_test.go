package harness

import (
	"fmt"
	"strings"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/dlq"
)

// TestBlockedDeclinedFates: a declined order whose claim ended blocked
// keeps its event as a "permanent" record or a deferred row; the deferred
// row stands for the "permanent" record, and an order with neither (a
// "conflict" record is not its true reason) is a lost event.
// Both CI failures it answers had a blocked declined order: one (the
// crash test) whose event was deferred, one (chaos) whose event had its
// "permanent" record before the completer blocked the claim.
func TestBlockedDeclinedFates(t *testing.T) {
	rec := func(order int64, reason dlq.Reason) DLQRecord {
		return DLQRecord{Value: fmt.Sprintf(`{"event_id":"x","order_id":%d}`, order), Reason: reason}
	}
	records := []DLQRecord{rec(1, dlq.Permanent), rec(2, dlq.Conflict), rec(9, dlq.Permanent), {Value: "not json", Reason: dlq.Invalid}}
	r := Report{BlockedDeclined: []int64{1, 2, 3, 4}, HeldDeclined: []int64{3}}
	if stand := r.blockedDeclinedFates(records); stand != 1 {
		t.Errorf("stand = %d, want 1 (order 3's deferred row)", stand)
	}
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "[2 4]") {
		t.Errorf("problems %q; want one naming orders 2 (a conflict record) and 4 (nothing)", r.Problems)
	}
	own := records[0].Value
	planted := func(d DLQRecord) bool { return d.Value == own }
	r = Report{BlockedDeclined: []int64{1}}
	if r.blockedDeclinedFates(consumerRecords(records, planted)); len(r.Problems) != 1 {
		t.Errorf("problems %q; want order 1 lost when its only record is the test's own", r.Problems)
	}
}
