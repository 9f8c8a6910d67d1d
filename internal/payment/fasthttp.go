package payment

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
)

// fastClient is the FastHTTP engine: one fasthttp.HostClient for the
// provider's host, configured so that one Charge is one request on one
// connection.
//
// fasthttp re-sends a request on its own in HostClient.Do when an attempt
// fails and the request is idempotent (a POST is not, by its default
// rule) or RetryIfErr says so; here MaxIdemponentCallAttempts is 1 and
// RetryIfErr refuses every retry, so a request is written at most once and
// an error after that is returned as it is (an unknown outcome).
//
// "Surely not sent" is told by where an error arose: the dial and the TLS
// handshake run in dial, before fasthttp holds a connection, and their
// errors come back as a *connectError; every other error came from a
// connection the request may have been written to (Error.Conns 1).
type fastClient struct {
	hc  *fasthttp.HostClient
	uri string // the endpoint's absolute URL
}

// fastReadBuffer is the read buffer of a request in flight, which is
// also the largest response header fasthttp accepts (a larger one is a
// Transient error, as net/http's past its 64 KiB MaxResponseHeaderBytes):
// 8 KiB, nginx's default for a header. Not 64 KiB like net/http's limit:
// fasthttp's buffer is that size whatever the answer, one per call in
// flight (1024 by default), which took the bench's peak RSS from 124 to
// 187 MB.
const fastReadBuffer = 8 << 10

// newFastClient builds the FastHTTP engine for endpoint. A proxy chosen
// by cfg.Proxy for the endpoint is refused (fasthttp's HostClient dials
// the provider directly), so that switching engines never bypasses a proxy
// silently.
func newFastClient(cfg Config, endpoint *url.URL, tlsCfg *tls.Config, connect time.Duration, maxConns int) (*fastClient, error) {
	if cfg.Proxy != nil {
		req := &http.Request{Method: http.MethodPost, URL: endpoint, Header: http.Header{}}
		if p, err := cfg.Proxy(req); err != nil || p != nil {
			return nil, errors.New("payment: the fasthttp client cannot use a proxy (HTTPS_PROXY/HTTP_PROXY select one for the payment URL); use the nethttp client or NO_PROXY")
		}
	}
	isTLS := endpoint.Scheme == "https"
	addr := endpoint.Host
	if endpoint.Port() == "" {
		addr = net.JoinHostPort(endpoint.Hostname(), map[bool]string{false: "80", true: "443"}[isTLS])
	}
	if isTLS && tlsCfg.ServerName == "" {
		tlsCfg.ServerName = endpoint.Hostname() // tlsCfg is New's own copy
	}
	if isTLS {
		tlsCfg.NextProtos = []string{"http/1.1"} // fasthttp speaks HTTP/1.1 only: never let the provider pick h2
	}
	d := &fastDialer{connect: connect, tls: tlsCfg, net: net.Dialer{KeepAlive: 30 * time.Second}}
	hc := &fasthttp.HostClient{
		Addr:        addr,
		IsTLS:       isTLS,
		DialTimeout: d.dial,
		// Never a second write of a request: see fastClient.
		MaxIdemponentCallAttempts: 1,
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		MaxConns:                  maxConns,
		// Wait for a free connection as net/http does; the request's
		// deadline (DoDeadline) cuts the wait short.
		MaxConnWaitTimeout:  cfg.Timeout,
		MaxIdleConnDuration: 10 * time.Second,
		ReadBufferSize:      fastReadBuffer,
		// The body is read by fastClient.answer within the limits, as in
		// the NetHTTP engine: a 2xx body past the limit is still a success.
		StreamResponseBody:            true,
		DisablePathNormalizing:        true,
		DisableHeaderNamesNormalizing: false,
		SecureErrorLogMessage:         true,
	}
	return &fastClient{hc: hc, uri: endpoint.String()}, nil
}

// fastDialer opens the connections of the FastHTTP engine, TLS handshake
// included, so that any error before a connection exists is a
// *connectError.
type fastDialer struct {
	connect time.Duration
	tls     *tls.Config // nil for http
	net     net.Dialer
}

// connectError is the failure of a dial or a TLS handshake: no connection
// was had, so no byte of the request was written.
type connectError struct{ err error }

