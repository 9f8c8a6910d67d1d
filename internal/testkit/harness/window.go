package harness

import (
	"context"
	"encoding/json"
	"time"

	"github.com/billing-consumer/billing-consumer/internal/testkit/kafkatest"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ProcessedButUncommitted counts records past the group's committed offset
// whose event already has a processed_event row: events whose transaction
// committed but whose offset commit had not happened. After a SIGKILL a
// positive count proves the kill landed between the two commits, so their
// redelivery must come out as duplicates. At most limit records per
// partition are read.
func ProcessedButUncommitted(ctx context.Context, brokers []string, topic, group string, db *pgxpool.Pool, limit int) (int, error) {
	lags, err := Lag(ctx, brokers, topic, group)
	if err != nil {
		return 0, err
	}
	from := map[int]int64{}
	for _, l := range lags {
		from[l.Partition] = l.Committed // -1: none, read from the earliest
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	msgs, err := kafkatest.ReadTopic(rctx, brokers, topic, kafkatest.ReadOptions{From: from, Limit: limit})
	if err != nil {
		return 0, err
	}
	var ids []uuid.UUID
	for _, m := range msgs {
		var ev struct {
			EventID string `json:"event_id"`
		}
		if json.Unmarshal(m.Value, &ev) == nil {
			if id, err := uuid.Parse(ev.EventID); err == nil {
				ids = append(ids, id)
			}
		}
	}
	var n int
	err = db.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = ANY($1) AND consumer_group = $2", ids, group).Scan(&n)
	return n, err
}
