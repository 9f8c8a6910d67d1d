// Package redact hides the passwords of connection strings and URLs before
// they are printed, logged or put into an error. It is the one place that
// knows where a password sits in such a string: the user info of a URL
// (scheme://user:password@host), and a password= or sslpassword= parameter
// of a URL's query or of a key=value connection string.
package redact

import (
	"regexp"
	"strings"
)

// Mask is what String puts in place of a password.
const Mask = "***"

// String returns s with every password Passwords finds replaced by Mask;
// anything else in s is kept as it is.
func String(s string) string {
	spans := passwordSpans(s)
	for i := len(spans) - 1; i >= 0; i-- { // from the end: earlier offsets stay valid
		s = s[:spans[i][0]] + Mask + s[spans[i][1]:]
	}
	return s
}

// Passwords returns the passwords s holds, as written (a quoted key=value
// password without its quotes), in the order they appear; empty ones are
// left out.
func Passwords(s string) []string {
	var out []string
	for _, sp := range passwordSpans(s) {
		out = append(out, strings.Trim(s[sp[0]:sp[1]], "'"))
	}
	return out
}

// passwordParam matches a password= or sslpassword= parameter; its second
// group is the value.
var passwordParam = regexp.MustCompile(`(?i)(?:^|[\s?&])((?:ssl)?password=)('[^']*'|[^\s&]*)`)

// passwordSpans returns the byte ranges of the non-empty passwords of s,
// in order and not overlapping. The user info ends at the last '@', so
// that a password holding a raw '@' is hidden whole.
func passwordSpans(s string) [][2]int {
	var spans [][2]int
	if scheme := strings.Index(s, "://"); scheme >= 0 {
		start := scheme + len("://")
		if at := strings.LastIndex(s[start:], "@"); at >= 0 {
			if colon := strings.Index(s[start:start+at], ":"); colon >= 0 && colon+1 < at {
				spans = append(spans, [2]int{start + colon + 1, start + at})
			}
		}
	}
	for _, m := range passwordParam.FindAllStringSubmatchIndex(s, -1) {
		lo, hi := m[4], m[5]
		if hi > lo && (len(spans) == 0 || lo >= spans[len(spans)-1][1]) {
			spans = append(spans, [2]int{lo, hi})
		}
	}
	return spans
}