func (e *connectError) Error() string { return "connect: " + e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// dial is the HostClient's DialTimeout. timeout is what is left of the
// request's deadline, or 0 when fasthttp dials for a waiting request;
// either way the connect bound applies.
func (d *fastDialer) dial(addr string, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > d.connect {
		timeout = d.connect
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	raw, err := d.net.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &connectError{err}
	}
	if d.tls == nil {
		return &inStepConn{Conn: raw, raw: raw}, nil
	}
	conn := tls.Client(raw, d.tls)
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, &connectError{err}
	}
	return &tlsInStepConn{inStepConn{Conn: conn, raw: raw}}, nil
}

// errUnsolicited is the error of a pooled connection found readable (bytes
// the provider sent unasked, or its close) before a new request's first
// byte was written: nothing of the request was written.
var errUnsolicited = errors.New("the idle connection received bytes or was closed before the request was written")

// inStepConn keeps the HostClient's keep-alive connections in step, as
// net/http's idle read loop does: before the first byte of a request on a
// reused connection, it checks that nothing arrived since the last answer.
type inStepConn struct {
	net.Conn
	raw     net.Conn
	readNow bool // a Read since the last Write: the next Write starts a request
}

// tlsInStepConn keeps the Handshake method that tells fasthttp the
// connection is TLS already.
type tlsInStepConn struct{ inStepConn }

func (c *tlsInStepConn) Handshake() error { return c.Conn.(*tls.Conn).Handshake() }

func (c *inStepConn) Read(p []byte) (int, error) {
	c.readNow = true
	return c.Conn.Read(p)
}

func (c *inStepConn) Write(p []byte) (int, error) {
	if c.readNow {
		c.readNow = false
		if c.readable() {
			return 0, errUnsolicited
		}
	}
	return c.Conn.Write(p)
}

