package billing_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/billing"
	"github.com/billing-consumer/billing-consumer/internal/fault"
	"github.com/billing-consumer/billing-consumer/internal/payment"
)

// Two deliveries of one event at once (a rebalance: the old owner still
// billing, the new one starting from the committed offset). The first
// creates the claim; its request is refused by something in front of the
// provider (a gateway's 404 during a deploy: a definite refusal, nothing
// stored under the key), so it releases the claim. The second saw the
// claim as its own pending one before the release, and sends the same
// request, which the provider takes. The claim it charged under is gone:
// the order must not be free for a third event to charge again.
func TestRedeliverySendsAfterTheCreatorReleasedTheClaim(t *testing.T) {
	e := newEnv(t, "secret-token")
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":{"code":"no_route"}}`, http.StatusNotFound)
	}))
	defer gw.Close()
	gwClient, err := payment.New(payment.Config{BaseURL: gw.URL, Token: "secret-token", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ev := event(8101, 1000)
	firstSending, secondPastLookup := make(chan struct{}), make(chan struct{})
	first := newService(t, e.pool, chargerFunc(func(ctx context.Context, ch payment.Charge) (payment.Result, error) {
		close(firstSending)
		<-secondPastLookup
		return gwClient.Charge(ctx, ch)
	}))
	in := newInjector()
	in.gate = func(_ int, name string) {
		if name == "dedup insert" { // the second delivery decided to charge its own pending claim
			close(secondPastLookup)
		}
	}
	second := newService(t, faultDB{e.pool, in}, e.client)

	ctx := context.Background()
	firstErr := make(chan error, 1)
	go func() { _, err := first.Process(ctx, ev); firstErr <- err }()
	<-firstSending
	res2, err2 := second.Process(ctx, ev)
	if err := <-firstErr; !fault.Is(err, fault.Permanent) {
		t.Fatalf("first delivery: %v; want permanent (the gateway's 404)", err)
	}
	t.Logf("second delivery: %+v, %v (ops %q)", res2, err2, in.trace())
	if fault.Is(err2, fault.Transient) || fault.Is(err2, fault.Systemic) {
		res2, err2 = settle(ctx, t, e.svc, ev) // the pipeline retries it
		t.Logf("second delivery retried: %+v, %v", res2, err2)
	}
	// A distinct event for the order, from another record key.
	other := event(8101, 1000)
	ores, oerr := settle(ctx, t, e.svc, other)
	t.Logf("other event: %+v, %v", ores, oerr)
	if n := e.sim.ChargesFor(8101); n != 1 {
		t.Fatalf("provider took %d charges for order 8101, want 1", n)
	}
	if err2 != nil || res2.Outcome != billing.Charged {
		t.Fatalf("second delivery: %+v, %v; want charged", res2, err2)
	}
	e.assertChargedOnce(t, ev)
}
