package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The cost per event is the difference of the two readings over the
// events committed between them, not over all events committed.
func TestCostBetween(t *testing.T) {
	a := counters{at: t0, committed: 1000, cpu: 2.5, mallocs: 1e6, allocBytes: 4e8}
	b := counters{at: t0.Add(4 * time.Second), committed: 41000, cpu: 4.9, mallocs: 9e6, allocBytes: 8.096e8}
	c := costBetween(a, b)
	if c.Events != 40000 || c.Window != 4*time.Second {
		t.Fatalf("events %d, window %v; want 40000, 4s", c.Events, c.Window)
	}
	if got := c.CPUPerEvent(); got < 59.999 || got > 60.001 {
		t.Errorf("CPU per event = %v µs, want 60", got)
	}
	if got := c.AllocsPerEvent(); got != 200 {
		t.Errorf("allocs per event = %v, want 200", got)
	}
	if got := c.BytesPerEvent(); got != 10240 {
		t.Errorf("bytes per event = %v, want 10240", got)
	}
	if z := costBetween(a, a); z.CPUPerEvent() != 0 || z.AllocsPerEvent() != 0 {
		t.Errorf("no events: %v µs, %v allocs per event, want 0", z.CPUPerEvent(), z.AllocsPerEvent())
	}
}

// scrape reads the Go collector's allocation counters, and a /metrics
// page without them is an error naming the missing one.
func TestScrapeAllocCounters(t *testing.T) {
	page := "# TYPE go_memstats_mallocs_total counter\ngo_memstats_mallocs_total 12345\n" +
		"# TYPE go_memstats_alloc_bytes_total counter\ngo_memstats_alloc_bytes_total 6.5e+07\n" +
		"# TYPE billing_events_total counter\nbilling_events_total{result=\"charged\"} 7\n"
	serve := func(body string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, body) }))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	s, err := scrape(context.Background(), serve(page))
	if err != nil || s.Mallocs != 12345 || s.AllocBytes != 6.5e7 || s.Charged != 7 {
		t.Fatalf("scrape = %+v, %v; want 12345 mallocs, 6.5e7 bytes, 7 charged", s, err)
	}
	noAlloc := strings.Join(strings.Split(page, "\n")[:2], "\n") + "\n"
	if _, err := scrape(context.Background(), serve(noAlloc)); err == nil || !strings.Contains(err.Error(), "go_memstats_alloc_bytes_total") {
		t.Errorf("without go_memstats_alloc_bytes_total: %v, want an error naming it", err)
	}
}
