package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/metrics"
	"github.com/billing-consumer/billing-consumer/internal/postgres"
	"github.com/billing-consumer/billing-consumer/internal/postgres/pause"
)

// pauseInterval is how often each replica reads the pause state: a pause
// or resume reaches every replica within about this long.
const pauseInterval = 2 * time.Second

// pauseCommand is `billing-consumer pause --reason TEXT [--operator NAME]`
// and `billing-consumer resume [--operator NAME]`: they write or delete
// the consumer group's row of billing_pause (BILLING_KAFKA_GROUP_ID), which
// every replica reads every pauseInterval. They need only the database.
func pauseCommand(ctx context.Context, command string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	reason := fs.String("reason", "", "why billing is paused: an incident or ticket reference (required by pause)")
	operator := fs.String("operator", "", "who decides, for the log and the pause record (default: the OS user)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			synopsis := map[string]string{"pause": "pause --reason TEXT [--operator NAME]", "resume": "resume [--operator NAME]"}[command]
			fmt.Fprintf(stdout, "Usage: billing-consumer "+synopsis+"\n\n"+
				"  billing-consumer pause --reason TEXT [--operator NAME]\n  billing-consumer resume [--operator NAME]\n\n"+
				"pause stops billing on every replica of the consumer group (BILLING_KAFKA_GROUP_ID) within %s: they stay in the\n"+
				"group, fetch nothing and send no request (the retries of records in hand, the completer, the deferred decisions\n"+
				"and reconcile all wait), and finish the requests in flight; /readyz says so and billing_paused is 1.\n"+
				"Kept in Postgres: it survives restarts and rollouts until resume.\n\nFlags:\n", pauseInterval)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("%s: %w (%w)", command, err, errUsage)
	}
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("%s: unexpected argument %q (%w)", command, fs.Arg(0), errUsage)
	case command == "pause" && strings.TrimSpace(*reason) == "":
		return fmt.Errorf("pause: --reason is required (%w)", errUsage)
	case command == "resume" && *reason != "":
		return fmt.Errorf("resume: --reason is for pause only (%w)", errUsage)
	}
	who := strings.TrimSpace(*operator)
	if who == "" {
		who = osUser()
	}
	host, _ := os.Hostname()
	return onDB(ctx, stderr, func(ctx context.Context, cfg config, db *postgres.DB, logger *slog.Logger) error {
		return pauseOn(ctx, db, logger, stdout, command, cfg.KafkaGroupID, strings.TrimSpace(*reason), who, host)
	})
}

// pauseOn writes (pause) or deletes (resume) group's row of billing_pause
// and says what it did.
func pauseOn(ctx context.Context, db *postgres.DB, logger *slog.Logger, stdout io.Writer, command, group, reason, who, host string) error {
	if command == "pause" {
		s, err := postgres.Pause(ctx, db, group, reason, who, host)
		if err != nil {
			return schemaHint(err)
		}
		logger.Info("billing paused", "group", group, "reason", s.Reason, "operator", who, "host", host)
		fmt.Fprintf(stdout, "billing paused for consumer group %s since %s by %s: %s\nevery replica stops fetching and sending within %s; resume with billing-consumer resume\n",
			group, s.Since.UTC().Format(time.RFC3339), s.Operator, s.Reason, pauseInterval)
		return nil
	}
	s, err := postgres.Resume(ctx, db, group)
	if err != nil {
		return schemaHint(err)
	}
	if !s.Paused {
		fmt.Fprintf(stdout, "billing was not paused for consumer group %s; nothing changed\n", group)
		return nil
	}
	logger.Info("billing resumed", "group", group, "operator", who, "host", host, "paused_for", s.For.Round(time.Second).String(),
		"pause_reason", s.Reason, "paused_by", s.Operator)
	fmt.Fprintf(stdout, "billing resumed for consumer group %s (paused %s by %s: %s); every replica fetches again within %s\n",
		group, s.For.Round(time.Second), s.Operator, s.Reason, pauseInterval)
	return nil
}

// pauseWatcher is the running service's view of the pause, feeding the
// billing_paused gauges.
func pauseWatcher(s *service) *pause.Watcher {
	return postgres.NewPauseWatcher(s.db, s.cfg.KafkaGroupID, s.logger, func(st pause.State) { pausedGauges(s.ctl, st) })
}

func pausedGauges(c *metrics.Control, st pause.State) {
	if !st.Paused {
		c.Paused.Set(0)
		c.PausedSeconds.Set(0)
		return
	}
	c.Paused.Set(1)
	c.PausedSeconds.Set(st.For.Seconds())
}

// pauseDetail is /readyz's line about a pause: a paused replica is ready
// (it is healthy and a member of the group; a 503 would stall rollouts and
// page BillingConsumerNotReady for a decision an operator made), and says
// why it bills nothing.
func (s *service) pauseDetail() string {
	st, known := s.pause.State()
	switch {
	case !known:
		return "pause state not read yet: fetching and sending nothing"
	case st.Paused:
		return fmt.Sprintf("paused by %s since %s (%s): %s; fetching and sending nothing until billing-consumer resume",
			st.Operator, st.Since.UTC().Format(time.RFC3339), st.For.Round(time.Second), st.Reason)
	}
	return ""
}
