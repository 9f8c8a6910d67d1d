package events

import (
	"bytes"
	"fmt"
	"strconv"
)

// maxDepth bounds the nesting of arrays and objects in a record (the
// top-level object is depth 1). Our fields are all scalars; the bound only
// keeps unknown fields from costing unbounded work.
const maxDepth = 32

// kind is the JSON type of a top-level member's value.
type kind uint8

const (
	kindAbsent kind = iota // the key did not appear
	kindNull
	kindBool
	kindNumber
	kindString
	kindObject
	kindArray
)

// member is the value of one known top-level key as scanRecord found it.
type member struct {
	kind kind
	// text is a string's decoded contents or a number's literal text; nil
	// for other kinds. It is a sub-slice of the record unless the string
	// had escapes.
	text []byte
}

// The known keys of a record, in the order Decode checks them.
const (
	fieldEventID = iota
	fieldEventType
	fieldOccurredAt
	fieldOrderID
	fieldCustomerID
	fieldTotalAmount
	numFields
)

// fieldNames are the exact (case-sensitive) JSON keys of the known fields.
var fieldNames = [numFields]string{"event_id", "event_type", "occurred_at", "order_id", "customer_id", "total_amount"}

// record holds the known top-level members of a record, by field index.
type record [numFields]member

// fieldIndex returns the index of an exactly matching known key, or -1.
func fieldIndex(key []byte) int {
	switch string(key) {
	case "event_id":
		return fieldEventID
	case "event_type":
		return fieldEventType
	case "occurred_at":
		return fieldOccurredAt
	case "order_id":
		return fieldOrderID
	case "customer_id":
		return fieldCustomerID
	case "total_amount":
		return fieldTotalAmount
	}
	return -1
}

// scanRecord reads value, which must be one JSON object, in a single pass
// and fills rec with its known top-level members. Nested values are
// checked for syntax and depth, then dropped; unknown keys are checked for
// duplicates, then dropped. value must be valid UTF-8 (Decode checks it
// first), so string contents are copied through unvalidated.
//
// It exists instead of json.Unmarshal into a struct because Unmarshal keeps
// the last of duplicate keys and matches keys case-insensitively: both would
// let {"total_amount":"1.00","TOTAL_AMOUNT":"9999.00"} charge an amount
// other readers of the record do not see. Here keys match exactly after
// unescaping (a differently cased key is an unknown field, ignored) and a
// repeated top-level key is an error. Numbers stay text, never float64.
// Escapes decode as encoding/json decodes them, a lone or broken UTF-16
// surrogate becoming U+FFFD, so "\ud800" and "\udc00" are the same key.
//
// Errors come in the order the bytes are read, so a record broken in two
// ways reports the first: what encoding/json's Decoder.Token, which this
// replaced, reported. Syntax errors say "malformed JSON" and the byte.
func scanRecord(value []byte, rec *record) *ValidationError {
	s := scanner{data: value}
	s.skipSpace()
	switch {
	case s.pos == len(s.data):
		return &ValidationError{Reason: "empty value"}
	case s.data[s.pos] == '{':
	case s.data[s.pos] == '[':
		return &ValidationError{Reason: "not a JSON object"}
	default:
		// A scalar is read to its end, so that a broken one is malformed.
		if _, verr := s.value(0); verr != nil {
			return verr
		}
		return &ValidationError{Reason: "not a JSON object"}
	}
	if verr := s.topObject(rec); verr != nil {
		return verr
	}
	// One record is one JSON value: trailing data means a producer bug or
	// two records glued together, either way not something to charge.
	s.skipSpace()
	if s.pos != len(s.data) {
		return &ValidationError{Reason: "data after the JSON object"}
	}
	return nil
}

// scanner is a position in a record being read.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// topObject reads the members of the record's object, whose '{' is at pos.
func (s *scanner) topObject(rec *record) *ValidationError {
	var unknown keySet
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == '}' {
		s.pos++
		return nil
	}
	for {
		key, verr := s.key(true)
		if verr != nil {
			return verr
		}
		// Before the colon, as Decoder.Token found it.
		i := fieldIndex(key)
		if i >= 0 && rec[i].kind != kindAbsent || i < 0 && unknown.add(key) {
			return &ValidationError{Reason: fmt.Sprintf("duplicate key %.64q", string(key))}
		}
		if verr := s.colon(); verr != nil {
			return verr
		}
		m, verr := s.value(1)
		if verr != nil {
			return verr
		}
		if i >= 0 {
			rec[i] = m
		}
		if done, verr := s.next('}', "after object key:value pair"); done || verr != nil {
			return verr
		}
	}
}

// key reads an object key, returning its decoded form when decode is set.
func (s *scanner) key(decode bool) ([]byte, *ValidationError) {
	s.skipSpace()
	if s.pos == len(s.data) {
		return nil, unexpectedEnd()
	}
	if s.data[s.pos] != '"' {
		return nil, s.syntax("looking for beginning of object key string")
	}
	return s.str(decode)
}

// colon reads the colon after an object key.
func (s *scanner) colon() *ValidationError {
	s.skipSpace()
	if s.pos == len(s.data) {
		return unexpectedEnd()
	}
	if s.data[s.pos] != ':' {
		return s.syntax("after object key")
	}
	s.pos++
	return nil
}

