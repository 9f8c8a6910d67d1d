package billing_test

import (
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
)

// TestNextClaimStatus is NextClaimStatus's table, row by row, as its doc
// comment gives it, plus the edges of the block-after rule.
func TestNextClaimStatus(t *testing.T) {
	const (
		pending  = billing.ClaimPending
		charged  = billing.ClaimCharged
		blocked  = billing.ClaimBlocked
		released = billing.ClaimReleased
	)
	type facts = billing.ClaimFacts
	hour := time.Hour
	for _, tc := range []struct {
		name string
		f    facts
		want billing.ClaimStatus
	}{
		{"none: send", facts{Answer: billing.AnswerNone, Age: time.Minute, BlockAfter: hour}, pending},
		{"none, no limit: send", facts{Answer: billing.AnswerNone, Age: 1000 * hour}, pending},
		{"none, at the limit: send", facts{Answer: billing.AnswerNone, Age: hour, BlockAfter: hour}, pending},
		{"none, past the limit: blocked unsent", facts{Answer: billing.AnswerNone, Age: hour + time.Second, BlockAfter: hour}, blocked},
		{"none, past the limit, completer", facts{Answer: billing.AnswerNone, Actor: billing.ActorCompleter, Age: 2 * hour, BlockAfter: hour}, blocked},

		{"2xx, creator", facts{Answer: billing.AnswerCharged}, charged},
		{"2xx, other attempt", facts{Answer: billing.AnswerCharged, Actor: billing.ActorEvent}, charged},
		{"2xx, completer", facts{Answer: billing.AnswerCharged, Actor: billing.ActorCompleter}, charged},

		{"422, creator", facts{Answer: billing.AnswerConflict}, blocked},
		{"422, other attempt", facts{Answer: billing.AnswerConflict, Actor: billing.ActorEvent}, blocked},
		{"422, completer", facts{Answer: billing.AnswerConflict, Actor: billing.ActorCompleter}, blocked},

		{"refused, creator, nothing unknown, no other sender", facts{Answer: billing.AnswerRefused}, released},
		{"refused, creator after an unknown outcome", facts{Answer: billing.AnswerRefused, UnknownSeen: true}, pending},
		{"refused, creator, another attempt sent", facts{Answer: billing.AnswerRefused, OthersSent: true}, pending},
		{"refused, other attempt", facts{Answer: billing.AnswerRefused, Actor: billing.ActorEvent}, pending},
		{"refused, completer", facts{Answer: billing.AnswerRefused, Actor: billing.ActorCompleter}, blocked},

		{"unknown, creator", facts{Answer: billing.AnswerUnknown}, pending},
		{"unknown, other attempt", facts{Answer: billing.AnswerUnknown, Actor: billing.ActorEvent}, pending},
		{"unknown, completer", facts{Answer: billing.AnswerUnknown, Actor: billing.ActorCompleter}, pending},
	} {
		if got := billing.NextClaimStatus(tc.f); got != tc.want {
			t.Errorf("%s: NextClaimStatus(%+v) = %s, want %s", tc.name, tc.f, got, tc.want)
		}
	}
}

// TestNextStrayStatus is the 2xx rule's table, as NextStrayStatus's doc
// comment gives it.
func TestNextStrayStatus(t *testing.T) {
	for current, want := range map[billing.ClaimStatus]billing.ClaimStatus{
		billing.ClaimReleased: billing.ClaimCharged,
		billing.ClaimPending:  billing.ClaimBlocked,
		billing.ClaimCharged:  billing.ClaimCharged,
		billing.ClaimBlocked:  billing.ClaimBlocked,
	} {
		if got := billing.NextStrayStatus(current); got != want {
			t.Errorf("NextStrayStatus(%s) = %s, want %s", current, got, want)
		}
	}
}
