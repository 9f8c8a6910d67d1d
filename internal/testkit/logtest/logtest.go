// Package logtest holds what tests need to read the log of code that runs
// concurrently with them: goroutines of the code under test, kafka-go's
// own goroutines, or a subprocess writing its output.
package logtest

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that is safe for concurrent use: writers (a
// logger, a subprocess's stdout) may write while the test reads String.
// Its zero value is empty and ready; it stays writable after the test
// ends, for goroutines that log late.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
