package payment

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"sync"
)

// requestBody is the body of one attempt: Charge.Body's bytes, built in
// place. It is a *bytes.Reader behind io.NopCloser on purpose: net/http
// recognises that as in memory and writes headers and body in one go,
// where any other reader makes it flush the headers first (one more write
// per request). It is not pooled: net/http may still read a request body
// after Do returned (an early answer while the body is being written), so a
// reused buffer could send one charge's bytes under another's key.
type requestBody struct {
	r    bytes.Reader
	body []byte // Charge.Body's bytes, in buf
	buf  [maxBodyLen]byte
}

// maxBodyLen bounds Charge.Body: two 19-digit ids, the longest amount and
// the fixed text come to 90 bytes.
const maxBodyLen = 96

func newRequestBody(ch Charge) *requestBody {
	b := new(requestBody)
	b.body = ch.appendBody(b.buf[:0])
	b.r.Reset(b.body)
	return b
}

// open returns the body to send.
func (b *requestBody) open() io.ReadCloser { return io.NopCloser(&b.r) }

// reopen is the request's GetBody: a fresh reader of the same bytes, for
// net/http's replay on a connection the server had closed.
func (b *requestBody) reopen() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(b.body)), nil
}

// buffers holds the buffers answers are read into; one is taken per
// attempt and returned when the answer is closed.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxPooledBuffer keeps a buffer grown by an unusually large answer out of
// the pool.
const maxPooledBuffer = 64 << 10

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooledBuffer {
		*b = (*b)[:0]
		buffers.Put(b)
	}
}

// readAtMost reads r into *buf until EOF or limit bytes, like
// io.ReadAll(io.LimitReader(r, limit)): what was read, and the error that
// stopped it other than EOF. The result aliases *buf.
func readAtMost(r io.Reader, limit int, buf *[]byte) ([]byte, error) {
	b := (*buf)[:0]
	for len(b) < limit {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):min(cap(b), limit)])
		b = b[:len(b)+n]
		if err != nil {
			*buf = b
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
	*buf = b
	return b, nil
}

// drain reads and drops up to limit more bytes of r, using *buf as scratch.
func drain(r io.Reader, limit int, buf *[]byte) {
	b := (*buf)[:cap(*buf)]
	if len(b) == 0 {
		b = make([]byte, 4<<10)
	}
	for limit > 0 {
		n, err := r.Read(b[:min(len(b), limit)])
		limit -= n
		if err != nil {
			return
		}
	}
}

// chargeID returns the charge_id of a 2xx body, or "" when the body is
// empty, not JSON, or the id is not a plausible identifier. It answers
// exactly as json.Unmarshal into struct{ ChargeID string
// `json:"charge_id"` } would (decodeChargeID): the common flat answer is
// read by scanChargeID without encoding/json, anything else by
// decodeChargeID itself.
func chargeID(body []byte) string {
	id, ok := scanChargeID(body)
	if !ok {
		return decodeChargeID(body)
	}
	if len(id) > maxChargeIDLen || !visibleASCII(string(id)) {
		return ""
	}
	return string(id)
}

// decodeChargeID is chargeID through encoding/json: the reference, and the
// reader of every answer scanChargeID leaves to it.
func decodeChargeID(body []byte) string {
	var v struct {
		ChargeID string `json:"charge_id"`
	}
	if json.Unmarshal(body, &v) != nil || len(v.ChargeID) > maxChargeIDLen || !visibleASCII(v.ChargeID) {
		return ""
	}
	return v.ChargeID
}

// scanChargeID reads a flat JSON object: keys of printable ASCII without
// escapes, values that are such strings (any bytes but '"', '\\' and
// controls), numbers, true, false or null, nothing after it but
// whitespace. For such a body it returns what json.Unmarshal would leave in
// the ChargeID field, and ok: the raw text of the last string value whose
// key equals "charge_id" ignoring ASCII case (encoding/json's match; a
// null leaves the field alone), or nil. A number or boolean there is a
// type error for json.Unmarshal, so id is nil (no charge id) as well.
// Anything else (nesting, escapes, non-ASCII keys, bad syntax) returns ok
// false: the caller asks encoding/json, so an unusual answer is judged
// exactly as before.
func scanChargeID(body []byte) (id []byte, ok bool) {
	s := answerScanner{b: body}
	if !s.skip('{') {
		return nil, false
	}
	if s.skip('}') {
		return nil, s.end()
	}
	typeErr := false
	for {
		key, ok := s.str(true)
		if !ok || !s.skip(':') {
			return nil, false
		}
		match := len(key) == len("charge_id") && strings.EqualFold(string(key), "charge_id")
		s.space()
		switch c := s.peek(); {
		case c == '"':
			v, ok := s.str(false)
			if !ok {
				return nil, false
			}
			if match {
				id = v
			}
		case c == 'n':
			if !s.word("null") {
				return nil, false
			}
		case c == 't' || c == 'f':
			if !s.word("true") && !s.word("false") {
				return nil, false
			}
			typeErr = typeErr || match
		default:
			if !s.number() {
				return nil, false
			}
			typeErr = typeErr || match
		}
		if s.skip('}') {
			break
		}
		if !s.skip(',') {
			return nil, false
		}
	}
	if !s.end() {
		return nil, false
	}
	if typeErr {
		return nil, true
	}
	return id, true
}

// answerScanner is a position in a 2xx body being read by scanChargeID.
type answerScanner struct {
	b []byte
	i int
}

func (s *answerScanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *answerScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// skip consumes whitespace and then c, reporting whether c was there.
func (s *answerScanner) skip(c byte) bool {
	s.space()
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

// end reports whether only whitespace is left.
func (s *answerScanner) end() bool {
	s.space()
	return s.i == len(s.b)
}

// word consumes the literal w.
func (s *answerScanner) word(w string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(w)) {
		return false
	}
	s.i += len(w)
	return true
}

// str reads a string without escapes or control characters and returns
// its contents; asciiKey also refuses bytes outside printable ASCII.
func (s *answerScanner) str(asciiKey bool) ([]byte, bool) {
	s.space()
	if s.peek() != '"' {
		return nil, false
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:j], true
		case c == '\\' || c < 0x20 || asciiKey && c > 0x7e:
			return nil, false
		}
	}
	return nil, false
}

// number consumes a number in JSON's grammar.
func (s *answerScanner) number() bool {
	digits := func() bool {
		n := s.i
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
		}
		return s.i > n
	}
	if s.peek() == '-' {
		s.i++
	}
	if s.peek() == '0' {
		s.i++
	} else if !digits() {
		return false
	}
	if s.peek() == '.' {
		s.i++
		if !digits() {
			return false
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !digits() {
			return false
		}
	}
	return true
}
