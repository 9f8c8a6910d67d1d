package payment

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// wireProvider is a raw HTTP/1.1 server, over TLS when a certificate is
// given, for the tests that must decide every byte a provider sends and
// when it closes or resets a connection: the not-taken tests
// (notsent_test.go) and the keep-alive tests (instep_test.go). serve is
// called for request i (from 0) on each connection, with the request read
// and its body drained, and writes whatever it likes; it returns false to
// close the connection. keys and conn record, in order, the
// Idempotency-Key of every request read and the connection it arrived on;
// closed is signalled whenever the provider closes a connection.
type wireProvider struct {
	url    string
	mu     sync.Mutex
	keys   []string
	conn   []int
	closed chan struct{}
}

// wireConn is one accepted connection: Conn is what to write to (the TLS
// connection when serving TLS), tcp the connection under it, n its number
// (from 0, in the order accepted).
type wireConn struct {
	net.Conn
	tcp *net.TCPConn
	n   int
}

// reset makes the connection's close an RST instead of a FIN.
func (c wireConn) reset() { _ = c.tcp.SetLinger(0) }

func startWire(t *testing.T, cert *tls.Certificate, serve func(c wireConn, i int, req *http.Request) bool) *wireProvider {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &wireProvider{url: "http://" + ln.Addr().String(), closed: make(chan struct{}, 64)}
	if cert != nil {
		p.url = "https://" + ln.Addr().String()
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for n := 0; ; n++ {
			tcp, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serveConn(wireConn{Conn: tcp, tcp: tcp.(*net.TCPConn), n: n}, cert, serve) })
		}
	})
	return p
}

func (p *wireProvider) serveConn(c wireConn, cert *tls.Certificate, serve func(c wireConn, i int, req *http.Request) bool) {
	defer func() { p.closed <- struct{}{} }()
	defer c.tcp.Close()
	_ = c.tcp.SetDeadline(time.Now().Add(30 * time.Second)) // a broken client must not hang the test
	if cert != nil {
		tc := tls.Server(c.tcp, &tls.Config{Certificates: []tls.Certificate{*cert}})
		if tc.Handshake() != nil {
			return
		}
		c.Conn = tc
	}
	br := bufio.NewReader(c.Conn)
	for i := 0; ; i++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		p.mu.Lock()
		p.keys = append(p.keys, req.Header.Get("Idempotency-Key"))
		p.conn = append(p.conn, c.n)
		p.mu.Unlock()
		if !serve(c, i, req) {
			return
		}
	}
}

// copies returns how many requests with key the provider read.
func (p *wireProvider) copies(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, k := range p.keys {
		if k == key {
			n++
		}
	}
	return n
}

// waitCopies waits up to d for a request with key, and returns copies.
func (p *wireProvider) waitCopies(key string, d time.Duration) int {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := p.copies(key); n > 0 {
			return n
		}
	}
	return p.copies(key)
}

// conns returns the connection of every request read, in order.
func (p *wireProvider) conns() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.conn...)
}

// rawOK is a complete 200 answer with a charge id.
const rawOK = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{\"charge_id\":\"ch_1\"}"
