package dedup

import (
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

const (
	parent     = "processed_event"
	namePrefix = parent + "_p"
	nameLayout = "20060102"
	day        = 24 * time.Hour
)

// Partition is one UTC day of processed_event.
type Partition struct {
	// Day is the partition's UTC midnight.
	Day time.Time
}

// PartitionFor returns the day partition that holds events created at t.
func PartitionFor(t time.Time) Partition {
	return Partition{Day: t.UTC().Truncate(day)}
}

// Name is the partition's table name, processed_event_pYYYYMMDD.
func (p Partition) Name() string { return namePrefix + p.Day.Format(nameLayout) }

// Lower is the smallest UUID whose 48-bit UUIDv7 time prefix is the day's
// first millisecond; every UUIDv7 created that day sorts at or above it.
func (p Partition) Lower() uuid.UUID { return timeBound(p.Day) }

// Upper is the next day's Lower, the partition's exclusive upper bound.
func (p Partition) Upper() uuid.UUID { return timeBound(p.Day.Add(day)) }

// End is the instant the partition's range ends: once the retention period
// has passed since End, no event the partition holds is still retained.
func (p Partition) End() time.Time { return p.Day.Add(day) }

// timeBound encodes t's Unix milliseconds in the first 48 bits, big-endian,
// as in a UUIDv7, with every other bit zero. Postgres compares uuids byte by
// byte, so these bounds order events by creation time.
func timeBound(t time.Time) uuid.UUID {
	var u uuid.UUID
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(t.UnixMilli()))
	copy(u[:6], ms[2:])
	return u
}

// parseName returns the partition named name, or false for a table that
// does not follow the naming scheme (which maintenance then leaves alone).
func parseName(name string) (Partition, bool) {
	s, ok := strings.CutPrefix(name, namePrefix)
	if !ok {
		return Partition{}, false
	}
	d, err := time.Parse(nameLayout, s)
	if err != nil || d.Format(nameLayout) != s {
		return Partition{}, false
	}
	return Partition{Day: d.UTC()}, true
}

// createSQL creates p's table, not yet a partition: processed_event's
// columns, defaults and NOT NULLs (the primary key index is created by the
// attach), and a CHECK of p's bounds.
func (p Partition) createSQL() string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS, "+
		"CONSTRAINT %s_bounds CHECK (event_id >= '%s' AND event_id < '%s'))",
		p.Name(), parent, p.Name(), p.Lower(), p.Upper())
}

func (p Partition) attachSQL() string {
	return fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
		parent, p.Name(), p.Lower(), p.Upper())
}

func (p Partition) detachSQL() string {
	return fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s CONCURRENTLY", parent, p.Name())
}

func (p Partition) finalizeSQL() string {
	return fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s FINALIZE", parent, p.Name())
}
