// Package money holds Amount, the exact representation of a charge amount.
//
// Amounts travel as decimal text ("99.90") in the event, in the payment
// request and into Postgres numeric columns. In between they are an integer
// count of hundredths, so no float64 ever touches money.
package money

import (
	"errors"
	"fmt"
	"strconv"
)

// Amount is a positive amount of money in hundredths of the currency unit
// (cents): Amount(9990) is 99.90.
type Amount int64

// Max is the largest amount ParseAmount accepts: 100,000,000.00. Anything
// larger in an order event is a producer bug, not a purchase.
const Max Amount = 100_000_000_00

// maxIntDigits bounds the integer part before any arithmetic, so that no
// input can overflow int64.
const maxIntDigits = 9

// ParseAmount parses decimal text of the form "123", "123.4" or "123.45":
// ASCII digits without sign, exponent, spaces or leading zeros (other than
// a lone "0" before the point), at most two fractional digits, greater than
// zero and at most Max. The error says which rule the text broke.
func ParseAmount(s string) (Amount, error) {
	if s == "" {
		return 0, errors.New("empty amount")
	}
	intPart, frac := s, ""
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			intPart, frac = s[:i], s[i+1:]
			break
		}
	}
	if intPart == "" {
		return 0, fmt.Errorf("amount %.20q: no digits before the decimal point", s)
	}
	if len(intPart) > 1 && intPart[0] == '0' {
		return 0, fmt.Errorf("amount %.20q: leading zero", s)
	}
	if len(intPart) > maxIntDigits {
		return 0, fmt.Errorf("amount %.20q: more than %s", s, Max)
	}
	if len(s) > len(intPart) && frac == "" {
		return 0, fmt.Errorf("amount %.20q: no digits after the decimal point", s)
	}
	if len(frac) > 2 {
		return 0, fmt.Errorf("amount %.20q: more than 2 fractional digits", s)
	}
	if !digits(intPart) || !digits(frac) {
		return 0, fmt.Errorf("amount %.20q: not a plain decimal number", s)
	}
	units, _ := strconv.ParseInt(intPart, 10, 64) // at most 9 digits: cannot fail
	cents := int64(0)
	if frac != "" {
		c, _ := strconv.ParseInt(frac, 10, 64)
		if len(frac) == 1 {
			c *= 10
		}
		cents = c
	}
	a := Amount(units*100 + cents)
	if a <= 0 {
		return 0, fmt.Errorf("amount %.20q: must be greater than zero", s)
	}
	if a > Max {
		return 0, fmt.Errorf("amount %.20q: more than %s", s, Max)
	}
	return a, nil
}

func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// String returns the canonical form: the integer part, a point and exactly
// two fractional digits ("99.90", "5.00"). It is what the payment request
// carries and what Postgres stores, so equal amounts compare equal as text.
func (a Amount) String() string {
	sign := ""
	v := int64(a)
	if v < 0 {
		sign, v = "-", -v
	}
	return fmt.Sprintf("%s%d.%02d", sign, v/100, v%100)
}
