package events

import (
	"unicode/utf16"
	"unicode/utf8"
)

// str reads a string whose opening quote is at pos and returns its
// contents, unescaped when decode is set (nil when it is not).
func (s *scanner) str(decode bool) ([]byte, *ValidationError) {
	start := s.pos + 1
	escaped := false
	for i := start; i < len(s.data); {
		switch c := s.data[i]; {
		case c == '"':
			s.pos = i + 1
			switch {
			case !decode:
				return nil, nil
			case escaped:
				return unescape(s.data[start:i]), nil
			}
			return s.data[start:i], nil
		case c == '\\':
			escaped = true
			n, verr := s.escape(i)
			if verr != nil {
				return nil, verr
			}
			i += n
		case c < 0x20:
			s.pos = i
			return nil, s.syntax("in string literal")
		default:
			i++
		}
	}
	return nil, unexpectedEnd()
}

// escape checks the escape sequence whose backslash is at i and returns
// its length.
func (s *scanner) escape(i int) (int, *ValidationError) {
	if i+1 == len(s.data) {
		return 0, unexpectedEnd()
	}
	switch s.data[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		for j := i + 2; j < i+6; j++ {
			if j == len(s.data) {
				return 0, unexpectedEnd()
			}
			if hexValue(s.data[j]) < 0 {
				s.pos = j
				return 0, s.syntax(`in \u hexadecimal character escape`)
			}
		}
		return 6, nil
	}
	s.pos = i + 1
	return 0, s.syntax("in string escape code")
}

// unescape decodes the contents of a JSON string that scanner.str has
// checked (every escape complete and well-formed) and that is valid UTF-8.
// It decodes as encoding/json does, so a key or value means the same here
// as to every other reader of the record: a \u escape of a UTF-16
// surrogate pair is one rune, and a lone or mismatched surrogate is
// U+FFFD (the escape after a mismatched high surrogate is decoded on its
// own).
func unescape(raw []byte) []byte {
	b := make([]byte, 0, len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			b = append(b, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r := hex4(raw[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if pair := utf16.DecodeRune(r, hex4(raw[i+2:])); pair != utf8.RuneError {
						b = utf8.AppendRune(b, pair)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			b = utf8.AppendRune(b, r)
			continue
		default: // '"', '\\' and '/' stand for themselves
			b = append(b, raw[i+1])
		}
		i += 2
	}
	return b
}

// hex4 returns the value of the four hex digits that begin h, which
// scanner.escape has checked.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		r = r<<4 | rune(hexValue(c))
	}
	return r
}

// hexValue returns the value of the hex digit c, or -1.
func hexValue(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c - 'a' + 10)
	case 'A' <= c && c <= 'F':
		return int(c - 'A' + 10)
	}
	return -1
}
