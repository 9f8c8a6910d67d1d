package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// crashTarget is issue 14's bound of a crash's stall.
const crashTarget = 10 * time.Second

// secs formats a duration in seconds with one decimal.
func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// label names the binary of a recovery run.
func (r recovery) label() string {
	if r.Baseline {
		return "baseline"
	}
	return "under test"
}

// settings lists the group settings as VAR=value, in a fixed order.
func (r recovery) settings() string {
	var parts []string
	for _, name := range groupSettings {
		if v, ok := r.Settings[name]; ok {
			parts = append(parts, name+"="+v)
		}
	}
	return strings.Join(parts, ", ")
}

// crash is the stage of the SIGKILL, and whether there is one.
func (r recovery) crash() (stage, bool) {
	i := slices.IndexFunc(r.Stages, func(s stage) bool { return strings.HasPrefix(s.Name, "crash") })
	if i < 0 {
		return stage{}, false
	}
	return r.Stages[i], true
}

// rolling is the stage of the rolling restart, and whether there is one.
func (r recovery) rolling() (stage, bool) {
	i := slices.IndexFunc(r.Stages, func(s stage) bool { return strings.HasPrefix(s.Name, "rolling") })
	if i < 0 {
		return stage{}, false
	}
	return r.Stages[i], true
}

// printRecovery writes the recovery stages to the terminal.
func (r report) printRecovery(w io.Writer) {
	for _, rec := range r.recovery {
		fmt.Fprintf(w, "recovery (%s; %s), %.0f events/s offered, %d charges verified:\n", rec.label(), rec.settings(), rec.Rate, rec.Charges)
		for _, s := range rec.Stages {
			fmt.Fprintf(w, "  %-52s every partition advancing again after %7s, longest stall of a partition %7s\n",
				s.Name+":", secs(s.AllProgress), secs(s.LongestStall))
		}
		for _, p := range rec.problems {
			fmt.Fprintln(w, "  FAILED:", p)
		}
	}
}

// recoveryMarkdown writes the recovery section of docs/benchmarks.md.
func (r report) recoveryMarkdown(b *strings.Builder) {
	if len(r.recovery) == 0 {
		return
	}
	p := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	p("\n## Recovery from a crashed replica\n\n")
	p("Two replicas of the binary, with its own defaults, share one group on a fresh topic of %d partitions under a steady offered load "+
		"of %.0f events/s (one second's records at a time). After every partition has advanced, three disturbances follow, each watched until every "+
		"partition has advanced again and %v more: **crash**, SIGKILL of one replica; **a replacement joins**, a new replica started; "+
		"**rolling restart**, SIGTERM of the other original replica and a new one started at once. "+
		"The committed offsets are polled every %v as above. *Every partition advancing again* is the time from the disturbance until every "+
		"partition's committed offset had passed its value at the disturbance; *longest stall* is the longest time any one partition went "+
		"without an advance in the stage (at least the commit interval, since offsets are committed on a tick). After the last stage the load stops, "+
		"the group drains the topic, both replicas stop cleanly and the same exactly-once check as above runs on every record of the topic.\n\n",
		partitions, r.recovery[0].Rate, recoverySettle, r.opts.poll)
	p("| binary | group settings (the binary's defaults) | stage | every partition advancing again after | longest stall of a partition |\n|---|---|---|---:|---:|\n")
	for _, rec := range r.recovery {
		for _, s := range rec.Stages {
			p("| %s | %s | %s | **%s** | %s |\n", rec.label(), rec.settings(), s.Name, secs(s.AllProgress), secs(s.LongestStall))
		}
	}
	for _, rec := range r.recovery {
		if len(rec.problems) > 0 {
			p("\nProblems of the %s run: %s.\n", rec.label(), strings.Join(rec.problems, "; "))
		} else {
			p("\nThe %s run charged each committed order exactly once: %d orders checked.\n", rec.label(), rec.Charges)
		}
	}
}

// recoverySummary is the README's line on recovery.
func (r report) recoverySummary() string {
	for _, rec := range r.recovery {
		if rec.Baseline {
			continue
		}
		c, ok1 := rec.crash()
		rs, ok2 := rec.rolling()
		if !ok1 || !ok2 {
			return ""
		}
		return fmt.Sprintf("\nTwo replicas under load, with the binary's defaults (%s): after a SIGKILL of one, every partition was advancing again "+
			"after **%s**; a rolling restart (SIGTERM, new process) stalled a partition for at most **%s**.\n", rec.settings(), secs(c.AllProgress), secs(rs.LongestStall))
	}
	return ""
}

// recoveryTargets is the crash target of issue 14.
func (r report) recoveryTargets() []target {
	for _, rec := range r.recovery {
		if c, ok := rec.crash(); ok && !rec.Baseline {
			return []target{{fmt.Sprintf("crash of one of two replicas: every partition advancing again <= %v", crashTarget),
				secs(c.AllProgress), c.AllProgress <= crashTarget, false}}
		}
	}
	return nil
}
