package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// writeReadme replaces only the text between the markers, and refuses a
// file without them.
func TestWriteReadme(t *testing.T) {
	path := filepath.Join(t.TempDir(), "README.md")
	before := "# Title\n\nintro\n" + readmeBegin + "\nold figures\n" + readmeEnd + "\n\nafter\n"
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeReadme(path, "new figures\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if want := "# Title\n\nintro\n" + readmeBegin + "\nnew figures\n" + readmeEnd + "\n\nafter\n"; string(got) != want {
		t.Errorf("README after writeReadme:\n%s\nwant:\n%s", got, want)
	}
	if err := os.WriteFile(path, []byte("no markers\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeReadme(path, "x"); err == nil {
		t.Error("writeReadme accepted a file without markers")
	}
}

// The README's summary must show the figures of docs/benchmarks.md, the
// report of the same run: every events/s of its results table and every
// pgbench transactions/s.
func TestReadmeSummaryMatchesTheReport(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	report, err := os.ReadFile("../../docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i, j := strings.Index(s, readmeBegin), strings.Index(s, readmeEnd)
	if i < 0 || j < i {
		t.Fatal("README.md has no billing-bench section")
	}
	summary := s[i:j]
	rows := regexp.MustCompile(`(?m)^\| (sequential|default) \| (\d+ ms) \| \*\*(\d+)\*\* \|`).FindAllStringSubmatch(string(report), -1)
	if len(rows) == 0 {
		t.Fatal("docs/benchmarks.md has no results rows")
	}
	for _, r := range rows {
		rate := r[3]
		if r[1] == "default" {
			rate = "**" + rate + "**"
		}
		if want := "| " + r[1] + " | " + r[2] + " | " + rate; !strings.Contains(summary, want) {
			t.Errorf("README summary lacks %q from docs/benchmarks.md", want)
		}
	}
	for _, m := range regexp.MustCompile(`(?m)^\| (\d+) \| \d+ \| \*\*(\d+)\*\* \|`).FindAllStringSubmatch(string(report), -1) {
		if !strings.Contains(summary, m[2]+" tx/s") {
			t.Errorf("README summary lacks pgbench's %s tx/s with %s clients", m[2], m[1])
		}
	}
}