// readable peeks at the socket without blocking.
func (c *inStepConn) readable() bool {
	sc, ok := c.raw.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var one [1]byte
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		_, _, rerr = syscall.Recvfrom(int(fd), one[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return true
	}
	if rerr == syscall.EAGAIN {
		return false
	}
	return true // data (n > 0), the peer's close (n == 0) or an error: drop it
}

// fastCall is one request in flight, shared by Charge and the goroutine
// that sends it when Charge's ctx can be cancelled (fasthttp takes no
// context). state decides who releases req and resp: stateSending while
// the request is out, stateAnswered once the sender is done, stateAbandoned
// once Charge returned on a cancelled ctx without waiting.
type fastCall struct {
	req   *fasthttp.Request
	resp  *fasthttp.Response
	err   error
	state atomic.Int32
	done  chan struct{}
}

const (
	stateSending int32 = iota
	stateAnswered
	stateAbandoned
)

func (call *fastCall) release() {
	fasthttp.ReleaseRequest(call.req)
	fasthttp.ReleaseResponse(call.resp)
}

// deadlineSlack is how early fasthttp's timeout may fire before the
// caller's deadline and still be the caller's.
const deadlineSlack = 50 * time.Millisecond

// charge is one attempt of Charge on the FastHTTP engine; deadline is the
// attempt's. When ctx is cancelled before the answer's headers, Charge
// returns at once (Transient, ctx's error) and the request runs on until
// its answer or its deadline, unseen; the body, read after, is bounded by
// the deadline alone. A context that cannot be cancelled costs no
// goroutine.
func (f *fastClient) charge(c *Client, ctx context.Context, ch Charge, deadline time.Time) (Result, string, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, "error", c.noAnswer(ctx, false, err)
	}
	call := &fastCall{req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	f.build(c, ctx, call.req, ch)
	if ctx.Done() == nil {
		call.err = f.hc.DoDeadline(call.req, call.resp, deadline)
	} else {
		call.done = make(chan struct{}, 1)
		go func() {
			call.err = f.hc.DoDeadline(call.req, call.resp, deadline)
			if !call.state.CompareAndSwap(stateSending, stateAnswered) {
				call.release() // Charge has gone
				return
			}
			call.done <- struct{}{}
		}()
		select {
		case <-call.done:
		case <-ctx.Done():
			if call.state.CompareAndSwap(stateSending, stateAbandoned) {
				err := c.noAnswer(ctx, false, errors.New("the request may have been sent"))
				var pe *Error
				if errors.As(err, &pe) {
					pe.Conns = 1 // not known to be 0
				}
				return Result{}, "error", err
			}
			<-call.done // answered just now: use it
		}
	}
	defer call.release()
	if d, ok := ctx.Deadline(); ok && call.err != nil && !d.After(deadline) && time.Until(d) < deadlineSlack {
		// The caller's deadline cut the request (Charge made it the
		// request's; fasthttp's timer may fire a hair before it): its
		// context ends within deadlineSlack, and the error says so.
		<-ctx.Done()
	}
	res, code, err := f.answer(c, ctx, call.resp, call.err, deadline)
	var pe *Error
	if errors.As(err, &pe) {
		pe.Conns = 1
		var ce *connectError
		if errors.As(call.err, &ce) {
			pe.Conns = 0
		}
	}
	return res, code, err
}

// build fills req for ch: the body and the Idempotency-Key come from ch
// alone, so every attempt for ch sends the same bytes; traceCtx is the
// context whose trace is propagated.
func (f *fastClient) build(c *Client, traceCtx context.Context, req *fasthttp.Request, ch Charge) {
	req.SetRequestURI(f.uri)
	req.Header.SetMethod(http.MethodPost)
	// Injected first, so that the headers set below win over anything a
	// propagator might write.
	if c.propagator != nil {
		c.propagator.Inject(traceCtx, fastCarrier{&req.Header})
	}
	req.Header.SetContentType("application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Idempotency-Key", ch.IdempotencyKey)
	auth := c.auth
	if c.authorization != nil {
		auth = c.authorization()
	}
	req.Header.Del("Authorization")
	for _, v := range auth {
		req.Header.Add("Authorization", v)
	}
	var buf [maxBodyLen]byte
	req.SetBody(ch.appendBody(buf[:0])) // copied into req's own buffer
}

// answer classifies what DoDeadline left in resp and err, as the NetHTTP
// engine's do does with net/http's answer: err is an error before the
// status line and headers were read; the body is streamed and read
// within the same limits, so that a body cut off after the status is
// judged as there (a refusal stays a refusal, an acceptance without its
// body is an unknown outcome).
func (f *fastClient) answer(c *Client, ctx context.Context, resp *fasthttp.Response, err error, deadline time.Time) (Result, string, error) {
	if err != nil {
		return Result{}, "error", c.noAnswer(ctx, fastTimedOut(err, deadline), err)
	}
	body := resp.BodyStream()
	if body == nil { // no body at all (204, HEAD-like answers)
		body = strings.NewReader("")
	}
	buf := getBuffer()
	defer func() {
		// Drained so the connection is reused; past the limit, closing the
		// stream drops the connection instead.
		drain(body, maxResponseBody, buf)
		_ = resp.CloseBodyStream()
		putBuffer(buf)
	}()
	status := resp.StatusCode()
	code := c.code(status)
	if status < 200 || status > 299 {
		b, _ := readAtMost(body, maxErrorBody, buf) // the status decides; the body only adds a code
		return Result{}, code, refused(status, string(resp.Header.Peek("Retry-After")), b)
	}
	res := Result{Status: status, Replayed: strings.EqualFold(string(resp.Header.Peek("Idempotent-Replayed")), "true")}
	b, err := readAtMost(body, maxResponseBody+1, buf)
	if err != nil {
		// As in the NetHTTP engine: charged, but the answer broke off.
		return Result{}, "error", c.noAnswer(ctx, fastTimedOut(err, deadline), fmt.Errorf("reading %d answer: %w", status, err))
	}
	if len(b) <= maxResponseBody {
		res.ChargeID = chargeID(b)
	}
	return res, code, nil
}

// fastTimedOut reports whether err ended the attempt at its deadline.
func fastTimedOut(err error, deadline time.Time) bool {
	var timeout interface{ Timeout() bool }
	return errors.As(err, &timeout) && timeout.Timeout() || !time.Now().Before(deadline)
}

// fastCarrier is a propagation.TextMapCarrier over a fasthttp request's
// headers.
type fastCarrier struct{ h *fasthttp.RequestHeader }

var _ propagation.TextMapCarrier = fastCarrier{}

func (fc fastCarrier) Get(key string) string { return string(fc.h.Peek(key)) }
func (fc fastCarrier) Set(key, value string) { fc.h.Set(key, value) }
func (fc fastCarrier) Keys() []string {
	var keys []string
	for k := range fc.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}
