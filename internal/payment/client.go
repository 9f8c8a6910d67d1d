// Package payment is the HTTP client of the payment provider (SPEC §5). One
// call to Client.Charge is one attempt: it posts the charge and classifies
// the answer into a fault.Kind that tells the caller whether to record the
// charge, retry, pause or dead-letter the event.
//
// The HTTP library is Config.Engine's: net/http or fasthttp, with the same
// promises (and the same tests, run against both).
//
// Charging exactly once rests on the caller retrying with the same Charge:
// the same Idempotency-Key and byte-identical body let the provider replay
// its stored answer instead of charging again. Whenever the outcome of an
// attempt is unknown (timeout, reset, truncated answer) the error is
// Transient: retried, never assumed to have failed or succeeded.
package payment

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/billing-consumer/billing-consumer/internal/fault"
)

const (
	// maxResponseBody bounds what is read of an answer; a larger 2xx body is
	// still a success, without a charge id.
	maxResponseBody = 1 << 20
	// maxErrorBody bounds what is read of an error answer to find its code.
	maxErrorBody = 64 << 10
	// maxChargeIDLen bounds the charge id stored in the ledger.
	maxChargeIDLen = 255
	// defaultMaxConns is used when Config.MaxConns is zero.
	defaultMaxConns = 16
	// maxConnectTimeout bounds dialing and the TLS handshake, so that a
	// long Timeout does not let one unreachable address eat all of it.
	maxConnectTimeout = 10 * time.Second
)

// Engine is the HTTP client library a Client sends charges with. Both keep
// the same promises (one attempt per Charge, no replay of their own, the
// same classification, deadline, limits, TLS, token, trace and metrics);
// they differ in CPU per request and in what they support around it.
type Engine string

const (
	// NetHTTP is net/http's Transport: HTTP/1.1 or HTTP/2 (negotiated over
	// TLS), a proxy from Config.Proxy. It replays a request on its own when
	// a reused connection dies (see sends.go), which Error.Conns reports.
	NetHTTP Engine = "nethttp"
	// FastHTTP is github.com/valyala/fasthttp's HostClient, HTTP/1.1 only,
	// with its retries switched off: exactly one connection per attempt
	// (fasthttp.go). It refuses a Config.Proxy that selects a proxy.
	FastHTTP Engine = "fasthttp"
)

// Config configures a Client. BaseURL and Timeout are required.
type Config struct {
	// Engine selects the HTTP client library; "" means NetHTTP.
	Engine Engine
	// BaseURL is the provider's absolute http or https URL, optionally with
	// a path prefix; a trailing slash is tolerated. It must not carry
	// credentials (use Token), a query or a fragment.
	BaseURL string
	// Token, when set, is sent as "Authorization: Bearer <Token>". It is
	// never written to errors.
	Token string
	// Authorization, when set, is called for each request and returns its
	// Authorization header value (nil: none), instead of Token: a token
	// that changes while the client runs (FileToken.Header). It must be
	// cheap, safe for concurrent use, and never modify what it returned.
	Authorization func() []string
	// Timeout bounds one attempt as a whole: waiting for a connection,
	// dialing, TLS, sending, the response headers and reading the body.
	Timeout time.Duration
	// MaxConns caps the connections kept and opened to the provider; size it
	// to the number of concurrent Charge calls. Zero means 16.
	MaxConns int
	// Observe, when set, is called once per attempt with the HTTP status as
	// a decimal string, or "error" when no usable answer arrived, and the
	// attempt's duration. It must be safe for concurrent use.
	Observe func(code string, elapsed time.Duration)
	// TLS is the client TLS configuration for an https BaseURL (it is
	// cloned; nil means system roots). MinVersion below TLS 1.2 is refused;
	// zero means TLS 1.2.
	TLS *tls.Config
	// Proxy selects a proxy per request, e.g. http.ProxyFromEnvironment as
	// chosen by cmd; nil means direct connections. (internal/ never reads
	// the environment itself.)
	Proxy func(*http.Request) (*url.URL, error)
	// Propagator, when set, writes the trace context of Charge's ctx into
	// the request headers (traceparent, tracestate for W3C), so the
	// provider's work joins the record's trace. Nil sends none. It never
	// changes the body, the Idempotency-Key or the Authorization header.
	Propagator propagation.TextMapPropagator
	// Tracer, when set, starts a "payment.charge" client span per attempt,
	// a child of the span in Charge's ctx; nil starts none.
	Tracer trace.Tracer
}

