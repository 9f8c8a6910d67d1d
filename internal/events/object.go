package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// maxDepth bounds the nesting of arrays and objects in a record (the
// top-level object is depth 1). Our fields are all scalars; the bound only
// keeps unknown fields from costing unbounded work.
const maxDepth = 32

// frame is one open container of the token walk.
type frame struct {
	object  bool // an object, not an array
	wantKey bool // in an object: the next token is a key or '}'
}

// scanObject reads a JSON object with one iterative token pass and returns
// its top-level members: for a scalar member the token itself (string,
// json.Number, bool or nil), for an object or array member its opening
// json.Delim. Nested values are checked for syntax and depth, then dropped.
//
// It exists instead of json.Unmarshal into a struct because Unmarshal keeps
// the last of duplicate keys and matches keys case-insensitively: both would
// let {"total_amount":"1.00","TOTAL_AMOUNT":"9999.00"} charge an amount
// other readers of the record do not see. Here keys match exactly (a
// differently cased key is an unknown field, ignored) and a repeated
// top-level key is an error. Numbers stay json.Number text, never float64.
func scanObject(value []byte) (map[string]json.Token, *ValidationError) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()

	tok, err := dec.Token()
	if err == io.EOF {
		return nil, &ValidationError{Reason: "empty value"}
	}
	if err != nil {
		return nil, malformed(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, &ValidationError{Reason: "not a JSON object"}
	}

	members := make(map[string]json.Token)
	stack := []frame{{object: true, wantKey: true}}
	var key string // the current top-level key
	for len(stack) > 0 {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil, &ValidationError{Reason: "malformed JSON: unexpected end of input"}
		}
		if err != nil {
			return nil, malformed(err)
		}
		top := &stack[len(stack)-1]
		if top.object && top.wantKey {
			if _, ok := tok.(json.Delim); ok { // '}': the decoder allows nothing else
				stack = stack[:len(stack)-1]
				valueDone(stack)
				continue
			}
			k, _ := tok.(string) // the decoder only returns strings in key position
			if len(stack) == 1 {
				if _, dup := members[k]; dup {
					return nil, &ValidationError{Reason: fmt.Sprintf("duplicate key %.64q", k)}
				}
				key = k
			}
			top.wantKey = false
			continue
		}
		switch d, _ := tok.(json.Delim); d {
		case '{', '[':
			if len(stack) == 1 {
				members[key] = d
			}
			if len(stack) >= maxDepth {
				return nil, &ValidationError{Reason: "nested deeper than 32 levels"}
			}
			stack = append(stack, frame{object: d == '{', wantKey: d == '{'})
		case ']':
			stack = stack[:len(stack)-1]
			valueDone(stack)
		default: // a scalar value
			if len(stack) == 1 {
				members[key] = tok
			}
			valueDone(stack)
		}
	}

	// One record is one JSON value: trailing data means a producer bug or
	// two records glued together, either way not something to charge.
	if _, err := dec.Token(); err != io.EOF {
		return nil, &ValidationError{Reason: "data after the JSON object"}
	}
	return members, nil
}

// valueDone records that a value ended inside the innermost open container.
func valueDone(stack []frame) {
	if n := len(stack); n > 0 && stack[n-1].object {
		stack[n-1].wantKey = true
	}
}

// malformed turns a decoder error into a record-level ValidationError.
func malformed(err error) *ValidationError {
	var syn *json.SyntaxError
	switch {
	case errors.As(err, &syn):
		return &ValidationError{Reason: fmt.Sprintf("malformed JSON at byte %d: %s", syn.Offset, syn)}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &ValidationError{Reason: "malformed JSON: unexpected end of input"}
	}
	return &ValidationError{Reason: "malformed JSON"}
}
