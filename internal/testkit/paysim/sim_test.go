package paysim

import (
	"encoding/json"
	"fmt"
	"github.com/billing-consumer/billing-consumer/internal/testkit/poll"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const body1001 = `{"order_id":1001,"customer_id":42,"amount":"99.90"}`

// harness is a Sim behind an httptest.Server, and a client that opens a
// fresh connection per request, so net/http never silently replays a
// request whose connection was reset.
type harness struct {
	sim    *Sim
	url    string
	client *http.Client
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	sim := New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &harness{sim: sim, url: srv.URL + ChargePath, client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// answer is what came back for one request.
type answer struct {
	status   int
	body     string
	replayed bool
	err      error // transport error: no answer
}

func (h *harness) post(t *testing.T, key, body string) answer {
	t.Helper()
	return h.do(t, http.MethodPost, h.url, key, body, nil)
}

func (h *harness) do(t *testing.T, method, url, key, body string, header http.Header) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{err: err}
	}
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
}

func chargeID(t *testing.T, a answer) string {
	t.Helper()
	var v struct {
		ChargeID string `json:"charge_id"`
	}
	if a.status != http.StatusOK || json.Unmarshal([]byte(a.body), &v) != nil || v.ChargeID == "" {
		t.Fatalf("no charge in answer %+v", a)
	}
	return v.ChargeID
}

func TestReplay(t *testing.T) {
	h := newHarness(t, Config{})
	first := h.post(t, "k1", body1001)
	id := chargeID(t, first)
	if id != "ch_000001" || first.replayed {
		t.Fatalf("first answer %+v", first)
	}
	again := h.post(t, "k1", body1001)
	if again.status != first.status || again.body != first.body || !again.replayed {
		t.Errorf("replay %+v, want the stored answer %+v with Idempotent-Replayed", again, first)
	}
	if n := h.sim.ChargesFor(1001); n != 1 {
		t.Errorf("ChargesFor(1001) = %d, want 1", n)
	}
	want := []ChargeRecord{{Key: "k1", OrderID: 1001, CustomerID: 42, Amount: "99.90", ChargeID: id}}
	if got := h.sim.Charges(); !slices.Equal(got, want) {
		t.Errorf("Charges() = %+v, want %+v", got, want)
	}
	if h.sim.Replays() != 1 || h.sim.ChargesTaken() != 1 {
		t.Errorf("replays %d, charges %d", h.sim.Replays(), h.sim.ChargesTaken())
	}
}

func TestKeyReusedWithOtherBody(t *testing.T) {
	h := newHarness(t, Config{})
	chargeID(t, h.post(t, "k1", body1001))
	for _, other := range []string{
		`{"order_id":1001,"customer_id":42,"amount":"99.91"}`,
		`{"order_id":1001,"customer_id":42,"amount":"99.9"}`, // same value, other bytes
		`{"customer_id":42,"order_id":1001,"amount":"99.90"}`,
		`not even json`,
	} {
		if a := h.post(t, "k1", other); a.status != http.StatusUnprocessableEntity {
			t.Errorf("same key, body %s: %+v, want 422", other, a)
		}
	}
	if n := h.sim.ChargesTaken(); n != 1 {
		t.Errorf("ChargesTaken() = %d, want 1", n)
	}
}

func TestInFlight409(t *testing.T) {
	h := newHarness(t, Config{Faults: Faults{Latency: 300 * time.Millisecond}})
	firstDone := make(chan answer, 1)
	go func() { firstDone <- h.post(t, "k1", body1001) }()
	poll.Until(t, 10*time.Second, "one charge in flight", func() bool { return h.sim.InFlight() == 1 })

	h.sim.SetFaults(Faults{}) // the in-flight request keeps its latency
	if a := h.post(t, "k1", body1001); a.status != http.StatusConflict {
		t.Errorf("same key while in flight: %+v, want 409", a)
	}
	first := <-firstDone
	id := chargeID(t, first)
	if a := h.post(t, "k1", body1001); chargeID(t, a) != id || !a.replayed {
		t.Errorf("after completion: %+v, want replay of %s", a, id)
	}
	if n := h.sim.ChargesFor(1001); n != 1 {
		t.Errorf("ChargesFor(1001) = %d, want 1", n)
	}
}

func TestResetTakesChargeOnce(t *testing.T) {
	h := newHarness(t, Config{Faults: Faults{ResetRate: 1}})
	if a := h.post(t, "k1", body1001); a.err == nil {
		t.Fatalf("reset: got answer %+v, want a connection error", a)
	}
	if n := h.sim.ChargesFor(1001); n != 1 {
		t.Fatalf("after reset ChargesFor(1001) = %d, want 1 (accept-then-reset)", n)
	}
	// Replays are never reset, even at ResetRate 1.
	retry := h.post(t, "k1", body1001)
	if chargeID(t, retry) != h.sim.Charges()[0].ChargeID || !retry.replayed {
		t.Errorf("retry: %+v, want the stored answer", retry)
	}
	if n := h.sim.ChargesFor(1001); n != 1 {
		t.Errorf("after retry ChargesFor(1001) = %d, want 1", n)
	}
	if got := h.sim.Injected(); got != (FaultCounts{Resets: 1}) {
		t.Errorf("Injected() = %+v", got)
	}
	if got := h.sim.Requests(); got[0] != 1 || got[200] != 1 {
		t.Errorf("Requests() = %v, want 0:1 200:1", got)
	}
}

func TestErrorRateTakesNoCharge(t *testing.T) {
	h := newHarness(t, Config{Faults: Faults{ErrorRate: 1}})
	if a := h.post(t, "k1", body1001); a.status != http.StatusInternalServerError {
		t.Fatalf("%+v, want 500", a)
	}
	if h.sim.ChargesTaken() != 0 || h.sim.Injected().Errors != 1 {
		t.Fatalf("charges %d, injected %+v", h.sim.ChargesTaken(), h.sim.Injected())
	}
	h.sim.SetFaults(Faults{})
	if a := h.post(t, "k1", body1001); a.replayed {
		t.Errorf("retry after 500 replayed %+v; the key must not have been stored", a)
	} else {
		chargeID(t, a)
	}
	if n := h.sim.ChargesFor(1001); n != 1 {
		t.Errorf("ChargesFor(1001) = %d, want 1", n)
	}
}

func TestDoubleCharged(t *testing.T) {
	h := newHarness(t, Config{})
	chargeID(t, h.post(t, "k1", body1001))
	chargeID(t, h.post(t, "k2", `{"order_id":7,"customer_id":1,"amount":"1.00"}`))
	if got := h.sim.DoubleCharged(); len(got) != 0 {
		t.Fatalf("DoubleCharged() = %v before any double charge", got)
	}
	chargeID(t, h.post(t, "k3", body1001)) // another event for the same order
	if got := h.sim.DoubleCharged(); !slices.Equal(got, []int64{1001}) {
		t.Errorf("DoubleCharged() = %v, want [1001]", got)
	}
	if h.sim.ChargesFor(1001) != 2 || h.sim.ChargesFor(7) != 1 || h.sim.ChargesFor(8) != 0 {
		t.Errorf("ChargesFor: %d %d %d", h.sim.ChargesFor(1001), h.sim.ChargesFor(7), h.sim.ChargesFor(8))
	}
}

func TestDecline(t *testing.T) {
	h := newHarness(t, Config{Faults: Faults{Decline: func(order int64) bool { return order == 1001 }}})
	first := h.post(t, "k1", body1001)
	if first.status != http.StatusPaymentRequired || !strings.Contains(first.body, "card_declined") {
		t.Fatalf("%+v, want 402 card_declined", first)
	}
	if again := h.post(t, "k1", body1001); again.status != 402 || !again.replayed || again.body != first.body {
		t.Errorf("retry %+v, want the stored 402", again)
	}
	chargeID(t, h.post(t, "k2", `{"order_id":5,"customer_id":1,"amount":"1.00"}`))
	if h.sim.ChargesFor(1001) != 0 || h.sim.Injected().Declines != 1 {
		t.Errorf("charges %d, injected %+v", h.sim.ChargesFor(1001), h.sim.Injected())
	}
}

func TestRejectsInvalid(t *testing.T) {
	long := strings.Repeat("k", maxKeyLen+1)
	tests := []struct {
		name, key, body string
		want            int
	}{
		{"missing key", "", body1001, 400},
		{"long key", long, body1001, 400},
		{"bad JSON", "k", `{"order_id":`, 400},
		{"unknown field", "k", `{"order_id":1,"customer_id":1,"amount":"1.00","x":1}`, 400},
		{"trailing data", "k", body1001 + `{}`, 400},
		{"zero order", "k", `{"order_id":0,"customer_id":42,"amount":"99.90"}`, 400},
		{"negative customer", "k", `{"order_id":1,"customer_id":-1,"amount":"99.90"}`, 400},
		{"missing amount", "k", `{"order_id":1,"customer_id":1}`, 400},
		{"zero amount", "k", `{"order_id":1,"customer_id":1,"amount":"0.00"}`, 400},
		{"three decimals", "k", `{"order_id":1,"customer_id":1,"amount":"1.234"}`, 400},
		{"numeric amount", "k", `{"order_id":1,"customer_id":1,"amount":99.9}`, 400},
		{"fractional id", "k", `{"order_id":1.5,"customer_id":1,"amount":"1.00"}`, 400},
		{"too large", "k", `{"pad":"` + strings.Repeat("x", maxBody) + `"}`, 413},
	}
	h := newHarness(t, Config{})
	for _, tt := range tests {
		if a := h.post(t, tt.key, tt.body); a.status != tt.want {
			t.Errorf("%s: %+v, want %d", tt.name, a, tt.want)
		}
	}
	// Nothing was stored: the key is still free for a valid request.
	if a := h.post(t, "k", body1001); a.replayed || a.status != http.StatusOK {
		t.Errorf("valid request after rejections: %+v", a)
	}
	if h.sim.ChargesTaken() != 1 || h.sim.Requests()[400] != len(tests)-1 {
		t.Errorf("charges %d, requests %v", h.sim.ChargesTaken(), h.sim.Requests())
	}
}

func TestRoutingAndAuth(t *testing.T) {
	h := newHarness(t, Config{Token: "tok"})
	auth := http.Header{"Authorization": {"Bearer tok"}}
	if a := h.do(t, http.MethodGet, h.url, "k", "", auth); a.status != http.StatusMethodNotAllowed {
		t.Errorf("GET: %+v, want 405", a)
	}
	if a := h.do(t, http.MethodPost, strings.TrimSuffix(h.url, ChargePath)+"/payments/refund", "k", body1001, auth); a.status != http.StatusNotFound {
		t.Errorf("other path: %+v, want 404", a)
	}
	for _, hdr := range []http.Header{nil, {"Authorization": {"Bearer nope"}}, {"Authorization": {"tok"}}} {
		if a := h.do(t, http.MethodPost, h.url, "k", body1001, hdr); a.status != http.StatusUnauthorized {
			t.Errorf("auth %v: %+v, want 401", hdr, a)
		}
	}
	if a := h.do(t, http.MethodPost, h.url, "k", body1001, auth); a.status != http.StatusOK || a.replayed {
		t.Errorf("authorized: %+v, want a fresh 200", a)
	}
}

// TestDeterministic checks that a seed fixes the sequence of faults.
func TestDeterministic(t *testing.T) {
	run := func(seed uint64) []int {
		h := newHarness(t, Config{Seed: seed, Faults: Faults{ErrorRate: 0.5}})
		var statuses []int
		for i := range 40 {
			statuses = append(statuses, h.post(t, fmt.Sprint("k", i), body1001).status)
		}
		return statuses
	}
	a, b := run(7), run(7)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different faults:\n%v\n%v", a, b)
	}
	if !slices.Contains(a, 500) || !slices.Contains(a, 200) {
		t.Errorf("ErrorRate 0.5 gave %v", a)
	}
	if slices.Equal(a, run(8)) {
		t.Error("different seeds gave the same 40 outcomes")
	}
}

// TestConcurrent hammers the simulator with duplicate deliveries: every key
// is charged exactly once whatever the interleaving.
func TestConcurrent(t *testing.T) {
	h := newHarness(t, Config{Seed: 1, Faults: Faults{LatencyJitter: 2 * time.Millisecond}})
	const orders, copies = 20, 5
	var wg sync.WaitGroup
	for o := 1; o <= orders; o++ {
		body := fmt.Sprintf(`{"order_id":%d,"customer_id":1,"amount":"1.00"}`, o)
		for range copies {
			wg.Go(func() {
				for {
					a := h.post(t, fmt.Sprint("key-", o), body)
					if a.status != http.StatusConflict {
						if a.status != http.StatusOK {
							t.Errorf("order %d: %+v", o, a)
						}
						return
					}
				}
			})
		}
	}
	wg.Wait()
	if n := h.sim.ChargesTaken(); n != orders {
		t.Errorf("ChargesTaken() = %d, want %d", n, orders)
	}
	if d := h.sim.DoubleCharged(); len(d) != 0 {
		t.Errorf("DoubleCharged() = %v", d)
	}
	if r := h.sim.Requests(); r[200] != orders*copies {
		t.Errorf("Requests() = %v", r)
	}
}
