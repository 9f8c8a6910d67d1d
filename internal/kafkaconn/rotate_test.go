package kafkaconn

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// The broker's password was rotated (it knows only the new one) while the
// service runs with the old one: the same Conns fail to authenticate, then,
// once the password file holds the new password, new connections through
// the Dialer and the Transport authenticate, without building anything
// again. A half-written (empty) file keeps the password that works, and no
// password reaches the log.
func TestPasswordFileRotation(t *testing.T) {
	p := newPKI(t, "rotate-ca")
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{p.server}, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", "plain-rot", "new-plain-pass"),
		kfake.Superuser("SCRAM-SHA-256", "scram-rot", "new-scram-pass"),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	brokers := c.ListenAddrs()
	for _, tc := range []struct {
		mech       Mechanism
		user, next string
	}{
		{Plain, "plain-rot", "new-plain-pass"},
		{ScramSHA256, "scram-rot", "new-scram-pass"},
	} {
		t.Run(string(tc.mech), func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "password")
			write := func(s string) {
				if err := os.WriteFile(file+".new", []byte(s), 0o600); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(file+".new", file); err != nil {
					t.Fatal(err)
				}
			}
			write("old-pass\n")
			var logs bytes.Buffer
			conns, err := New(Config{TLS: true, CAFile: p.caFile, Mechanism: tc.mech, Username: tc.user, Password: "old-pass",
				PasswordFile: file, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			checkNow := func() error {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				return conns.Check(ctx, brokers)
			}
			var ce *CheckError
			if err := checkNow(); !errors.As(err, &ce) || ce.Kind != AuthFailed {
				t.Fatalf("check with the old password = %v; want an authentication failure", err)
			}
			write(tc.next + "\n")
			if err := checkNow(); err != nil {
				t.Fatalf("check after the password file changed = %v; want success without a restart", err)
			}
			write("")
			if err := checkNow(); err != nil {
				t.Fatalf("check with an empty password file = %v; want the last good password kept", err)
			}
			if strings.Contains(logs.String(), tc.next) || strings.Contains(logs.String(), "old-pass") {
				t.Fatalf("a password reached the log: %s", logs.String())
			}
			if !strings.Contains(logs.String(), "password file changed") || !strings.Contains(logs.String(), "empty") {
				t.Fatalf("log = %q; want the change and the empty file said", logs.String())
			}
		})
	}
}
