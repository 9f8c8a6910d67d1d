package payment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"
)

// chargeIDBodies are 2xx answers around the edges of scanChargeID's flat
// form, each of which must get decodeChargeID's (encoding/json's) answer.
var chargeIDBodies = []string{
	`{"charge_id":"ch_1"}`, `{"charge_id":"ch_1","status":"succeeded","amount":9990,"livemode":false,"x":null}`,
	` {"status" : "succeeded" ,  "charge_id" : "ch_1" } ` + "\n",
	`{"CHARGE_ID":"ch_up"}`, `{"Charge_Id":"ch_mixed"}`, `{"charge_id":"a","charge_id":"b"}`,
	`{"charge_id":"a","charge_id":null}`, `{"charge_id":null}`, `{"charge_id":12}`, `{"charge_id":true}`,
	`{"charge_id":"a","CHARGE_ID":1}`, `{"charge_id":"ch\n1"}`, `{"charge_id":"ch 1"}`, `{"charge_id":""}`,
	`{"charge_id":"` + strings.Repeat("a", maxChargeIDLen) + `"}`, `{"charge_id":"` + strings.Repeat("a", maxChargeIDLen+1) + `"}`,
	`{"charge_id":"ch_é"}`, `{"chargé_id":"x","charge_id":"y"}`, `{"charge_ıd":"x"}`, `{"charge_İd":"x"}`,
	`{"charge\u005fid":"esc"}`, `{"charge_id":"\u0063h_1"}`, `{"charge_id":"\ud800"}`, `{"chargeid":"x"}`,
	`{"charge_id":"ch_1","meta":{"charge_id":"inner"}}`, `{"charge_id":"ch_1","list":[1,2]}`,
	`{"charge_id":"ch_1",}`, `{"charge_id":"ch_1"} x`, `{"charge_id":"ch_1"}{}`, `{"charge_id":"ch_1"`,
	`{"charge_id" "ch_1"}`, `{"charge_id":01}`, `{"charge_id":"ch_1","n":01}`, `{"n":-}`, `{"n":1.}`, `{"n":1e}`,
	`{"n":-0.5e+7}`, `{"n":tru}`, `{"n":nul}`, `{"n":"\x01"}`, "{\"n\":\"\xff\",\"charge_id\":\"ch_1\"}",
	`{}`, ` { } `, ``, ` `, `null`, `"ch_1"`, `["ch_1"]`, `<html>ok</html>`, `{"charge_id":"ch_1"}` + "\x00",
}

func TestChargeIDMatchesEncodingJSON(t *testing.T) {
	for _, body := range chargeIDBodies {
		if got, want := chargeID([]byte(body)), decodeChargeID([]byte(body)); got != want {
			t.Errorf("chargeID(%q) = %q, encoding/json says %q", body, got, want)
		}
	}
}

// TestChargeIDFastPath checks that the answers a provider usually sends
// are read without encoding/json, which is the point of scanChargeID.
func TestChargeIDFastPath(t *testing.T) {
	for _, body := range []string{
		`{"charge_id":"ch_1"}`,
		`{"charge_id":"ch_1","status":"succeeded"}`,
		`{"id":"evt","charge_id":"ch_1","amount":"99.90","created":1764590400,"captured":true,"failure":null}`,
	} {
		if id, ok := scanChargeID([]byte(body)); !ok || string(id) != "ch_1" {
			t.Errorf("scanChargeID(%q) = %q, %v; want ch_1 without encoding/json", body, id, ok)
		}
	}
}

// FuzzChargeID checks that chargeID answers every 2xx body exactly as
// json.Unmarshal does: an answer that does not parse as before would record
// a charge without its id, or with another.
func FuzzChargeID(f *testing.F) {
	for _, body := range chargeIDBodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if got, want := chargeID(body), decodeChargeID(body); got != want {
			t.Errorf("chargeID(%q) = %q, encoding/json says %q", body, got, want)
		}
	})
}

