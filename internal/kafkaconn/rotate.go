package kafkaconn

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/segmentio/kafka-go/sasl"
)

// fileMechanism is the SASL mechanism of a password kept in a file (a
// mounted Kubernetes secret): it re-reads the file for every new
// connection, so a rotated password is used from the next connection on
// (kafka-go reconnects after a refused authentication, and the broker
// keeps the connections already authenticated), without a restart. A file
// that cannot be read, is empty or holds a password the mechanism refuses
// (a rotation half done) keeps the last good password, logged once per
// change. The password never appears in a log line.
type fileMechanism struct {
	cfg    Config // Mechanism, Username; Password is the last good one
	path   string
	logger *slog.Logger // nil: silent

	mu     sync.Mutex
	mech   sasl.Mechanism
	bad    string // the content last refused, so it is logged once
	logged bool
}

func newFileMechanism(cfg Config, mech sasl.Mechanism) *fileMechanism {
	return &fileMechanism{cfg: cfg, path: cfg.PasswordFile, logger: cfg.Logger, mech: mech}
}

// Name is the mechanism's name (PLAIN, SCRAM-SHA-256, ...).
func (f *fileMechanism) Name() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mech.Name()
}

// Start re-reads the password file, then starts an exchange with the
// current password.
func (f *fileMechanism) Start(ctx context.Context) (sasl.StateMachine, []byte, error) {
	return f.current().Start(ctx)
}

func (f *fileMechanism) current() sasl.Mechanism {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := os.ReadFile(f.path)
	pw := strings.TrimSpace(string(b))
	switch {
	case err == nil && pw == f.cfg.Password:
		f.logged = false
		return f.mech
	case err == nil && pw != "" && pw != f.bad:
		next := f.cfg
		next.Password = pw
		if m, merr := next.mechanism(); merr == nil && m != nil {
			f.cfg, f.mech, f.bad = next, m, ""
			f.log(slog.LevelInfo, "Kafka SASL password file changed; new connections use the new password")
			return f.mech
		}
		f.bad = pw
		f.log(slog.LevelWarn, "the Kafka SASL password file holds a password the mechanism refuses; keeping the last one")
	case err != nil && !f.logged:
		f.logged = true
		f.log(slog.LevelWarn, "cannot re-read the Kafka SASL password file; keeping the last password", "err", err.Error())
	case err == nil && pw == "" && !f.logged:
		f.logged = true
		f.log(slog.LevelWarn, "the Kafka SASL password file is empty; keeping the last password")
	}
	return f.mech
}

func (f *fileMechanism) log(level slog.Level, msg string, args ...any) {
	if f.logger != nil {
		f.logger.Log(context.Background(), level, msg, append(args, "file", f.path)...)
	}
}
