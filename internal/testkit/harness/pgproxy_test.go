package harness

import (
	"context"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billing-consumer/billing-consumer/internal/testkit/pgtest"
)

// TestPGProxy runs real Postgres sessions through the proxy: statements
// pass both ways (simple and prepared), the Tap cuts a connection before
// the statement it names reaches the server, CutShare kills live
// connections (sparing young ones) and counts them, and new connections
// are accepted after a cut.
func TestPGProxy(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := StartPGProxy(u.Host, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err := p.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	connect := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, proxied)
		if err != nil {
			t.Fatalf("connect through the proxy: %v", err)
		}
		t.Cleanup(func() { c.Close(context.Background()) })
		return c
	}
	c := connect()
	if _, err := c.Exec(ctx, "CREATE TABLE t (n int)"); err != nil {
		t.Fatal(err)
	}
	var tapped atomic.Int32
	p.SetTap(func(sql string) bool {
		if strings.HasPrefix(sql, "INSERT INTO t") {
			tapped.Add(1)
			return true
		}
		return false
	})
	if _, err := c.Exec(ctx, "INSERT INTO t VALUES ($1)", 1); err == nil {
		t.Fatal("the tapped insert succeeded")
	}
	p.SetTap(nil)
	var n int
	if err := connect().QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 0 || tapped.Load() != 1 || p.Cuts() != 1 {
		t.Fatalf("after the tap: %d rows (%v), tapped %d, cuts %d; want 0 rows, 1 tap, 1 cut", n, err, tapped.Load(), p.Cuts())
	}

	a, b := connect(), connect()
	if got := p.CutShare(1, time.Hour); got != 0 {
		t.Fatalf("cut %d young connections, want 0", got)
	}
	live := p.Live()
	if got := p.CutShare(1, 0); got != live || p.Cuts() != 1+live {
		t.Fatalf("cut %d of %d live connections (%d counted)", got, live, p.Cuts())
	}
	for _, c := range []*pgx.Conn{a, b} {
		if err := c.Ping(ctx); err == nil {
			t.Fatal("a cut connection still answers")
		}
	}
	if err := connect().Ping(ctx); err != nil {
		t.Fatalf("a new connection after the cut: %v", err)
	}
}

// TestPGProxyDown checks SetDown against a real Postgres: a session open
// when the proxy goes down dies, a new one is refused while it is down,
// and sessions work again once it is up.
func TestPGProxyDown(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := StartPGProxy(u.Host, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	proxied, err := p.URL(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open, err := pgx.Connect(ctx, proxied)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close(ctx)
	p.SetDown(true)
	if _, err := open.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a session open when the proxy went down still works")
	}
	if c, err := pgx.Connect(ctx, proxied); err == nil {
		c.Close(ctx)
		t.Error("a new session was accepted while the proxy is down")
	}
	p.SetDown(false)
	c, err := pgx.Connect(ctx, proxied)
	if err != nil {
		t.Fatalf("after SetDown(false): %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("after SetDown(false): %v", err)
	}
}
