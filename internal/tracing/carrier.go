package tracing

import (
	"strings"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderCarrier adapts the headers of a Kafka record to
// propagation.TextMapCarrier, so that a propagator reads (Extract) and
// writes (Inject) the W3C traceparent and tracestate headers.
//
// Header keys are matched case-insensitively, like HTTP header names, since
// producers in other languages may spell them differently. Get returns the
// first matching header; Set replaces every matching header with one.
// A HeaderCarrier is not safe for concurrent use when Set is called.
type HeaderCarrier struct {
	// Headers are the record's headers; Set appends to or edits the slice
	// it points to. Get and Keys only read it.
	Headers *[]kafka.Header
}

var _ propagation.TextMapCarrier = HeaderCarrier{}

// Get returns the value of the first header named key, or "".
func (c HeaderCarrier) Get(key string) string {
	if c.Headers == nil {
		return ""
	}
	for _, h := range *c.Headers {
		if strings.EqualFold(h.Key, key) {
			return string(h.Value)
		}
	}
	return ""
}

// Set sets the header key to value, replacing any headers of that name so
// the record never carries two traceparents.
func (c HeaderCarrier) Set(key, value string) {
	if c.Headers == nil {
		return
	}
	hs := (*c.Headers)[:0:0]
	for _, h := range *c.Headers {
		if !strings.EqualFold(h.Key, key) {
			hs = append(hs, h)
		}
	}
	*c.Headers = append(hs, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the header names, in record order.
func (c HeaderCarrier) Keys() []string {
	if c.Headers == nil {
		return nil
	}
	keys := make([]string, 0, len(*c.Headers))
	for _, h := range *c.Headers {
		keys = append(keys, h.Key)
	}
	return keys
}
