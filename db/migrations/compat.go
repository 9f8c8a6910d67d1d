package migrations

import (
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// FirstGuarded is the first migration that must declare its lowest
// compatible binary: 00004 created the record (schema_compat).
const FirstGuarded = 4

// ReplicaStaleAfter is how old a replica's heartbeat may be, by the
// database's clock, before `migrate` no longer counts it as running (a
// SIGKILLed replica never deletes its row). Replicas refresh theirs every
// HeartbeatInterval.
const (
	ReplicaStaleAfter = time.Minute
	HeartbeatInterval = 10 * time.Second
)

// directive is the line by which a migration declares the lowest binary
// schema level that may run against the schema once it is applied.
var directive = regexp.MustCompile(`(?m)^-- lowest-compatible-binary: ([0-9]+)[ \t]*$`)

// LowestBinaries reads, from each migration of fsys from FirstGuarded on,
// its lowest-compatible-binary line. Each must have exactly one, naming a
// level no higher than its own version (a binary that embeds a migration
// must be able to run on it). fsys is FS, or a test's set of files.
func LowestBinaries(fsys fs.FS) (map[int64]int64, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	out := map[int64]int64{}
	for _, n := range names {
		v, err := version(n)
		if err != nil {
			return nil, err
		}
		if v < FirstGuarded {
			continue
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		m := directive.FindAllSubmatch(b, -1)
		if len(m) != 1 {
			return nil, fmt.Errorf("migration %s: want one line \"-- lowest-compatible-binary: N\", found %d", n, len(m))
		}
		low, err := strconv.ParseInt(string(m[0][1]), 10, 64)
		if err != nil || low < 1 || low > v {
			return nil, fmt.Errorf("migration %s: lowest compatible binary %s must be between 1 and %d", n, m[0][1], v)
		}
		out[v] = low
	}
	return out, nil
}

func version(name string) (int64, error) {
	i := strings.IndexByte(name, '_')
	if i < 0 {
		return 0, fmt.Errorf("migration file %s: no version prefix", name)
	}
	v, err := strconv.ParseInt(name[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("migration file %s: no version prefix", name)
	}
	return v, nil
}

// Compat is how a binary stands with the database's schema.
type Compat struct {
	// Schema is the database's schema version (0 before the first
	// migration), Binary this binary's level (the highest migration it
	// embeds), Lowest the lowest binary level the schema accepts (0
	// before migration 00004 recorded one).
	Schema, Binary, Lowest int64
}

// Err is nil when a binary of level c.Binary may bill on the schema: the
// schema is at least its level (else: run migrate) and accepts it (a newer
// schema is fine as long as its lowest compatible binary is not above
// c.Binary). The errors are one line each, for /readyz and the log.
func (c Compat) Err() error {
	switch {
	case c.Schema < c.Binary:
		return fmt.Errorf("schema version %d, this build needs %d: run billing-consumer migrate", c.Schema, c.Binary)
	case c.Lowest > c.Binary:
		return &IncompatibleError{c}
	}
	return nil
}

// IncompatibleError is Compat.Err's answer to a schema that no longer
// accepts the binary: waiting does not help, a newer build does.
type IncompatibleError struct{ Compat }

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("schema version %d accepts binaries of schema level %d or later, this build is level %d: refusing to bill, deploy a newer build",
		e.Schema, e.Lowest, e.Binary)
}

// Level is this binary's schema level: the highest migration it embeds.
func Level() int64 {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		panic(err) // a constant pattern
	}
	var latest int64
	for _, n := range names {
		v, err := version(n)
		if err != nil {
			panic(err) // the embedded file names are checked by the tests
		}
		latest = max(latest, v)
	}
	return latest
}

// LowestCompatible is the lowest binary level that may run against the
// schema this binary migrates to: the highest lowest-compatible-binary its
// migrations declare (the record only rises). A binary of a lower level
// must be stopped before this one's migrate (stop-then-start).
func LowestCompatible() int64 {
	low, err := LowestBinaries(FS)
	if err != nil {
		panic(err) // the embedded directives are checked by the tests
	}
	var out int64
	for _, l := range low {
		out = max(out, l)
	}
	return out
}