// TestRequestBodyReopens checks that GetBody, which net/http uses to
// replay a request on a connection the server had closed, gives the same
// bytes as Charge.Body, also after the first reader was consumed.
func TestRequestBodyReopens(t *testing.T) {
	ch := testCharge()
	ch.OrderID, ch.CustomerID, ch.Amount = 1<<63-1, 1<<63-1, 10_000_000_000
	b := newRequestBody(ch)
	for i := range 3 {
		r, err := b.reopen()
		if i == 0 {
			r = b.open()
		}
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, ch.Body()) {
			t.Fatalf("read %d: %q, %v; want %q", i, got, err, ch.Body())
		}
	}
	if len(ch.Body()) > maxBodyLen {
		t.Errorf("the longest body is %d bytes, maxBodyLen %d", len(ch.Body()), maxBodyLen)
	}
}

func TestReadAtMost(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), 1000)
	for _, limit := range []int{0, 1, 4095, 4096, 4097, len(data), len(data) + 1} {
		buf := getBuffer()
		got, err := readAtMost(iotest.OneByteReader(bytes.NewReader(data)), limit, buf)
		if want := data[:min(limit, len(data))]; err != nil || !bytes.Equal(got, want) {
			t.Errorf("limit %d: %d bytes, %v; want %d", limit, len(got), err, len(want))
		}
		putBuffer(buf)
	}
	buf := getBuffer()
	defer putBuffer(buf)
	if got, err := readAtMost(iotest.TimeoutReader(bytes.NewReader(data)), len(data)+1, buf); err != iotest.ErrTimeout || len(got) == 0 {
		t.Errorf("broken reader: %d bytes, %v; want what was read and the error", len(got), err)
	}
}

// TestChargeReusesConnection checks keep-alive: sequential attempts share
// one connection whatever the answer (2xx with or without a body, errors
// with bodies), since every answer is read and drained before it is
// closed.
func TestChargeReusesConnection(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		var conns, n atomic.Int32
		answers := []struct {
			status int
			body   string
		}{
			{200, `{"charge_id":"ch_1"}`}, {201, `{"charge_id":"ch_2","meta":{"a":[1]}}`}, {204, ""},
			{503, `{"error":{"code":"unavailable"}}`}, {409, strings.Repeat(" ", 100<<10)},
			{200, `{"charge_id":"ch_3","pad":"` + strings.Repeat("x", 200<<10) + `"}`}, {402, `{"error":{"code":"card_declined"}}`},
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			a := answers[int(n.Add(1)-1)%len(answers)]
			w.WriteHeader(a.status)
			_, _ = io.WriteString(w, a.body)
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		c := newClient(t, srv.URL, nil)
		for i := range 3 * len(answers) {
			ch := testCharge()
			ch.IdempotencyKey = fmt.Sprintf("key-%d", i)
			_, _ = c.Charge(t.Context(), ch)
		}
		if got := conns.Load(); got != 1 {
			t.Errorf("%d attempts opened %d connections, want 1", n.Load(), got)
		}
	})
}

// writeCounter counts the writes made on the connections it dials.
type writeCounter struct {
	net.Conn
	writes *atomic.Int32
}

func (w writeCounter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	return w.Conn.Write(p)
}

// TestChargeOneWritePerRequest checks that headers and body leave in one
// write: net/http flushes the headers on their own unless it knows the
// body is in memory (io.NopCloser of a *bytes.Reader), which would cost
// every attempt a second syscall; fasthttp writes through one buffer.
func TestChargeOneWritePerRequest(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, `{"charge_id":"ch_1"}`)
		}))
		c := newClient(t, srv.URL, nil)
		var writes atomic.Int32
		wrapConns(c, func(conn net.Conn) net.Conn { return writeCounter{conn, &writes} })
		const attempts = 5
		for range attempts {
			if _, err := c.Charge(t.Context(), testCharge()); err != nil {
				t.Fatal(err)
			}
		}
		if n := writes.Load(); n != attempts {
			t.Errorf("%d attempts made %d writes, want one each", attempts, n)
		}
	})
}

// wrapConns makes c's engine pass every connection it dials through wrap.
func wrapConns(c *Client, wrap func(net.Conn) net.Conn) {
	if c.fast != nil {
		dial := c.fast.hc.DialTimeout
		c.fast.hc.DialTimeout = func(addr string, timeout time.Duration) (net.Conn, error) {
			conn, err := dial(addr, timeout)
			if err != nil {
				return nil, err
			}
			return wrap(conn), nil
		}
		return
	}
	tr := c.http.Transport.(*http.Transport)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(conn), nil
	}
}
