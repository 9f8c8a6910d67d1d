package events

import (
	"encoding/binary"
	"time"

	"github.com/google/uuid"
)

// IDAt returns a new random UUIDv7 whose embedded time is at, in
// milliseconds: an event_id as a producer would have made it at that
// moment. Useful for backfilled events and for tests of what an event's
// time decides (dedup partitions, the future-clock check).
func IDAt(at time.Time) uuid.UUID {
	u := uuid.Must(uuid.NewV7()) // random bits, version and variant
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(at.UnixMilli()))
	copy(u[:6], ms[2:])
	return u
}
