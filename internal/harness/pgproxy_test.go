package harness

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestPGProxyCuts: the proxy forwards bytes both ways, CutShare kills live
// connections (sparing young ones) and counts them, and new connections are
// accepted after a cut.
func TestPGProxyCuts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // an echo server standing in for Postgres
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b := bufio.NewReader(c)
				line, _ := b.ReadString('\n')
				_, _ = c.Write([]byte(line))
				_, _ = b.ReadByte() // until the proxy closes
			}()
		}
	}()
	p, err := StartPGProxy(ln.Addr().String(), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("echo through the proxy: %q, %v", line, err)
		}
		return c
	}
	a, b := dial(), dial()
	if n := p.CutShare(1, time.Hour); n != 0 || p.Live() != 2 {
		t.Fatalf("cut %d young connections (%d live), want 0 of 2", n, p.Live())
	}
	if n := p.CutShare(1, 0); n != 2 || p.Cuts() != 2 {
		t.Fatalf("cut %d connections (%d counted), want 2", n, p.Cuts())
	}
	for _, c := range []net.Conn{a, b} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a cut connection still reads")
		}
	}
	dial() // accepted again
}
