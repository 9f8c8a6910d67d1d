package payment

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/propagation"
)

// chargeNetHTTP is one attempt of Charge on the NetHTTP engine.
func (c *Client) chargeNetHTTP(ctx context.Context, ch Charge) (Result, string, error) {
	// The attempt's one deadline: it covers waiting for a connection,
	// sending, the answer's headers and reading its body.
	attemptCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	sent := newSends()
	attemptCtx = httptrace.WithClientTrace(attemptCtx, &sent.trace)
	req := c.request(attemptCtx, ctx, ch)
	res, code, err := c.do(ctx, attemptCtx, req)
	var pe *Error
	if errors.As(err, &pe) {
		pe.Conns = int(sent.conns.Load())
	}
	return res, code, err
}

// request builds the attempt's request from the template: the body and
// the Idempotency-Key come from ch alone, so every attempt for ch sends
// the same bytes. traceCtx is the context whose trace is propagated.
func (c *Client) request(attemptCtx, traceCtx context.Context, ch Charge) *http.Request {
	req := c.template.WithContext(attemptCtx)
	h := make(http.Header, 6)
	// Injected first, so that the headers set below win over anything a
	// propagator might write.
	if c.propagator != nil {
		c.propagator.Inject(traceCtx, propagation.HeaderCarrier(h))
	}
	// Canonical keys, set directly: Header.Set would canonicalise each.
	h["Content-Type"] = c.jsonType
	h["Accept"] = c.jsonType
	// Besides telling the provider, this header lets net/http itself replay
	// the request on a pooled connection the server had already closed.
	h["Idempotency-Key"] = []string{ch.IdempotencyKey}
	auth := c.auth
	if c.authorization != nil {
		auth = c.authorization()
	}
	if auth != nil {
		h["Authorization"] = auth
	}
	req.Header = h
	body := newRequestBody(ch)
	req.Body, req.GetBody, req.ContentLength = body.open(), body.reopen, int64(len(body.body))
	return req
}

// do sends req and reads the answer. code is the value for Observe.
func (c *Client) do(ctx, attemptCtx context.Context, req *http.Request) (Result, string, error) {
	// The Transport's RoundTrip, not http.Client.Do: with redirects
	// refused (ErrUseLastResponse), no jar and no Client.Timeout, Do only
	// added a copy of the headers for redirects that never happen and its
	// bookkeeping, 1.6 µs of the consumer's CPU per charge in the bench's
	// profiles. Its error wrapping, a *url.Error, is kept.
	resp, err := c.transport.RoundTrip(req)
	if err != nil {
		err = &url.Error{Op: "Post", URL: c.template.URL.String(), Err: err}
		return Result{}, "error", c.noAnswer(ctx, attemptCtx.Err() != nil, err)
	}
	buf := getBuffer()
	defer func() {
		// Drain so the connection goes back to the pool; past the limit,
		// closing drops the connection instead, which is cheaper.
		drain(resp.Body, maxResponseBody, buf)
		_ = resp.Body.Close()
		putBuffer(buf)
	}()
	code := c.code(resp.StatusCode)

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, _ := readAtMost(resp.Body, maxErrorBody, buf) // the status decides; the body only adds a code
		return Result{}, code, refused(resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	res := Result{
		Status:   resp.StatusCode,
		Replayed: strings.EqualFold(resp.Header.Get("Idempotent-Replayed"), "true"),
	}
	body, err := readAtMost(resp.Body, maxResponseBody+1, buf)
	if err != nil {
		// The status says charged, but the answer broke off. Retrying with
		// the same key is harmless and gets the stored answer, charge id
		// included, so treat it like any other lost answer.
		return Result{}, "error", c.noAnswer(ctx, attemptCtx.Err() != nil, fmt.Errorf("reading %d answer: %w", resp.StatusCode, err))
	}
	if len(body) <= maxResponseBody {
		res.ChargeID = chargeID(body)
	}
	return res, code, nil
}
