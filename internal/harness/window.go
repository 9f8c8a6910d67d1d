package harness

import (
	"context"
	"encoding/json"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
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
	var ids []uuid.UUID
	for _, l := range lags {
		from := l.Committed
		if from < 0 {
			from = 0
		}
		if from >= l.End {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: l.Partition, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(from); err != nil {
			cancel()
			r.Close()
			return 0, err
		}
		for n := 0; n < limit; n++ {
			m, err := r.FetchMessage(rctx)
			if err != nil {
				break
			}
			var ev struct {
				EventID string `json:"event_id"`
			}
			if json.Unmarshal(m.Value, &ev) == nil {
				if id, err := uuid.Parse(ev.EventID); err == nil {
					ids = append(ids, id)
				}
			}
			if m.Offset+1 >= l.End {
				break
			}
		}
		cancel()
		r.Close()
	}
	var n int
	err = db.QueryRow(ctx, "SELECT count(*) FROM processed_event WHERE event_id = ANY($1) AND consumer_group = $2", ids, group).Scan(&n)
	return n, err
}
