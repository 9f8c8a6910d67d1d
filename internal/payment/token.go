package payment

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FileToken is a bearer token kept in a file (a mounted Kubernetes secret)
// and re-read while the service runs, so that a rotated token is used
// without a restart: the file is read again when a request finds the last
// read older than Interval, and at the next request after Refresh (cmd
// calls it on a 401). A file that cannot be read, is empty or holds
// characters not allowed in a header (a rotation half done) keeps the last
// good token, logged. The token never appears in a log line or error. Safe
// for concurrent use; give its Header method to Config.Authorization.
type FileToken struct {
	path     string
	interval time.Duration
	logger   *slog.Logger

	header  atomic.Pointer[[]string] // "Bearer <token>", shared, never written to
	content atomic.Pointer[string]
	readAt  atomic.Int64 // UnixNano of the last read; 0 forces one
	mu      sync.Mutex   // one reader at a time; others use the last token
}

// NewFileToken reads path once; its error (unreadable, empty, invalid)
// names the path, never the content. interval <= 0 means 1s.
func NewFileToken(path string, interval time.Duration, logger *slog.Logger) (*FileToken, error) {
	if interval <= 0 {
		interval = time.Second
	}
	f := &FileToken{path: path, interval: interval, logger: logger}
	tok, err := f.read()
	if err != nil {
		return nil, err
	}
	f.store(tok)
	return f, nil
}

func (f *FileToken) read() (string, error) {
	b, err := os.ReadFile(f.path)
	if err != nil {
		return "", fmt.Errorf("payment token file %s: %w", f.path, errors.Unwrap(err))
	}
	tok := strings.TrimSpace(string(b))
	switch {
	case tok == "":
		return "", fmt.Errorf("payment token file %s is empty", f.path)
	case !visibleASCII(tok):
		return "", fmt.Errorf("payment token file %s has characters not allowed in an HTTP header", f.path)
	}
	return tok, nil
}

func (f *FileToken) store(tok string) {
	h := []string{"Bearer " + tok}
	f.content.Store(&tok)
	f.header.Store(&h)
	f.readAt.Store(time.Now().UnixNano())
}

// Header returns the Authorization header value of the current token,
// re-reading the file first when the last read is older than the interval
// (or Refresh was called) and no other request is reading it.
func (f *FileToken) Header() []string {
	if time.Since(time.Unix(0, f.readAt.Load())) >= f.interval && f.mu.TryLock() {
		f.reload()
		f.mu.Unlock()
	}
	return *f.header.Load()
}

func (f *FileToken) reload() {
	tok, err := f.read()
	if err != nil {
		f.readAt.Store(time.Now().UnixNano()) // retry after the interval, not per request
		f.logger.Warn("cannot re-read the payment token file; keeping the last token", "err", err.Error())
		return
	}
	if tok != *f.content.Load() {
		f.logger.Info("payment token file changed; the new token is used from now on", "file", f.path)
	}
	f.store(tok)
}

// Refresh makes the next request re-read the file (after the provider
// refused our credentials: the token may have been rotated).
func (f *FileToken) Refresh() { f.readAt.Store(0) }
