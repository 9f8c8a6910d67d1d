package payment

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// writeToken replaces the token file the way the kubelet updates a mounted
// secret: a new file renamed over the old one.
func writeToken(t *testing.T, path, token string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A token file changed while the client runs is used from the next read
// on: after the interval, or at once after Refresh (a 401). A half-done
// rotation (an empty file) keeps the last token; the token never reaches
// the log.
func TestFileTokenRereadsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	writeToken(t, path, "tok-one")
	var logs bytes.Buffer
	f, err := NewFileToken(path, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if h := f.Header(); len(h) != 1 || h[0] != "Bearer tok-one" {
		t.Fatalf("Header = %q", h)
	}
	writeToken(t, path, "tok-two")
	if h := f.Header()[0]; h != "Bearer tok-one" {
		t.Fatalf("Header within the interval = %q; want the token read last", h)
	}
	f.Refresh()
	if h := f.Header()[0]; h != "Bearer tok-two" {
		t.Fatalf("Header after Refresh = %q; want the new token", h)
	}
	writeToken(t, path, "")
	f.Refresh()
	if h := f.Header()[0]; h != "Bearer tok-two" {
		t.Fatalf("Header after an empty file = %q; want the last good token", h)
	}
	if strings.Contains(logs.String(), "tok-") || !strings.Contains(logs.String(), "keeping the last token") {
		t.Fatalf("log = %q; want the warning, never a token", logs.String())
	}

	short, err := NewFileToken(path+"-short", 0, nil)
	if err == nil || !strings.Contains(err.Error(), path+"-short") {
		t.Fatalf("NewFileToken of a missing file = %v, %v; want an error naming the path", short, err)
	}
}

// The client sends the current token of Config.Authorization on every
// attempt: a provider that rotates its token refuses the old one (401)
// until the file holds the new one; then charges succeed, without a new
// client.
func TestClientUsesRotatedToken(t *testing.T) {
	forEachClient(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "token")
		writeToken(t, path, "tok-one")
		f, err := NewFileToken(path, 20*time.Millisecond, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		var want atomic.Value
		want.Store("Bearer tok-one")
		srv := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != want.Load().(string) {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"charge_id":"ch_1"}`))
		}))
		c := newClient(t, srv.URL, func(c *Config) { c.Token, c.Authorization = "", f.Header })
		if _, err := c.Charge(context.Background(), testCharge()); err != nil {
			t.Fatalf("charge with the first token: %v", err)
		}
		want.Store("Bearer tok-two") // the provider rotated
		if _, err := c.Charge(context.Background(), testCharge()); mustPaymentError(t, err).Status != http.StatusUnauthorized {
			t.Fatalf("charge with the old token: %v; want 401", err)
		}
		writeToken(t, path, "tok-two")
		deadline := time.Now().Add(10 * time.Second)
		for {
			_, err := c.Charge(context.Background(), testCharge())
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the rotated token file was not used within 10s: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}
