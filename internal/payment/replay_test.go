package payment

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

// readRequest is what a test provider read of one request.
type readRequest struct {
	conn int
	key  string
	auth string
	body []byte
}

func (r readRequest) String() string {
	return fmt.Sprintf("{conn %d, key %q, body %q}", r.conn, r.key, r.body)
}

// replayProvider is a raw HTTP/1.1 provider that reads the second request
// on its first connection and then closes the connection without
// answering, as a provider that timed out an idle keep-alive connection
// would just as the request arrived. Every other request gets a 200, or,
// on a later connection, replayStatus when it is not 0.
func replayProvider(t *testing.T, replayStatus int) (url string, seen func() []readRequest) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reqs []readRequest
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				br := bufio.NewReader(conn)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					mu.Lock()
					reqs = append(reqs, readRequest{n, req.Header.Get("Idempotency-Key"), req.Header.Get("Authorization"), body})
					mu.Unlock()
					if n == 0 && i == 1 {
						return // read, then dropped: the client cannot know whether it was charged
					}
					status, answer := "200 OK", `{"charge_id":"ch_`+strconv.Itoa(n)+"_"+strconv.Itoa(i)+`"}`
					if n > 0 && replayStatus != 0 {
						status, answer = fmt.Sprintf("%d %s", replayStatus, http.StatusText(replayStatus)), `{"error":{"code":"no_route"}}`
					}
					if _, err := fmt.Fprintf(conn, "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, len(answer), answer); err != nil {
						return
					}
				}
			})
		}
	})
	return "http://" + ln.Addr().String(), func() []readRequest {
		mu.Lock()
		defer mu.Unlock()
		return append([]readRequest(nil), reqs...)
	}
}

// TestConnectionReplaySendsTheSameRequest checks net/http's own replay of
// a request on a reused connection the server closed: the Idempotency-Key
// header (set under its canonical key) lets net/http resend the POST, and
// GetBody must give it the same bytes. Whether or not net/http replays,
// every copy the provider read must carry the charge's key and body.
// fasthttp must not replay at all (its retries are off): the provider
// reads one copy, and the attempt is an unknown outcome on one
// connection.
func TestConnectionReplaySendsTheSameRequest(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		url, seen := replayProvider(t, 0)
		c := newClient(t, url, nil)
		first := testCharge()
		if _, err := c.Charge(t.Context(), first); err != nil {
			t.Fatalf("first charge: %v", err)
		}
		second := testCharge()
		second.IdempotencyKey, second.OrderID, second.Amount = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1e", 1002, 12345
		res, err := c.Charge(t.Context(), second)
		reqs := seen()
		if len(reqs) != replayedReads(t) {
			t.Fatalf("provider read %d requests %v, want %d", len(reqs), reqs, replayedReads(t))
		}
		if engineOf(t) == FastHTTP {
			e := mustPaymentError(t, err)
			if e.Kind != fault.Transient || e.Status != 0 || e.Conns != 1 || e.NotTaken() {
				t.Errorf("second charge: %+v (%v); want Transient, no status, one connection, not NotTaken", e, err)
			}
		} else if err != nil || res.ChargeID != "ch_1_0" {
			t.Errorf("second charge: %+v, %v; want the replay's answer ch_1_0", res, err)
		}
		for i, r := range reqs {
			want := first
			if i > 0 {
				want = second
			}
			if r.key != want.IdempotencyKey || !bytes.Equal(r.body, want.Body()) || r.auth != "Bearer "+testToken {
				t.Errorf("request %d on connection %d: key %q, auth %q, body %q; want key %q, body %q",
					i, r.conn, r.key, r.auth, r.body, want.IdempotencyKey, want.Body())
			}
		}
		if len(reqs) == 3 && (reqs[1].conn != 0 || reqs[2].conn != 1) {
			t.Errorf("connections %d, %d: want the replay on a new connection", reqs[1].conn, reqs[2].conn)
		}
	})
}

// replayedReads is how many requests replayProvider reads for a warm-up
// charge and a second one whose first copy it drops: net/http replays the
// second (3), fasthttp must not (2).
func replayedReads(t *testing.T) int {
	if engineOf(t) == NetHTTP {
		return 3
	}
	return 2
}

// A refusal that answers net/http's silent replay proves nothing about
// the copy the provider read first: the connection died after the request
// was written, so that copy may have been charged. Whatever the replay is
// told — a gateway's 404 or 400, a 401 or a 407 — the attempt's outcome is
// unknown: NotTaken must be false, or the claim's creator would release it.
func TestRefusalOfAReplayIsNotNotTaken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		for _, status := range []int{http.StatusNotFound, http.StatusBadRequest, http.StatusUnauthorized, http.StatusProxyAuthRequired} {
			t.Run(strconv.Itoa(status), func(t *testing.T) {
				url, seen := replayProvider(t, status)
				c := newClient(t, url, nil)
				if _, err := c.Charge(t.Context(), testCharge()); err != nil {
					t.Fatalf("warm-up charge: %v", err)
				}
				second := testCharge()
				second.IdempotencyKey = "0193a5c2-7f4e-7b1a-9c3d-2e4f6a8b0c1e"
				_, err := c.Charge(t.Context(), second)
				if n := len(seen()); n != replayedReads(t) {
					t.Fatalf("provider read %d requests, want %d", n, replayedReads(t))
				}
				var pe *Error
				if !errors.As(err, &pe) {
					t.Fatalf("charge: %v; want a *payment.Error", err)
				}
				t.Logf("the replay's answer: %v", err)
				if pe.NotTaken() {
					t.Errorf("%d to a silent replay: NotTaken() = true; want false (the first copy may have been charged)", status)
				}
			})
		}
	})
}