// next reads what follows a value in a container: a comma (done false) or
// the closing bracket (done true).
func (s *scanner) next(closing byte, context string) (done bool, verr *ValidationError) {
	s.skipSpace()
	switch {
	case s.pos == len(s.data):
		return false, unexpectedEnd()
	case s.data[s.pos] == ',':
		s.pos++
		return false, nil
	case s.data[s.pos] == closing:
		s.pos++
		return true, nil
	}
	return false, s.syntax(context)
}

// value reads one value; depth is the number of containers around it.
func (s *scanner) value(depth int) (member, *ValidationError) {
	s.skipSpace()
	if s.pos == len(s.data) {
		return member{}, unexpectedEnd()
	}
	switch c := s.data[s.pos]; {
	case c == '"':
		text, verr := s.str(depth == 1)
		return member{kindString, text}, verr
	case c == '{' || c == '[':
		if depth >= maxDepth {
			return member{}, &ValidationError{Reason: "nested deeper than 32 levels"}
		}
		k := kindArray
		if c == '{' {
			k = kindObject
		}
		return member{kind: k}, s.container(depth + 1)
	case c == 't':
		return member{kind: kindBool}, s.literal("true")
	case c == 'f':
		return member{kind: kindBool}, s.literal("false")
	case c == 'n':
		return member{kind: kindNull}, s.literal("null")
	case c == '-' || isDigit(c):
		text, verr := s.number()
		return member{kindNumber, text}, verr
	}
	return member{}, s.syntax("looking for beginning of value")
}

// container reads a nested object or array whose opening bracket is at
// pos; depth counts the open containers, this one included. The recursion
// is bounded by maxDepth.
func (s *scanner) container(depth int) *ValidationError {
	object := s.data[s.pos] == '{'
	closing, context := byte(']'), "after array element"
	if object {
		closing, context = '}', "after object key:value pair"
	}
	s.pos++
	s.skipSpace()
	if s.pos < len(s.data) && s.data[s.pos] == closing {
		s.pos++
		return nil
	}
	for {
		if object {
			if _, verr := s.key(false); verr != nil {
				return verr
			}
			if verr := s.colon(); verr != nil {
				return verr
			}
		}
		if _, verr := s.value(depth); verr != nil {
			return verr
		}
		if done, verr := s.next(closing, context); done || verr != nil {
			return verr
		}
	}
}

// number reads a number at pos, checking JSON's grammar, and returns its
// text.
func (s *scanner) number() ([]byte, *ValidationError) {
	start, d := s.pos, s.data
	i := start
	if d[i] == '-' {
		i++
	}
	digits := func(context string) *ValidationError {
		if i == len(d) {
			return unexpectedEnd()
		}
		if !isDigit(d[i]) {
			s.pos = i
			return s.syntax(context)
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
		return nil
	}
	if i < len(d) && d[i] == '0' {
		i++
	} else if verr := digits("in numeric literal"); verr != nil {
		return nil, verr
	}
	if i < len(d) && d[i] == '.' {
		i++
		if verr := digits("after decimal point in numeric literal"); verr != nil {
			return nil, verr
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if verr := digits("in exponent of numeric literal"); verr != nil {
			return nil, verr
		}
	}
	s.pos = i
	return d[start:i], nil
}

// literal reads word (true, false or null) at pos.
func (s *scanner) literal(word string) *ValidationError {
	for j := 0; j < len(word); j++ {
		if s.pos == len(s.data) {
			return unexpectedEnd()
		}
		if s.data[s.pos] != word[j] {
			return s.syntax(fmt.Sprintf("in literal %s (expecting %s)", word, quoteChar(word[j])))
		}
		s.pos++
	}
	return nil
}

// syntax reports the byte at pos as unexpected.
func (s *scanner) syntax(context string) *ValidationError {
	return &ValidationError{Reason: fmt.Sprintf("malformed JSON at byte %d: invalid character %s %s",
		s.pos, quoteChar(s.data[s.pos]), context)}
}

func unexpectedEnd() *ValidationError {
	return &ValidationError{Reason: "malformed JSON: unexpected end of input"}
}

// quoteChar formats c as encoding/json's syntax errors do.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}

// keySet holds the unknown top-level keys seen so far. The first few are
// compared in place, without allocating; a record with many keys moves
// to a map, which keeps a 64 KiB record of tiny keys linear.
type keySet struct {
	n    int
	few  [8][]byte
	many map[string]struct{}
}

// add adds k and reports whether it was already present.
func (ks *keySet) add(k []byte) (dup bool) {
	if ks.many != nil {
		if _, dup := ks.many[string(k)]; dup {
			return true
		}
		ks.many[string(k)] = struct{}{}
		return false
	}
	for _, f := range ks.few[:ks.n] {
		if bytes.Equal(f, k) {
			return true
		}
	}
	if ks.n < len(ks.few) {
		ks.few[ks.n] = k
		ks.n++
		return false
	}
	ks.many = make(map[string]struct{}, 4*len(ks.few))
	for _, f := range ks.few {
		ks.many[string(f)] = struct{}{}
	}
	ks.many[string(k)] = struct{}{}
	return false
}