// Client posts charges to the provider. It is safe for concurrent use by
// multiple goroutines and should be shared: it owns one connection pool
// (an http.Client's or a fasthttp.HostClient's) sized by Config.MaxConns.
type Client struct {
	// fast is the FastHTTP engine; nil for NetHTTP, which uses template
	// and http.
	fast *fastClient
	// template is the request every attempt copies: method, URL (shared,
	// never modified) and protocol. Header, Body, GetBody and ContentLength
	// are the attempt's own.
	template *http.Request
	// auth is the full Authorization header value, nil without a token; it
	// and jsonType are shared by every request's header map and never
	// written to (net/http only reads request headers).
	auth          []string
	authorization func() []string // Config.Authorization; nil: auth
	jsonType      []string
	timeout       time.Duration
	observe       func(string, time.Duration)
	// http owns transport (its idle connections); an attempt is a
	// transport.RoundTrip (see do).
	http      *http.Client
	transport http.RoundTripper
	// propagator is nil when no trace context is sent; tracer is nil when
	// no span is started.
	propagator propagation.TextMapPropagator
	tracer     trace.Tracer
	path       string // the endpoint's path, for spans
	// codes are the decimal forms of statuses 100-599, for Observe.
	codes [500]string
}

// Result is the provider's acceptance of a charge.
type Result struct {
	// ChargeID is the provider's charge id from the 2xx body, or "" when the
	// body did not carry a usable one. The money was taken either way.
	ChargeID string
	// Status is the 2xx status answered.
	Status int
	// Replayed reports that the provider answered from its stored result
	// for this key (header Idempotent-Replayed: true): an earlier attempt
	// had already charged.
	Replayed bool
}

// New validates cfg and builds a Client. The error names the offending field
// and never contains the token or the URL (which could hold secrets).
func New(cfg Config) (*Client, error) {
	endpoint, err := chargeURL(cfg.BaseURL)
	if err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		return nil, errors.New("payment: timeout must be positive")
	}
	if cfg.MaxConns < 0 {
		return nil, errors.New("payment: max conns must not be negative")
	}
	if cfg.Token != "" && !visibleASCII(cfg.Token) {
		return nil, errors.New("payment: token has characters not allowed in an HTTP header (spaces, control or non-ASCII)")
	}
	maxConns := cfg.MaxConns
	if maxConns == 0 {
		maxConns = defaultMaxConns
	}
	var tlsCfg *tls.Config
	if endpoint.Scheme == "https" {
		if tlsCfg, err = clientTLS(cfg.TLS); err != nil {
			return nil, err
		}
	}
	connect := min(cfg.Timeout, maxConnectTimeout)
	c := &Client{
		jsonType:   []string{"application/json"},
		timeout:    cfg.Timeout,
		observe:    cfg.Observe,
		propagator: cfg.Propagator,
		tracer:     cfg.Tracer,
		path:       "/" + strings.TrimPrefix(endpoint.EscapedPath(), "/"),
	}
	switch cfg.Engine {
	case "", NetHTTP:
		err = c.setupNetHTTP(cfg, endpoint, tlsCfg, connect, maxConns)
	case FastHTTP:
		c.fast, err = newFastClient(cfg, endpoint, tlsCfg, connect, maxConns)
	default:
		err = errors.New("payment: unknown client engine (want nethttp or fasthttp)")
	}
	if err != nil {
		return nil, err
	}
	if cfg.Token != "" {
		c.auth = []string{"Bearer " + cfg.Token}
	}
	c.authorization = cfg.Authorization
	for i := range c.codes {
		c.codes[i] = strconv.Itoa(100 + i)
	}
	return c, nil
}

// setupNetHTTP builds the NetHTTP engine: the Transport and the request
// template.
func (c *Client) setupNetHTTP(cfg Config, endpoint *url.URL, tlsCfg *tls.Config, connect time.Duration, maxConns int) error {
	dialer := &net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}
	// No ResponseHeaderTimeout: the attempt's context deadline in Charge
	// bounds the whole attempt, headers and body, and is the one timer a
	// request costs. The dial and handshake bounds apply to a new
	// connection only.
	transport := &http.Transport{
		Proxy:               cfg.Proxy,
		DialContext:         dialer.DialContext,
		TLSClientConfig:     tlsCfg,
		TLSHandshakeTimeout: connect,
		// A connection unused this long is closed (two goroutines each):
		// a burst at BILLING_CONCURRENCY leaves that many, and an idle
		// replica keeps none for long.
		IdleConnTimeout:        15 * time.Second,
		MaxIdleConns:           maxConns,
		MaxIdleConnsPerHost:    maxConns,
		MaxConnsPerHost:        maxConns,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      true,
	}
	// Built as every request used to be, so its URL, Host and protocol are
	// exactly NewRequest's.
	template, err := http.NewRequest(http.MethodPost, endpoint.String(), nil)
	if err != nil { // endpoint was validated in New: a bug
		return fmt.Errorf("payment: building the request: %w", err)
	}
	c.template, c.transport = template, transport
	c.http = &http.Client{
		Transport: transport,
		// No Client.Timeout: the per-attempt context in Charge covers
		// the whole attempt including the body, and lets us tell our
		// timeout apart from the caller's cancellation.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return nil
}

