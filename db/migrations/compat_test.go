package migrations_test

import (
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/billing-consumer/billing-consumer/db/migrations"
)

// TestEmbeddedDirectives: every migration from 00004 on declares its
// lowest compatible binary, and none declares one above its own version.
func TestEmbeddedDirectives(t *testing.T) {
	low, err := migrations.LowestBinaries(migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if got := migrations.LowestCompatible(); got < 3 || got > migrations.Level() {
		t.Errorf("LowestCompatible() = %d, want between 3 and %d", got, migrations.Level())
	}
	if low[4] != 3 {
		t.Errorf("00004 declares lowest compatible binary %d, want 3 (it only adds tables)", low[4])
	}
}

func TestDirectiveRules(t *testing.T) {
	for name, sql := range map[string]string{
		"missing":  "-- +goose Up\nCREATE TABLE x (a int);\n",
		"twice":    "-- lowest-compatible-binary: 4\n-- lowest-compatible-binary: 5\n",
		"too high": "-- lowest-compatible-binary: 6\n",
		"zero":     "-- lowest-compatible-binary: 0\n",
	} {
		if _, err := migrations.LowestBinaries(fstest.MapFS{"00005_x.sql": {Data: []byte(sql)}}); err == nil {
			t.Errorf("%s: accepted %q", name, sql)
		}
	}
	low, err := migrations.LowestBinaries(fstest.MapFS{"00003_old.sql": {Data: []byte("no line before 00004")},
		"00005_x.sql": {Data: []byte("-- +goose Up\n-- lowest-compatible-binary: 5\n")}})
	if err != nil || low[5] != 5 || len(low) != 1 {
		t.Errorf("lowestBinaries = %v, %v; want map[5:5]", low, err)
	}
}

func TestCompatErr(t *testing.T) {
	for _, c := range []struct {
		migrations.Compat
		want string // "" for nil
	}{
		{migrations.Compat{Schema: 4, Binary: 4, Lowest: 3}, ""},
		{migrations.Compat{Schema: 7, Binary: 4, Lowest: 4}, ""}, // newer, still accepts level 4
		{migrations.Compat{Schema: 3, Binary: 4, Lowest: 0}, "run billing-consumer migrate"},
		{migrations.Compat{Schema: 0, Binary: 4}, "run billing-consumer migrate"},
		{migrations.Compat{Schema: 5, Binary: 4, Lowest: 5}, "refusing to bill"},
		// The record raised, its migration not (yet) applied.
		{migrations.Compat{Schema: 4, Binary: 4, Lowest: 5}, "refusing to bill"},
	} {
		err := c.Err()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%+v: Err() = %v, want %q", c.Compat, err, c.want)
		}
		var inc *migrations.IncompatibleError
		if errors.As(err, &inc) != (c.want == "refusing to bill") {
			t.Errorf("%+v: migrations.IncompatibleError %v", c.Compat, err)
		}
	}
}
