package payment

import (
	"testing"
)

// endless is a reader of zeros that counts what it was asked for.
type endless struct{ asked int }

func (e *endless) Read(p []byte) (int, error) {
	e.asked += len(p)
	clear(p)
	return len(p), nil
}

// TestReadingStopsAtTheLimit checks that neither reading an answer nor
// draining it ever asks the body for a byte past its limit, whatever the
// pooled buffer's size: an endless answer costs at most the limits.
func TestReadingStopsAtTheLimit(t *testing.T) {
	for _, limit := range []int{0, 1, 4095, 4096, 4097, maxErrorBody, maxResponseBody + 1} {
		for _, size := range []int{1, 4 << 10, 100 << 10} {
			buf := make([]byte, 0, size)
			r := &endless{}
			got, err := readAtMost(r, limit, &buf)
			if err != nil || len(got) != limit || r.asked != limit {
				t.Errorf("readAtMost(limit %d, buffer %d): %d bytes, asked for %d, %v", limit, size, len(got), r.asked, err)
			}
			r.asked = 0
			drain(r, limit, &buf)
			if r.asked != limit {
				t.Errorf("drain(limit %d, buffer %d) asked for %d bytes", limit, cap(buf), r.asked)
			}
		}
	}
}
