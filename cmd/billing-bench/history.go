package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"
)

// runJSON is the machine-readable form of a run (-json), read back by the
// next run to show as the previous one.
type runJSON struct {
	Consumer string         `json:"consumer"` // `billing-consumer version` of the binary under test
	Baseline string         `json:"baseline,omitempty"`
	Date     time.Time      `json:"date"`
	Took     string         `json:"took"`
	LoadAvg  string         `json:"load_average_at_start"`
	Results  []resultJSON   `json:"results"`
	Before   []resultJSON   `json:"baseline_results,omitempty"`
	Sweep    []resultJSON   `json:"sweep,omitempty"`
	Recovery []recoveryJSON `json:"recovery,omitempty"`
}

// resultJSON is one measured backlog (and its steady load).
type resultJSON struct {
	Mode           string  `json:"mode"`
	LatencyMS      int64   `json:"provider_latency_ms"`
	Backlog        int     `json:"backlog"`
	EventsPerS     float64 `json:"events_per_s"`
	CPUPerEvent    float64 `json:"cpu_us_per_event,omitempty"`
	AllocsPerEvent float64 `json:"allocs_per_event,omitempty"`
	BytesPerEvent  float64 `json:"bytes_per_event,omitempty"`
	P50MS          float64 `json:"p50_ms,omitempty"`
	P99MS          float64 `json:"p99_ms,omitempty"`
	PeakRSS        int64   `json:"peak_rss_bytes,omitempty"`
}

// recoveryJSON is one run of the recovery scenario.
type recoveryJSON struct {
	Binary   string            `json:"binary"`
	Settings map[string]string `json:"settings"`
	Stages   []stageJSON       `json:"stages"`
}

type stageJSON struct {
	Name         string  `json:"name"`
	AllProgressS float64 `json:"all_partitions_progressing_after_s"`
	LongestStall float64 `json:"longest_partition_stall_s"`
}

func toJSON(rs []result) []resultJSON {
	var out []resultJSON
	for _, x := range rs {
		out = append(out, resultJSON{
			Mode: x.Mode, LatencyMS: x.Latency.Milliseconds(), Backlog: x.Backlog, EventsPerS: x.TP.Rate,
			CPUPerEvent: x.Cost.CPUPerEvent(), AllocsPerEvent: x.Cost.AllocsPerEvent(), BytesPerEvent: x.Cost.BytesPerEvent(),
			P50MS: float64(x.P50) / 1e6, P99MS: float64(x.P99) / 1e6, PeakRSS: x.PeakRSS,
		})
	}
	return out
}

// json is the run in its machine-readable form.
func (r report) json(now time.Time) runJSON {
	j := runJSON{Consumer: r.env.Consumer, Baseline: r.env.BaselineConsumer, Date: now.UTC().Truncate(time.Second),
		Took: r.took.Round(time.Second).String(), LoadAvg: r.env.LoadAvg,
		Results: toJSON(r.results), Before: toJSON(r.baseline), Sweep: toJSON(r.sweep)}
	for _, rec := range r.recovery {
		rj := recoveryJSON{Binary: rec.label(), Settings: rec.Settings}
		for _, s := range rec.Stages {
			rj.Stages = append(rj.Stages, stageJSON{Name: s.Name, AllProgressS: s.AllProgress.Seconds(), LongestStall: s.LongestStall.Seconds()})
		}
		j.Recovery = append(j.Recovery, rj)
	}
	return j
}

// readPrevious reads the previous run's JSON at path: nil, without error,
// when there is none yet.
func readPrevious(path string) (*runJSON, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var j runJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("%s: not the JSON of a previous run: %w", path, err)
	}
	return &j, nil
}

// writeJSON writes the run to path.
func writeJSON(path string, j runJSON) error {
	b, err := json.MarshalIndent(j, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// find returns the previous result of a mode at a provider latency.
func (j *runJSON) find(mode string, latency time.Duration) (resultJSON, bool) {
	for _, x := range j.Results {
		if x.Mode == mode && x.LatencyMS == latency.Milliseconds() {
			return x, true
		}
	}
	return resultJSON{}, false
}

// orDash formats v with format, or "–" when it is 0 (not measured).
func orDash(format string, v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

// previousMarkdown writes the previous run's table beside this run's
// figures: events/s, CPU µs/event and allocs/event, each previous → now.
// Runs on another day or machine differ for reasons of their own: the
// before/after table of -baseline is the comparison of one sitting.
func (r report) previousMarkdown(b *strings.Builder) {
	prev := r.previous
	if prev == nil {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n### Previous run\n\nThe previous `make bench` (%s, on %s; load average %s at its start), from the JSON it left, beside this run. "+
		"A dash is a figure that run did not measure.\n\n", prev.Consumer, prev.Date.Format("2006-01-02 15:04 MST"), prev.LoadAvg)
	p("| mode | provider latency | events/s, previous | events/s, this run | CPU µs/event, previous | CPU µs/event, this run | allocs/event, previous | allocs/event, this run |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.results {
		old, ok := prev.find(x.Mode, x.Latency)
		if !ok {
			continue
		}
		p("| %s | %s | %.0f | %.0f | %s | %.0f | %s | %.0f |\n", x.Mode, ms(x.Latency), old.EventsPerS, x.TP.Rate,
			orDash("%.0f", old.CPUPerEvent), x.Cost.CPUPerEvent(), orDash("%.0f", old.AllocsPerEvent), x.Cost.AllocsPerEvent())
	}
}
