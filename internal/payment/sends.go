package payment

import (
	"net/http/httptrace"
	"sync/atomic"
)

// sends counts the connections net/http hands one attempt's request to.
// It writes a request at most once per connection, and hands it to a
// second one only to replay it: a request with an Idempotency-Key (and
// GetBody) counts as replayable for its Transport, which re-sends it
// without telling the caller when a reused keep-alive connection dies
// after the request was written (HTTP/2 likewise retries on a new
// connection). So more than one connection means the provider may have
// read an earlier copy, whatever the last one was answered; see
// Error.NotTaken.
type sends struct {
	conns atomic.Int32
	trace httptrace.ClientTrace
}

func newSends() *sends {
	s := &sends{}
	s.trace.GotConn = s.gotConn
	return s
}

func (s *sends) gotConn(httptrace.GotConnInfo) { s.conns.Add(1) }