// chargeURL validates the base URL and joins the charge path to it.
func chargeURL(base string) (*url.URL, error) {
	if base == "" {
		return nil, errors.New("payment: base URL is empty")
	}
	u, err := url.Parse(base)
	if err != nil {
		// url's errors quote parts of the URL, which may hold secrets.
		return nil, errors.New("payment: base URL does not parse")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, errors.New("payment: base URL must be an absolute http or https URL")
	case u.Host == "" || u.Opaque != "":
		return nil, errors.New("payment: base URL has no host")
	case u.User != nil:
		return nil, errors.New("payment: base URL must not carry credentials; use the token")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, errors.New("payment: base URL must not have a query or fragment")
	}
	return u.JoinPath("payments", "charge"), nil
}

// clientTLS returns a copy of cfg with MinVersion at least TLS 1.2.
func clientTLS(cfg *tls.Config) (*tls.Config, error) {
	if cfg == nil {
		return &tls.Config{MinVersion: tls.VersionTLS12}, nil
	}
	c := cfg.Clone()
	switch {
	case c.MinVersion == 0:
		c.MinVersion = tls.VersionTLS12
	case c.MinVersion < tls.VersionTLS12:
		return nil, errors.New("payment: TLS MinVersion below TLS 1.2")
	}
	return c, nil
}

// CloseIdleConnections closes the pooled idle connections; call it at
// shutdown after the last Charge. It is safe for concurrent use.
func (c *Client) CloseIdleConnections() {
	if c.fast != nil {
		c.fast.hc.CloseIdleConnections()
		return
	}
	c.http.CloseIdleConnections()
}

// Charge makes one attempt to take ch and never retries by itself: the
// caller retries with the same ch. Concurrent calls are safe.
//
// On a 2xx answer it returns the Result and nil. Otherwise it returns an
// error carrying a *Error and a fault.Kind:
//   - Transient: 409, 408, 429, 5xx, 1xx, or no usable answer (network
//     error, timeout, reset, truncated body): retry with backoff, honouring
//     Error.RetryAfter;
//   - Conflict: 422, the key was used with another body;
//   - Permanent: any other 4xx (400, 402, 404, ...);
//   - Systemic: 401, 403, 407 or a 3xx, or the provider's certificate
//     failing verification (see tlsRejected), a configuration problem:
//     pause;
//   - Invalid: ch itself is invalid (no request is sent).
//
// When ctx is cancelled the error also satisfies errors.Is(err,
// context.Canceled) (or context.DeadlineExceeded for the caller's deadline).
func (c *Client) Charge(ctx context.Context, ch Charge) (Result, error) {
	if err := ch.validate(); err != nil {
		return Result{}, (&Error{Kind: fault.Invalid, Err: fmt.Errorf("invalid charge: %w", err)}).wrap()
	}
	// Without a tracer no span is started: a no-op tracer's span would
	// carry ctx's span context unchanged, so the propagator injects the
	// same traceparent either way.
	var span trace.Span
	if c.tracer != nil {
		ctx, span = c.startSpan(ctx)
		defer span.End()
	}
	start := time.Now()
	var (
		res  Result
		code string
		err  error
	)
	if c.fast != nil {
		// fasthttp takes no context: its deadline is ctx's too, so that no
		// request leaves after the caller's deadline (billing records that
		// deadline before it sends, SPEC §11 I5).
		deadline := start.Add(c.timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		res, code, err = c.fast.charge(c, ctx, ch, deadline)
	} else {
		res, code, err = c.chargeNetHTTP(ctx, ch)
	}
	if c.observe != nil {
		c.observe(code, time.Since(start))
	}
	if span != nil {
		endSpan(span, code, err)
	}
	return res, err
}

// code returns status in decimal, as Observe takes it.
func (c *Client) code(status int) string {
	if status >= 100 && status < 100+len(c.codes) {
		return c.codes[status-100]
	}
	return strconv.Itoa(status)
}

// noAnswer builds the Transient error of an attempt whose outcome is
// unknown (or the Systemic one of a TLS handshake we refused); timedOut
// reports that the attempt's own deadline had passed.
func (c *Client) noAnswer(ctx context.Context, timedOut bool, err error) error {
	switch {
	case ctx.Err() != nil:
		if !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	case timedOut:
		err = fmt.Errorf("no answer within %s: %w", c.timeout, err)
	case tlsRejected(err):
		return (&Error{Kind: fault.Systemic, Err: err}).wrap()
	}
	return (&Error{Kind: fault.Transient, Err: err}).wrap()
}
